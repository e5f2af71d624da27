"""Benchmark: rabit_py allreduce/broadcast against raw mpi4py, side by side.

    rabit-run -n 2 python scripts/bench_collectives.py [--json out.json] [--plot out.png]

In one job, on the same float32 buffers, for sizes 8 B ... 64 MiB, it times:

- raw mpi4py ``Allreduce`` in place and out of place (the faster is the
  reference: our in-place API must be compared with MPI's best), and ``Bcast``;
- ``rabit.allreduce`` and ``rabit.broadcast`` with the signature check off and
  on, on MPI's collectives (``shm=False``; the timeout watchdog is armed);
- ``rabit.allreduce`` through the node's shared memory (``shm=True`` at every
  size, check off), and a plain memory copy of the buffer (the machine's
  memory bandwidth ceiling, bytes / time);
- a custom reducer (``Op.create(np.add)``) on MPI and through shared memory;
- in the robust phase, raw mpi4py followed by a copy of each result into
  buffers reused from checkpoint to checkpoint: the floor of any engine that
  keeps results for replay;
- ``xgboost.collective.allreduce`` when xgboost is installed (what XGBoost
  users run today).

Contenders alternate batch by batch so that machine noise hits them alike. A
batch's time is that of the slowest rank; the table shows the median over
batches: latency per call, bus bandwidth (allreduce: 2(n-1)/n x bytes / time,
broadcast: bytes / time), and the bandwidth ratio to raw mpi4py, as the median
of per-batch ratios (each batch against the raw call timed just before it).
The JSON keeps every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import textwrap
import time
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np

# MPI as rabit_py starts it (a one-process run leaves no shared-memory segment).
from rabit_py.engine._mpistart import MPI

import rabit_py as rabit
from rabit_py.extras import require

SIZES = [8, 64, 512, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
TARGET_BATCH_SECONDS = 0.03

WORLD = MPI.COMM_WORLD
np.seterr(over="ignore", invalid="ignore")  # the buffers grow call after call: inf is fine here
ROBUST = os.environ.get("OMPI_MCA_mpi_ft_enable", "") not in ("", "0", "false")
RANK, NRANKS = WORLD.Get_rank(), WORLD.Get_size()


class RabitSession:
    """Keeps one rabit_py session open with the engine and check setting a
    contender needs (switching happens between batches, outside the timed
    region)."""

    def __init__(self) -> None:
        self.current: Optional[tuple] = None

    def use(self, engine: str, check: bool, shm: bool = False) -> None:
        if self.current != (engine, check, shm):
            rabit.finalize()
            rabit.init(engine=engine, check=check, shm=shm, shm_min_bytes=1)
            self.current = (engine, check, shm)

    def close(self) -> None:
        rabit.finalize()
        self.current = None


# The robust engine caches every result until the next checkpoint; a training
# loop checkpoints every round. The robust contenders take a lazy_checkpoint
# every CHECKPOINT_EVERY calls (its cost is included in their time).
CHECKPOINT_EVERY = 10


def xgboost_allreduce() -> Optional[Callable[[np.ndarray], object]]:
    """Start an xgboost collective communicator if xgboost is installed."""
    try:
        import xgboost  # noqa: F401
        from xgboost import collective
        from xgboost.tracker import RabitTracker
    except ImportError:
        return None
    tracker = None
    if RANK == 0:
        tracker = RabitTracker(host_ip="127.0.0.1", n_workers=NRANKS)
        tracker.start()
        args = tracker.worker_args()
    else:
        args = None
    args = WORLD.bcast(args, root=0)
    collective.init(**args)
    xgboost_allreduce.tracker = tracker  # type: ignore[attr-defined]

    def run(buf: np.ndarray) -> object:
        return collective.allreduce(buf, collective.Op.SUM)

    return run


def contenders(session: RabitSession) -> Dict[str, tuple]:
    """name -> (kind, setup, call). ``setup`` runs before each batch, untimed."""
    def raw_inplace(buf, out):
        WORLD.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def raw_outofplace(buf, out):
        WORLD.Allreduce(buf, out, op=MPI.SUM)

    def rabit_allreduce(buf, out):
        rabit.allreduce(buf, rabit.Op.SUM)

    def raw_bcast(buf, out):
        WORLD.Bcast(buf, root=0)

    def rabit_bcast(buf, out):
        rabit.broadcast(buf, 0)

    def copy(buf, out):
        np.copyto(out, buf)

    custom = rabit.Op.create(np.add)

    def rabit_custom(buf, out):
        rabit.allreduce(buf, custom)

    def nothing():
        pass

    table = {
        "mpi4py Allreduce in-place": ("allreduce", nothing, raw_inplace),
        "mpi4py Allreduce out-of-place": ("allreduce", nothing, raw_outofplace),
        "rabit allreduce check=off": ("allreduce", lambda: session.use("mpi", False),
                                      rabit_allreduce),
        "rabit allreduce check=on": ("allreduce", lambda: session.use("mpi", True),
                                     rabit_allreduce),
        SHM: ("allreduce", lambda: session.use("mpi", False, shm=True), rabit_allreduce),
        CUSTOM_MPI: ("allreduce", lambda: session.use("mpi", False), rabit_custom),
        CUSTOM_SHM: ("allreduce", lambda: session.use("mpi", False, shm=True), rabit_custom),
        COPY: ("copy", nothing, copy),
        "mpi4py Bcast": ("broadcast", nothing, raw_bcast),
        "rabit broadcast check=off": ("broadcast", lambda: session.use("mpi", False), rabit_bcast),
        "rabit broadcast check=on": ("broadcast", lambda: session.use("mpi", True), rabit_bcast),
    }
    return table


def _keep(buf: np.ndarray) -> None:
    """A prepare_fun that leaves the buffer as it is."""


SHM = "rabit allreduce shm"
CUSTOM_MPI = "rabit allreduce Op.create(np.add)"
CUSTOM_SHM = "rabit allreduce Op.create(np.add) shm"
COPY = "memory copy (ceiling)"
ROBUST_RAW = "mpi4py Allreduce in-place (robust phase)"
ROBUST_BCAST_RAW = "mpi4py Bcast (robust phase)"
KEEP_FLOOR = "cache floor raw+keep"


def robust_table() -> Dict[str, tuple]:
    """The robust phase: one robust session for all its batches (its cache and
    buffer pool warm up as in a training loop), beside raw mpi4py timed again.
    A lazy_checkpoint every CHECKPOINT_EVERY calls bounds the cache, as a
    training loop's per-round checkpoint does; its cost is included."""
    calls = [0]

    def with_checkpoints(call):
        def run(buf, out):
            call(buf, out)
            calls[0] += 1
            if calls[0] % CHECKPOINT_EVERY == 0:
                rabit.lazy_checkpoint(None)
        return run

    def nothing():
        pass

    kept: Dict[int, List[np.ndarray]] = {}
    keeps = [0]

    def raw_and_keep(buf, out):
        # The floor of any engine that keeps each result until the checkpoint:
        # raw MPI, then a copy into one of CHECKPOINT_EVERY buffers, reused
        # version after version like the engine's pooled cache.
        WORLD.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        ring = kept.setdefault(buf.nbytes, [np.empty_like(buf) for _ in range(CHECKPOINT_EVERY)])
        np.copyto(ring[keeps[0] % CHECKPOINT_EVERY], buf)
        keeps[0] += 1

    return {
        ROBUST_RAW: ("allreduce", nothing,
                     lambda buf, out: WORLD.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)),
        KEEP_FLOOR: ("allreduce", nothing, raw_and_keep),
        "rabit robust allreduce": ("allreduce", nothing, with_checkpoints(
            lambda buf, out: rabit.allreduce(buf, rabit.Op.SUM))),
        # with prepare_fun the input need not be kept: one copy per call, not two
        "rabit robust allreduce+prepare_fun": ("allreduce", nothing, with_checkpoints(
            lambda buf, out: rabit.allreduce(buf, rabit.Op.SUM, prepare_fun=_keep))),
        ROBUST_BCAST_RAW: ("broadcast", nothing, lambda buf, out: WORLD.Bcast(buf, root=0)),
        "rabit robust broadcast": ("broadcast", nothing, with_checkpoints(
            lambda buf, out: rabit.broadcast(buf, 0))),
    }


