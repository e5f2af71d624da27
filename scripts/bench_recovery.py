"""Benchmark: what a failure costs the robust engine, and what checkpoints cost.

    python scripts/bench_recovery.py [--ranks 4] [--json out.json] [--plot out.png]

It starts the same training job (``--worker`` mode, a BSP loop of allreduce
and checkpoint) under ``rabit-run``, once without and ``--runs`` times with a
rank killed by the mock engine, and reports:

- recovery broken down on the survivors: detection (kill to exception),
  shrink, spawn, merge/split, replay (repaired to back in step), and the time
  the failure added to the job (whole job, and the training loop alone);
- checkpoint cost against model size (a global and a local model of that size)
  on the robust and the plain engine, side by side in the failure-free job;
- the memory held by the result cache at the end of a round.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

import numpy as np

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


# ---------------------------------------------------------------- worker side
def worker(args: argparse.Namespace) -> int:
    import rabit_py as rabit

    rabit.init()
    engine = rabit.api._engine
    rank = rabit.get_rank()
    start = time.time()
    version, model = rabit.load_checkpoint()
    if version == 0:
        model = np.zeros(args.elements)
    grad = np.empty(args.elements)
    for it in range(version, args.rounds):
        def prepare(buf: np.ndarray, it: int = it) -> None:
            buf[:] = np.sin(np.arange(buf.size) * (rank + 1) + it)

        rabit.allreduce(grad, rabit.Op.SUM, prepare_fun=prepare)
        for _ in range(3):
            rabit.allreduce(np.array([float(it)]), rabit.Op.MAX)
        model = model + 1e-3 * grad
        cache_bytes = engine._cache.nbytes
        rabit.checkpoint(model)
    elapsed = time.time() - start
    report = {"rank": rank, "elapsed": elapsed, "cache_bytes_per_round": cache_bytes,
              "recoveries": engine.recovery_log,
              "repair": vars(engine.repair_times), "trial": engine._trial}
    if args.checkpoint_sizes:     # collective: every rank measures
        report["checkpoint"] = checkpoint_costs(rabit, args)
    print("REPORT " + json.dumps(report), flush=True)
    rabit.finalize()
    return 0


def checkpoint_costs(rabit, args: argparse.Namespace) -> Dict[str, Dict[str, float]]:
    """Seconds per checkpoint(global, local) by size, on this engine and the plain one."""
    costs: Dict[str, Dict[str, float]] = {}
    for name in ("robust", "mpi"):
        if name == "mpi":
            rabit.finalize()
            rabit.init(engine="mpi")
        costs[name] = {}
        for nbytes in SIZES:
            glob = np.ones(nbytes // 8)
            local = np.ones(nbytes // 8)
            reps = 5 if nbytes < (16 << 20) else 2
            rabit.checkpoint(glob, local)                    # warm-up
            t0 = time.perf_counter()
            for _ in range(reps):
                rabit.checkpoint(glob, local)
            costs[name][str(nbytes)] = (time.perf_counter() - t0) / reps
        if name == "mpi":
            rabit.finalize()
            rabit.init(engine="robust")
    return costs


# ---------------------------------------------------------------- driver side
def launch(ranks: int, env: Dict[str, str], extra: List[str]) -> tuple:
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(ranks), "--",
           sys.executable, os.path.abspath(__file__), "--worker"] + extra
    start = time.time()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=900, env={**os.environ, **env}).stdout
    wall = time.time() - start
    reports = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("REPORT ")]
    if len(reports) != ranks:
        raise SystemExit(f"the job did not finish on every rank:\n{out[-4000:]}")
    return wall, reports, out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-sizes", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--elements", type=int, default=1 << 16, help="gradient length")
    parser.add_argument("--runs", type=int, default=3, help="runs with a failure")
    parser.add_argument("--json", default="bench-results/recovery.json")
    parser.add_argument("--plot", nargs="?", const="bench-results/recovery.png")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    common = ["--rounds", str(args.rounds), "--elements", str(args.elements)]
    base_wall, base, _ = launch(args.ranks, {"RABIT_ENGINE": "robust"}, common)
    _, sized, _ = launch(args.ranks, {"RABIT_ENGINE": "robust"},
                         ["--rounds", "1", "--checkpoint-sizes"])
    runs = []
    for i in range(args.runs):
        victim = 1 + i % (args.ranks - 1)
        plan = f"{victim},{args.rounds // 2},1,0"
        wall, reports, out = launch(args.ranks, {"RABIT_ENGINE": "mock", "RABIT_MOCK": plan},
                                    common)
        killed_at = float(re.search(r"killed at .*\(time ([\d.]+)\)", out).group(1))
        survivors = [r for r in reports if r["trial"] == 0 and r["recoveries"]]
        rec = [r["recoveries"][0] for r in survivors]
        steps = {
            "detect": max(r["detected"] for r in rec) - killed_at,
            "shrink": max(r["repair"]["shrink"] for r in survivors),
            "spawn": max(r["repair"]["spawn"] for r in survivors),
            "merge": max(r["repair"]["merge"] for r in survivors),
            "replay": max(r["resumed"] - r["repaired"] for r in rec),
            "added_wall": wall - base_wall,
            "added_loop": (max(r["elapsed"] for r in survivors)
                           - max(r["elapsed"] for r in base)),
        }
        runs.append({"plan": plan, "wall": wall, "steps": steps})

    median = {k: statistics.median(r["steps"][k] for r in runs) for k in runs[0]["steps"]}
    print(f"\nrecovery of one killed rank, {args.ranks} ranks on {os.cpu_count()} cores"
          + (" (oversubscribed)" if args.ranks > (os.cpu_count() or 1) else "")
          + f", median of {len(runs)} runs (seconds)")
    print("  ".join(f"{k:>10}" for k in median))
    print("  ".join(f"{v:10.3f}" for v in median.values()))
    print(f"failure-free job: {base_wall:.2f} s wall; with one failure: "
          f"{statistics.median(r['wall'] for r in runs):.2f} s")
    cache = max(r["cache_bytes_per_round"] for r in base)
    print(f"result cache at the end of a round: {cache} bytes per rank "
          f"(one allreduce of a {args.elements}-element float64 gradient + 3 of a scalar)")
    costs = sized[0]["checkpoint"]
    print("\ncheckpoint(global, local) cost, ms (each model of the given size)")
    print(f"{'size':>10} {'robust':>10} {'plain':>10}")
    for size in SIZES:
        print(f"{size:>10} {costs['robust'][str(size)] * 1e3:10.2f} "
              f"{costs['mpi'][str(size)] * 1e3:10.2f}")
    result = {"benchmark": "recovery", "ranks": args.ranks, "cores": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "base_wall": base_wall,
              "runs": runs, "median": median, "cache_bytes_per_round": cache,
              "checkpoint_seconds": costs}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.json}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        left.bar(list(median)[:-1], [median[k] for k in list(median)[:-1]])
        left.set_ylabel("seconds")
        left.set_title(f"recovery steps ({args.ranks} ranks)")
        for name in ("robust", "mpi"):
            right.plot(SIZES, [costs[name][str(s)] for s in SIZES], marker="o", label=name)
        right.set_xscale("log", base=2)
        right.set_yscale("log")
        right.set_xlabel("model size (bytes, global and local each)")
        right.set_ylabel("seconds per checkpoint")
        right.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
