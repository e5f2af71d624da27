"""Draw the recovery protocol as a sequence chart (docs/_static/recovery.svg):
rank 1 dies during allreduce #5 of version 2; the survivors repair the
communicator; a replacement takes rank 1, gets the checkpoint and replays
calls #0-#4 from the survivors' cache; then every rank runs #5 together.

    python scripts/recovery_diagram.py [--out docs/_static/recovery.svg]

Needs matplotlib (pip install -e ".[bench]"). The SVG is checked in, so the
docs build without matplotlib."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rabit_py.extras import require  # noqa: E402

LANES = ["rank 0", "rank 1", "rank 2", "replacement\n(rank 1)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default="docs/_static/recovery.svg", help="SVG to write")
    args = parser.parse_args()
    require("matplotlib", "bench", "the diagram")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "rabit_py"        # the same file every run
    fig, ax = plt.subplots(figsize=(9, 6.4))
    x = {name: i * 2.4 for i, name in enumerate(LANES)}
    top, bottom = 11.0, 0.2
    for name, pos in x.items():
        spawned = name.startswith("replacement")
        end = 8.6 if name == "rank 1" else bottom
        if spawned:
            ax.plot([pos, pos], [6.9, top], color="0.8", lw=1, ls=":", zorder=0)
        ax.plot([pos, pos], [end, 6.9 if spawned else top], color="0.6", lw=1, zorder=0)
        ax.text(pos, top + 0.35, name, ha="center", va="bottom", fontsize=10, weight="bold")
    ax.plot(x["rank 1"], 8.6, marker="X", color="crimson", ms=14)
    ax.text(x["rank 1"] + 0.2, 8.85, "SIGKILL", color="crimson", fontsize=8, va="bottom")
    text_x = max(x.values()) + 0.9

    def band(y: float, text: str, lanes: list, color: str) -> None:
        for name in lanes:
            ax.add_patch(plt.Rectangle((x[name] - 0.55, y - 0.28), 1.1, 0.56, color=color,
                                       alpha=0.45, lw=0))
        ax.text(text_x, y, text, va="center", fontsize=8.5)

    survivors = ["rank 0", "rank 2"]
    everyone = ["rank 0", "rank 2", "replacement\n(rank 1)"]
    band(10.3, "allreduce #0 ... #4 of version 2: results kept in every rank's cache",
         ["rank 0", "rank 1", "rank 2"], "tab:green")
    band(9.3, "allreduce #5 starts", ["rank 0", "rank 1", "rank 2"], "tab:green")
    band(8.2, "MPI reports a lost peer: PeerFailure, caught in one place", survivors,
         "tab:red")
    band(7.4, "revoke, shrink, find the dead (rank 1)", survivors, "tab:orange")
    band(6.6, "spawn a replacement (or take a spare), merge, split: it is rank 1",
         ["rank 0", "rank 2", "replacement\n(rank 1)"], "tab:orange")
    band(5.6, "round: summary allreduce (versions, smallest key asked)", everyone,
         "tab:blue")
    band(4.8, "checkpoint served: version 2 (global model from a survivor, local model"
              "\nfrom its ring neighbour)", everyone, "tab:blue")
    band(3.6, "rounds #0 ... #4: a holder broadcasts each cached result; the replacement"
              "\nreturns it without running prepare_fun, the survivors wait at #5",
         everyone, "tab:blue")
    band(2.4, "round at #5: every rank stands there: run it together, leave recovery",
         everyone, "tab:green")
    band(1.4, "the job goes on: same world size, bitwise the same results", everyone,
         "tab:green")
    ax.set_xlim(-0.8, 21.5)
    ax.set_ylim(0, 12.0)
    ax.axis("off")
    ax.set_title("In-job recovery of one lost rank (Note [robust protocol])", fontsize=11,
                 pad=22)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, metadata={"Date": None} if args.out.endswith(".svg") else None)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