XGB_RAW = "mpi4py Allreduce in-place (xgboost phase)"
XGB = "xgboost.collective allreduce"
# contenders measured in a phase of their own, against raw mpi4py of that phase
PAIRED_RAW = {XGB: XGB_RAW,
              "rabit robust allreduce": "mpi4py Allreduce in-place (robust phase)",
              KEEP_FLOOR: "mpi4py Allreduce in-place (robust phase)",
              "rabit robust allreduce+prepare_fun": "mpi4py Allreduce in-place (robust phase)",
              "rabit robust broadcast": "mpi4py Bcast (robust phase)"}


def xgboost_table(xgb: Callable) -> Dict[str, tuple]:
    """The peer phase: xgboost's tracker and threads stay out of the main
    comparison, and raw mpi4py is timed again beside xgboost."""
    def nothing():
        pass

    return {XGB_RAW: ("allreduce", nothing,
                      lambda buf, out: WORLD.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)),
            XGB: ("allreduce", nothing, lambda buf, out: xgb(buf))}


def time_batch(call: Callable, buf: np.ndarray, out: np.ndarray, iterations: int) -> float:
    """Seconds per call on the slowest rank, for one batch."""
    WORLD.Barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        call(buf, out)
    elapsed = (time.perf_counter() - start) / iterations
    return WORLD.allreduce(elapsed, op=MPI.MAX)


