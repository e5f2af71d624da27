"""Per-call overhead of the drop-ins against the API under them, side by side
in one run.

    rabit-run -n 2 python scripts/bench_dropins.py [--sizes 8 4194304] [--plot d.png]

For each size (bytes of a float64 array) it times, interleaved so that drift
hits all alike: ``rabit_py.allreduce`` (the API under every drop-in);
``rabit_py.rabit.allreduce`` (Rabit's semantics: a ravel, a copy for views);
``rabit_py.collective.allreduce`` (XGBoost's: a copy, never in place);
``rabit_py.mpi4py`` ``COMM_WORLD.Allreduce(sendbuf, recvbuf)`` (spec parsing
and a copy into recvbuf) and raw mpi4py ``Allreduce`` on a duplicate of
``COMM_WORLD`` (no fault tolerance: the floor). For objects, an 8-byte float
through ``comm.allreduce``: the drop-in (two allgathers, a local tree) against
mpi4py's own. Prints the median per-call time (slowest rank) and each
drop-in's ratio to the API under it, writes JSON, optionally a plot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import rabit_py as rabit  # noqa: E402
import rabit_py.collective as collective  # noqa: E402
import rabit_py.rabit as rabit_api  # noqa: E402
from rabit_py.extras import require  # noqa: E402
from rabit_py.mpi4py import MPI as DropinMPI  # noqa: E402

SIZES = [8, 4 << 20]


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES,
                        help="bytes of the reduced float64 array")
    parser.add_argument("--calls", type=int, default=0,
                        help="calls per timing (default: ~0.2 s worth)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default="bench-results/dropins.json")
    parser.add_argument("--plot", help="draw the table into this image (matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")
    rabit.init()
    from mpi4py import MPI              # started by rabit.init()

    raw = MPI.COMM_WORLD.Dup()
    rows = [bench_size(nbytes, args, raw, MPI) for nbytes in args.sizes]
    rows.append(bench_objects(args, raw, MPI))
    if rabit.get_rank() == 0:
        report(rows, args, rabit.get_world_size())
    raw.Free()
    rabit.finalize()
    return 0


def time_modes(modes: dict, args: argparse.Namespace, comm) -> dict:
    """Median seconds per call of each mode (slowest rank), interleaved."""
    for fn in modes.values():
        fn()                                            # warm-up
    calls = args.calls
    if not calls:
        t0 = time.perf_counter()
        for fn in modes.values():
            fn()
        per_round = max(comm.allgather(time.perf_counter() - t0))
        calls = max(3, min(2000, int(0.2 / max(per_round, 1e-6))))
    times = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, fn in modes.items():
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls)
            # Untimed: a training loop checkpoints, which frees the robust
            # engine's result cache (it keeps every result until then).
            rabit.checkpoint(None)
    return {name: max(comm.allgather(statistics.median(t))) for name, t in times.items()}, \
        times, calls


def bench_size(nbytes: int, args: argparse.Namespace, raw, MPI) -> dict:
    n = max(1, nbytes // 8)
    data = np.full(n, 1.0 + rabit.get_rank())
    out = np.empty(n)
    comm = DropinMPI.COMM_WORLD
    modes = {
        "rabit_py.allreduce": lambda: rabit.allreduce(data, rabit.Op.SUM),
        "rabit_py.rabit.allreduce": lambda: rabit_api.allreduce(data, rabit_api.SUM),
        "rabit_py.collective.allreduce": lambda: collective.allreduce(data, collective.Op.SUM),
        "rabit_py.mpi4py Allreduce": lambda: comm.Allreduce(data, out, op=DropinMPI.SUM),
        "mpi4py Allreduce (raw)": lambda: raw.Allreduce(data, out, op=MPI.SUM),
    }
    median, times, calls = time_modes(modes, args, raw)
    return {"what": f"{n * 8} B array", "bytes": n * 8, "calls": calls, "median": median,
            "seconds": times}


def bench_objects(args: argparse.Namespace, raw, MPI) -> dict:
    value = 1.0 + rabit.get_rank()
    comm = DropinMPI.COMM_WORLD
    modes = {"rabit_py.mpi4py allreduce(obj)": lambda: comm.allreduce(value, op=DropinMPI.SUM),
             "mpi4py allreduce(obj) (raw)": lambda: raw.allreduce(value, op=MPI.SUM)}
    median, times, calls = time_modes(modes, args, raw)
    return {"what": "8 B float object", "bytes": 8, "calls": calls, "median": median,
            "seconds": times}


UNDER = {"rabit_py.rabit.allreduce": "rabit_py.allreduce",
         "rabit_py.collective.allreduce": "rabit_py.allreduce",
         "rabit_py.mpi4py Allreduce": "rabit_py.allreduce",
         "rabit_py.mpi4py allreduce(obj)": "mpi4py allreduce(obj) (raw)"}


def report(rows: list, args: argparse.Namespace, size: int) -> None:
    engine = os.environ.get("RABIT_ENGINE", "auto")
    print(f"drop-ins vs the API under them ({engine} engine), {size} ranks on "
          f"{os.cpu_count()} cores (oversubscribed if ranks > cores); median of "
          f"{args.repeats} timings, slowest rank, microseconds per call")
    print(f"{'what':<18}{'call':<34}{'us/call':>12}{'ratio':>9}  {'vs'}")
    for row in rows:
        med = row["median"]
        row["ratio"] = {}
        for name, seconds in med.items():
            base = UNDER.get(name)
            ratio = seconds / med[base] if base in med else None
            if ratio is not None:
                row["ratio"][name] = ratio
            print(f"{row['what']:<18}{name:<34}{seconds * 1e6:>12.1f}"
                  + (f"{ratio:>8.2f}x  {base}" if ratio is not None else ""))
    folder = os.path.dirname(args.json)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"ranks": size, "engine": engine, "rows": rows}, f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4))
        labels, values = [], []
        for row in rows:
            for name, seconds in row["median"].items():
                labels.append(f"{row['what']}\n{name}")
                values.append(seconds * 1e6)
        ax.barh(range(len(values)), values)
        ax.set_yticks(range(len(values)), labels, fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("median microseconds per call")
        ax.set_title(f"drop-ins vs the API under them, {size} ranks")
        fig.tight_layout()
        fig.savefig(args.plot)


if __name__ == "__main__":
    sys.exit(main())
