"""Benchmark: the per-call cost of a small allreduce, this tree against another
revision, side by side in one run.

    python scripts/bench_hotpath.py --before HEAD~5 [--json out.json] [--plot out.png]

For each engine and signature-check setting (plain/robust, check off/on) it
starts ``rabit-run -n 2`` jobs that time 20,000 calls (``--calls``) of each small
collective -- an allreduce and a broadcast of 8 bytes, an allgather of one
float64 per rank -- (a ``lazy_checkpoint`` every 10 calls, as a training loop
checkpoints every round; best of 5 repetitions) and raw mpi4py's
``Allreduce`` in place, ``Bcast`` and ``Allgather`` in the same job. The two source trees alternate run by run (``--runs`` each), so
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
engine, check, calls = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3])
rabit.init(engine=engine, check=check)
rabit.load_checkpoint()
comm = MPI.COMM_WORLD
buf = np.ones(2, np.float32)
one = np.ones(1, np.float64)
gathered = np.empty(comm.Get_size(), np.float64)
def allreduce(n):
    for i in range(n):
        rabit.allreduce(buf, rabit.Op.SUM)
        if i % 10 == 9:
            rabit.lazy_checkpoint(None)
def raw_allreduce(n):
    for _ in range(n):
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
def broadcast(n):
    for i in range(n):
        rabit.broadcast(buf, 0)
        if i % 10 == 9:
            rabit.lazy_checkpoint(None)
def raw_broadcast(n):
    for _ in range(n):
        comm.Bcast(buf, root=0)
def allgather(n):
    for i in range(n):
        rabit.allgather(one)
        if i % 10 == 9:
            rabit.lazy_checkpoint(None)
def raw_allgather(n):
    for _ in range(n):
        comm.Allgather(one, gathered)
for fn in (allreduce, raw_allreduce, broadcast, raw_broadcast, allgather, raw_allgather):
    fn(calls // 10)
    times = []
    for _ in range(5):
        t = time.perf_counter(); fn(calls); times.append((time.perf_counter() - t) / calls)
    if rabit.get_rank() == 0:
        print(f"{fn.__name__.upper()} {min(times) * 1e6:.3f}", flush=True)
rabit.finalize()
'''


CALLS = ("allreduce", "broadcast", "allgather")


def measure(tree: str, engine: str, check: str, program: str,
            calls: int = 20000) -> Dict[str, Dict[str, float]]:
    """Per call: (us per rabit call, us per raw call) of one job on ``tree``."""
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-m", "rabit_py.launcher", "-n", "2", "--",
                          sys.executable, program, engine, check, str(calls)],
                         env=env, cwd=tree, capture_output=True, text=True, timeout=600)
    found = dict(re.findall(r"^((?:RAW_)?[A-Z]+) ([\d.]+)$", out.stdout, re.M))
    if len(found) != 2 * len(CALLS):
        raise SystemExit(f"the job on {tree} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return {call: {"rabit": float(found[call.upper()]), "raw": float(found[f"RAW_{call.upper()}"])}
            for call in CALLS}


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--runs", type=int, default=3, help="jobs per tree and setting")
    parser.add_argument("--calls", type=int, default=20000,
                        help="calls timed per repetition (fewer: a quicker, noisier run)")
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
                setting = f"{engine} check={check}"
                for call in CALLS:
                    results[f"{call}, {setting}"] = {"before": [], "after": []}
                for run in range(args.runs):
                    for name, tree in trees.items():
                        measured = measure(tree, engine, check, program, args.calls)
                        for call, times in measured.items():
                            results[f"{call}, {setting}"][name].append(times)
                        print(f"  {setting}, {name}, run {run + 1}/{args.runs}", flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before])
    print(f"\nsmall calls (8-byte allreduce and broadcast, allgather of one float64 per "
          f"rank), us per call, 2 ranks (best of {args.runs} jobs each, trees alternating); "
          f"before = {args.before}")
    print(f"{'':>31}{'raw':>8}{'before':>9}{'after':>9}{'after/before':>14}"
          f"{'after - raw':>13}")
    table = {}
    for key, runs in results.items():
        b = min(r["rabit"] for r in runs["before"])
        a = min(r["rabit"] for r in runs["after"])
        raw = min(r["raw"] for name in runs for r in runs[name])
        table[key] = {"raw": raw, "before": b, "after": a}
        print(f"{key:>31}{raw:8.1f}{b:9.1f}{a:9.1f}{a / b:14.2f}{a - raw:13.1f}")
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
        fig, ax = plt.subplots(figsize=(12, 4.5))
        ax.bar([i - 0.2 for i in x], [table[k]["before"] for k in keys], 0.4, label="before")
        ax.bar([i + 0.2 for i in x], [table[k]["after"] for k in keys], 0.4, label="after")
        ax.set_xticks(list(x), keys, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("us per call")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