def measure(nbytes: int, table: Dict[str, tuple], batches: int) -> Dict[str, List[float]]:
    """Seconds per call of each contender, one sample per batch (batch i of
    every contender ran back to back, so samples pair up by index)."""
    count = max(1, nbytes // 4)
    buf = np.ones(count, dtype=np.float32)
    out = np.empty_like(buf)
    # Calibrate on raw MPI so that every contender runs the same iterations.
    probe = time_batch(next(iter(table.values()))[2], buf, out, 3)
    iterations = int(max(2, min(2000, TARGET_BATCH_SECONDS / max(probe, 1e-7))))
    iterations = WORLD.bcast(iterations, root=0)
    samples: Dict[str, List[float]] = {name: [] for name in table}
    for _ in range(batches):
        for name, (_, setup, call) in table.items():
            setup()
            buf.fill(1.0)
            call(buf, out)                   # warm-up, untimed
            samples[name].append(time_batch(call, buf, out, iterations))
    return samples


def median(samples: List[float]) -> float:
    return float(np.median(samples))


def paired_ratio(raw: List[List[float]], ours: List[float]) -> float:
    """Median over batches of (best raw time / our time) within the batch:
    pairing cancels the machine's slow drifts, which a ratio of medians keeps."""
    best_raw = np.min(np.array(raw), axis=0)
    return float(np.median(best_raw / np.array(ours)))


def progress(items: list, what: str) -> Iterator:
    for i, item in enumerate(items):
        if RANK == 0:
            print(f"  {what}: {i + 1}/{len(items)}", file=sys.stderr, flush=True)
        yield item


def bus_bandwidth(kind: str, nbytes: int, seconds: float) -> float:
    factor = 2 * (NRANKS - 1) / NRANKS if kind == "allreduce" else 1.0
    return factor * nbytes / seconds / 1e9


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# Short column names (the tables stay under 100 characters); the legend
# under each table gives the full names.
SHORT = {
    "rabit allreduce check=off": "off", "rabit allreduce check=on": "on", SHM: "shm",
    CUSTOM_MPI: "custom", CUSTOM_SHM: "cust shm", KEEP_FLOOR: "keep flr",
    "rabit robust allreduce": "robust", "rabit robust allreduce+prepare_fun": "rob+prep",
    XGB: "xgboost", "rabit broadcast check=off": "off", "rabit broadcast check=on": "on",
    "rabit robust broadcast": "robust",
}


def report(rows: List[dict], names: List[str]) -> str:
    """Per kind, two narrow tables: microseconds per call, and the bandwidth
    ratio to raw mpi4py (x raw, >1 is faster), one column per contender."""
    lines = []
    for kind, raw_names, ours in (
            ("allreduce", ["mpi4py Allreduce in-place", "mpi4py Allreduce out-of-place"],
             ["rabit allreduce check=off", "rabit allreduce check=on", SHM, CUSTOM_MPI,
              CUSTOM_SHM, KEEP_FLOOR, "rabit robust allreduce",
              "rabit robust allreduce+prepare_fun", XGB]),
            ("broadcast", ["mpi4py Bcast"],
             ["rabit broadcast check=off", "rabit broadcast check=on",
              "rabit robust broadcast"])):
        ours = [n for n in ours if n in names]
        what = "allreduce float32 SUM" if kind == "allreduce" else "broadcast float32"
        medians = [{n: median(v) for n, v in row["seconds"].items()} for row in rows]
        raws = [min(t[n] for n in raw_names) for t in medians]
        head = f"{'size':>8} {'raw':>9} " + " ".join(f"{SHORT[n]:>8}" for n in ours)
        lines += [f"\n{what}, {NRANKS} ranks, us per call (median, slowest rank; raw: the "
                  f"faster raw call)", head, "-" * len(head)]
        for row, t, raw in zip(rows, medians, raws):
            lines.append(f"{human(row['bytes']):>8} {raw * 1e6:9.1f} "
                         + " ".join(f"{t[n] * 1e6:8.1f}" for n in ours))
        head = (f"{'size':>8} {'raw GB/s':>9} " + " ".join(f"{SHORT[n]:>8}" for n in ours)
                + f" {'check us':>8}")
        lines += [f"\n{what}, bandwidth x raw (>1 is faster); check us: the signature "
                  f"check's cost", head, "-" * len(head)]
        for row, t, raw in zip(rows, medians, raws):
            samples = row["seconds"]
            cells = []
            for n in ours:
                paired = ([samples[PAIRED_RAW[n]]] if n in PAIRED_RAW
                          else [samples[r] for r in raw_names])
                cells.append(f"{paired_ratio(paired, samples[n]):8.2f}")
            cost = (t[f"rabit {kind} check=on"] - t[f"rabit {kind} check=off"]) * 1e6
            # A difference of two noisy medians can come out below zero: the
            # check then costs less than the noise can show.
            shown = f"{cost:8.1f}" if cost > 0 else f"{'<noise':>8}"
            lines.append(f"{human(row['bytes']):>8} {bus_bandwidth(kind, row['bytes'], raw):9.2f} "
                         + " ".join(cells) + f" {shown}")
        lines.append(textwrap.fill("; ".join(f"{SHORT[n]} = {n}" for n in ours), 100,
                                   initial_indent="  ", subsequent_indent="  "))
    if COPY in names:
        cells = ", ".join(f"{human(row['bytes'])} "
                          f"{bus_bandwidth('copy', row['bytes'], median(row['seconds'][COPY])):.1f}"
                          for row in rows)
        lines.append("\n" + textwrap.fill(f"{COPY}, GB/s (bytes / time, one rank's buffer): "
                                          f"{cells}", 100))
    phase_raws = sorted({raw for n, raw in PAIRED_RAW.items() if n in names})
    for raw in phase_raws:
        cells = ", ".join(f"{human(row['bytes'])} {median(row['seconds'][raw]) * 1e6:.1f}"
                          for row in rows)
        lines.append("\n" + textwrap.fill(f"{raw}, us: {cells}", 100))
    return "\n".join(lines)


def plot(rows: List[dict], names: List[str], kinds: Dict[str, str], path: str) -> None:
    """Bandwidth against size: raw mpi4py in black (solid, dashed for its
    other calls), the memory copy in grey, every other contender a colour of
    its own (tab20: the default cycle has 10 colours for up to 14 lines)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [n for n in names if not n.startswith("mpi4py") and n != COPY]
    colours = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(others)}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, kind in zip(axes, ("allreduce", "broadcast")):
        raws = 0
        for name in names:
            if kinds[name] != kind and not (kind == "allreduce" and kinds[name] == "copy"):
                continue
            xs = [r["bytes"] for r in rows]
            ys = [bus_bandwidth(kinds[name], r["bytes"], median(r["seconds"][name]))
                  for r in rows]
            if name.startswith("mpi4py"):
                style = dict(color="black", linewidth=2.2,
                             linestyle=("-", "--", ":", "-.")[raws % 4])
                raws += 1
            elif name == COPY:
                style = dict(color="grey", linestyle=":", linewidth=1.5)
            else:
                style = dict(color=colours[name], linewidth=1.3)
            ax.plot(xs, ys, marker="o", markersize=3, label=name, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{kind}, float32, {NRANKS} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="bench-results/collectives.json",
                        help="where to write the figures (default: %(default)s)")
    parser.add_argument("--plot", nargs="?", const="bench-results/collectives.png",
                        help="draw bandwidth vs size to this PNG")
    parser.add_argument("--batches", type=int, default=15, help="batches per size")
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--no-xgboost", action="store_true")
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    if NRANKS < 2:
        # One process has no collective to time (and its JSON would replace
        # the last real run's figures).
        raise SystemExit("bench_collectives times collectives across ranks: run it on 2 or "
                         "more, e.g. rabit-run -n 2 python scripts/bench_collectives.py")

    session = RabitSession()
    rabit.init(engine="mpi", shm=False)
    session.current = ("mpi", True, False)
    table = contenders(session)
    sizes = [s for s in SIZES if args.min_bytes <= s <= args.max_bytes]
    rows = [{"bytes": nbytes, "seconds": measure(nbytes, table, args.batches)}
            for nbytes in progress(sizes, "rabit_py vs mpi4py")]
    session.close()
    if ROBUST:
        rabit.init(engine="robust", check=False)
        rabit.load_checkpoint()       # start numbering after the bootstrap calls
        peer = robust_table()
        table.update(peer)
        for row in progress(rows, "robust engine vs mpi4py"):
            row["seconds"].update(measure(row["bytes"], peer, args.batches))
        rabit.finalize()
    xgb = None if args.no_xgboost else xgboost_allreduce()
    if xgb is not None:
        peer = xgboost_table(xgb)
        table.update(peer)
        for row in progress(rows, "xgboost vs mpi4py"):
            row["seconds"].update(measure(row["bytes"], peer, args.batches))
        from xgboost import collective
        collective.finalize()

    if RANK == 0:
        names = list(table)
        print(report(rows, names))
        print("\n" + textwrap.fill(
            f"{NRANKS} ranks on {os.cpu_count()} cores"
            + (" (oversubscribed)" if NRANKS > (os.cpu_count() or 1) else "")
            + "; x raw = median per-batch bandwidth ratio to the faster raw mpi4py call "
              "(>1 is faster); the robust engine (check off, a lazy_checkpoint every "
            f"{CHECKPOINT_EVERY} calls) and xgboost are compared with raw mpi4py timed "
              "in their own phases", 100))
        result = {
            "benchmark": "collectives", "ranks": NRANKS, "cores": os.cpu_count(),
            "mpi": MPI.Get_library_version().strip(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "batches": args.batches,
            "contenders": {n: table[n][0] for n in names}, "rows": rows,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"wrote {args.json}")
        if args.plot:
            plot(rows, names, {n: table[n][0] for n in names}, args.plot)
            print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
