"""Benchmark: the per-call cost of a small allreduce, this tree against another
revision, side by side in one run.

    python scripts/bench_hotpath.py --before HEAD~5 [--json out.json] [--plot out.png]

For each engine and signature-check setting (plain/robust, check off/on) it
starts ``rabit-run -n 2`` jobs that time 20,000 allreduces of 8 bytes (a
``lazy_checkpoint`` every 10 calls, as a training loop checkpoints every
round; best of 5 repetitions) and raw mpi4py ``Allreduce`` in place in the
same job. The two source trees alternate run by run (``--runs`` each), so
that the machine's noise hits both alike; the table shows each one's best
run. ``--before`` checks the revision out in a temporary git worktree.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List

from rabit_py.extras import require

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [("mpi", "off"), ("mpi", "on"), ("robust", "off"), ("robust", "on")]

PROGRAM = r'''
import sys, time
import numpy as np
from mpi4py import MPI
import rabit_py as rabit
engine, check = sys.argv[1], sys.argv[2] == "on"
rabit.init(engine=engine, check=check)
rabit.load_checkpoint()
buf = np.ones(2, np.float32)
def loop(n):
    for i in range(n):
        rabit.allreduce(buf, rabit.Op.SUM)
        if i % 10 == 9:
            rabit.lazy_checkpoint(None)
def raw(n):
    for _ in range(n):
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
for fn in (loop, raw):
    fn(2000)
    times = []
    for _ in range(5):
        t = time.perf_counter(); fn(20000); times.append((time.perf_counter() - t) / 20000)
    if rabit.get_rank() == 0:
        print(f"{fn.__name__.upper()} {min(times) * 1e6:.3f}", flush=True)
rabit.finalize()
'''


def measure(tree: str, engine: str, check: str, program: str) -> Dict[str, float]:
    """(us per rabit call, us per raw call) of one job on ``tree``."""
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-m", "rabit_py.launcher", "-n", "2", "--",
                          sys.executable, program, engine, check],
                         env=env, cwd=tree, capture_output=True, text=True, timeout=600)
    found = dict(re.findall(r"^(LOOP|RAW) ([\d.]+)$", out.stdout, re.M))
    if len(found) != 2:
        raise SystemExit(f"the job on {tree} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return {"rabit": float(found["LOOP"]), "raw": float(found["RAW"])}


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--runs", type=int, default=3, help="jobs per tree and setting")
    parser.add_argument("--json", default="bench-results/hotpath.json")
    parser.add_argument("--plot", nargs="?", const="bench-results/hotpath.png",
                        help="draw the table as bars to this PNG")
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")
    results: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        before = os.path.join(scratch, "before")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", before,
                        args.before], check=True)
        program = os.path.join(scratch, "hotpath.py")
        with open(program, "w") as f:
            f.write(PROGRAM)
        try:
            trees = {"before": before, "after": ROOT}
            for engine, check in CONFIGS:
                key = f"{engine} check={check}"
                results[key] = {"before": [], "after": []}
                for run in range(args.runs):
                    for name, tree in trees.items():
                        results[key][name].append(measure(tree, engine, check, program))
                        print(f"  {key}, {name}, run {run + 1}/{args.runs}", flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before])
    print(f"\n8-byte allreduce, us per call, 2 ranks (best of {args.runs} jobs each, "
          f"trees alternating); before = {args.before}")
    print(f"{'':>20}{'raw':>8}{'before':>9}{'after':>9}{'after/before':>14}"
          f"{'after - raw':>13}")
    table = {}
    for key, runs in results.items():
        b = min(r["rabit"] for r in runs["before"])
        a = min(r["rabit"] for r in runs["after"])
        raw = min(r["raw"] for name in runs for r in runs[name])
        table[key] = {"raw": raw, "before": b, "after": a}
        print(f"{key:>20}{raw:8.1f}{b:9.1f}{a:9.1f}{a / b:14.2f}{a - raw:13.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "hotpath", "before": args.before, "table": table,
                   "runs": results}, f, indent=1)
    print(f"wrote {args.json}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        keys = list(table)
        x = range(len(keys))
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.bar([i - 0.2 for i in x], [table[k]["before"] for k in keys], 0.4, label="before")
        ax.bar([i + 0.2 for i in x], [table[k]["after"] for k in keys], 0.4, label="after")
        ax.set_xticks(list(x), keys)
        ax.set_ylabel("us per 8-byte allreduce")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
