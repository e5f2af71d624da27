"""Benchmark: a loop of allreduces that never checkpoints, robust engine vs raw MPI.

    python scripts/bench_no_checkpoint.py [--ranks 2] [--calls 400] [--mib 4]
                                          [--budget BYTES] [--json out.json] [--plot out.png]

Existing code often reduces in a loop and never calls ``checkpoint``. Under
rabit-run the robust engine keeps results for replay until the start-up
calls' part of the cache budget (1/8; Note [cache budget] in
``rabit_py/engine/recovery/_cache.py``); past it every rank reduces as on
plain MPI, so a call costs what the call itself costs. This script runs, side by side in one job, the
same in-place float32 SUM allreduce ``--calls`` times on raw mpi4py and on the
robust engine, and reports the median and mean time per call, the ratio, the
time per call over the loop (first and last tenth), the bytes the cache holds
at the end, and each rank's peak resident memory. ``--budget`` sets
``RABIT_CACHE_BUDGET`` (default: the engine's own default).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from rabit_py.extras import require

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> int:
    import numpy as np
    from mpi4py import MPI

    import rabit_py as rabit

    rabit.init(engine="robust")
    comm = MPI.COMM_WORLD
    n = args.mib * (1 << 20) // 4
    data = np.random.default_rng(rabit.get_rank()).random(n, dtype=np.float32)
    buf = data.copy()
    raw: List[float] = []
    robust: List[float] = []
    for _ in range(args.calls):
        # Interleaved, so that both see the same machine.
        np.copyto(buf, data)
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        raw.append(time.perf_counter() - t0)
        np.copyto(buf, data)
        comm.Barrier()
        t0 = time.perf_counter()
        rabit.allreduce(buf, rabit.Op.SUM)
        robust.append(time.perf_counter() - t0)
    info = rabit.engine_info()
    if rabit.get_rank() == 0:
        print("RESULT " + json.dumps({
            "raw": raw, "robust": robust, "cache_bytes": info.cache_bytes,
            "budget": info.cache_budget, "refused": info.cache_refused,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}),
            flush=True)
    rabit.finalize()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--budget", type=int, default=None)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RABIT_CHECK": "1"}
    if args.budget is not None:
        env["RABIT_CACHE_BUDGET"] = str(args.budget)
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(args.ranks), "--",
           sys.executable, os.path.abspath(__file__), "--worker", "--calls", str(args.calls),
           "--mib", str(args.mib)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
        return 1
    r = json.loads(lines[0][7:])
    raw, robust = r["raw"], r["robust"]
    tenth = max(1, len(raw) // 10)
    rows = [("raw mpi4py", raw), ("robust engine", robust)]
    print(f"{args.calls} x {args.mib} MiB float32 SUM allreduce, {args.ranks} ranks, "
          f"{os.cpu_count()} cores (ranks oversubscribed if more than cores)")
    print("| | median ms | mean ms | first tenth ms | last tenth ms |")
    print("|---|---|---|---|---|")
    for name, times in rows:
        print(f"| {name} | {statistics.median(times) * 1e3:.3f} | "
              f"{statistics.mean(times) * 1e3:.3f} | {statistics.mean(times[:tenth]) * 1e3:.3f} "
              f"| {statistics.mean(times[-tenth:]) * 1e3:.3f} |")
    ratio_median = statistics.median(robust) / statistics.median(raw)
    ratio_mean = statistics.mean(robust) / statistics.mean(raw)
    print(f"robust / raw: median {ratio_median:.2f}x, mean {ratio_mean:.2f}x; cache holds "
          f"{r['cache_bytes'] / 2**20:.0f} MiB of a {r['budget'] / 2**20:.0f} MiB budget "
          f"({r['refused']} results not kept); rank 0 peak RSS {r['max_rss_mib']:.0f} MiB")
    figures = {"calls": args.calls, "mib": args.mib, "ranks": args.ranks,
               "ratio_median": ratio_median, "ratio_mean": ratio_mean, **r}
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, times in rows:
            ax.plot([t * 1e3 for t in times], label=name, linewidth=0.8)
        ax.set_xlabel("call")
        ax.set_ylabel("ms per call")
        ax.set_title(f"{args.mib} MiB allreduce without checkpoints")
        ax.legend()
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
