"""Overhead of KVStore push/pull against direct allreduces of the same arrays,
side by side in one run.

    rabit-run -n 2 python scripts/bench_kvstore.py [--arrays 8] [--plot kv.png]

A "model" of ``--arrays`` float32 arrays of equal size is reduced per step by:
raw mpi4py ``Allreduce`` of each array; ``rabit.allreduce`` of each array;
``rabit.allreduce`` of one flat buffer (the arrays copied in and out);
``KVStore.pushpull`` of all keys (no updater: the store keeps the sum); and
``pushpull`` with SGD+momentum (the update included). Prints the median step
time per total size and the ratio of pushpull to the per-array allreduce,
writes JSON, and optionally a plot.
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
from rabit_py.engine._mpistart import MPI  # noqa: E402 - as rabit_py starts it

import rabit_py as rabit  # noqa: E402
from rabit_py.kvstore import KVStore  # noqa: E402
from rabit_py.kvstore.optimizer import SGD  # noqa: E402
from rabit_py.extras import require  # noqa: E402

SIZES = [64 * 2 ** 10, 2 ** 20, 16 * 2 ** 20]


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES,
                        help="total bytes of the model")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--json", default="bench-results/kvstore.json")
    parser.add_argument("--plot", help="draw the table into this image (matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    rabit.init()
    rank, size = rabit.get_rank(), rabit.get_world_size()
    comm = MPI.COMM_WORLD
    rows = [bench_size(total, args, comm) for total in args.sizes]
    if rank == 0:
        report(rows, args, size)
    rabit.finalize()
    return 0


def bench_size(total: int, args: argparse.Namespace, comm: MPI.Comm) -> dict:
    """Median step time of every mode for a model of ``total`` bytes."""
    rank = comm.Get_rank()
    n = max(1, total // 4 // args.arrays)
    rng = np.random.default_rng(rank)
    grads = [rng.standard_normal(n, dtype=np.float32) for _ in range(args.arrays)]
    work = [g.copy() for g in grads]
    flat = np.empty(n * args.arrays, dtype=np.float32)
    keys = list(range(args.arrays))
    plain = KVStore(bucket_cap_mb=args.bucket_mb)
    plain.init(keys, [np.zeros(n, np.float32) for _ in keys])
    sgd = KVStore(bucket_cap_mb=args.bucket_mb)
    sgd.set_optimizer(SGD(learning_rate=1e-3, momentum=0.9))
    sgd.init(keys, [np.zeros(n, np.float32) for _ in keys])
    outs = [np.empty(n, np.float32) for _ in keys]

    def raw_each() -> None:
        for w in work:
            comm.Allreduce(MPI.IN_PLACE, w, MPI.SUM)

    def rabit_each() -> None:
        for w in work:
            rabit.allreduce(w, rabit.Op.SUM)

    def rabit_flat() -> None:
        for i, g in enumerate(grads):
            flat[i * n:(i + 1) * n] = g
        rabit.allreduce(flat, rabit.Op.SUM)
        for i, w in enumerate(work):
            w[...] = flat[i * n:(i + 1) * n]

    def kv_pushpull() -> None:
        plain.pushpull(keys, grads, out=outs)

    def kv_sgd() -> None:
        sgd.pushpull(keys, grads, out=outs)

    modes = {"mpi4py Allreduce each": raw_each, "rabit allreduce each": rabit_each,
             "rabit allreduce flat": rabit_flat, "kvstore pushpull": kv_pushpull,
             "kvstore pushpull+SGD": kv_sgd}
    times = {name: [] for name in modes}
    for fn in modes.values():
        fn()                                    # warm-up (plans, buffers)
    for _ in range(args.steps):
        for name, fn in modes.items():           # interleaved: drift hits all alike
            for w, g in zip(work, grads):
                w[...] = g
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            # Untimed: a training loop checkpoints, which frees the robust
            # engine's result cache (otherwise it grows by the model per call).
            rabit.checkpoint(None)
    plain.close()
    sgd.close()
    worst = {name: max(comm.allgather(statistics.median(t))) for name, t in times.items()}
    return {"bytes": n * 4 * args.arrays, "seconds": times, "median": worst}


def report(rows: list, args: argparse.Namespace, size: int) -> None:
    names = list(rows[0]["median"])
    print(f"KVStore vs direct allreduce ({os.environ.get('RABIT_ENGINE', 'auto')} engine): "
          f"{args.arrays} float32 arrays, {size} ranks on "
          f"{os.cpu_count()} cores (oversubscribed if ranks > cores); median of {args.steps} "
          f"steps, slowest rank")
    print(f"{'bytes':>10}" + "".join(f"{name:>24}" for name in names)
          + f"{'pushpull/each':>15}{'pushpull/flat':>15}")
    for row in rows:
        med = row["median"]
        each = med["kvstore pushpull"] / med["rabit allreduce each"]
        flat = med["kvstore pushpull"] / med["rabit allreduce flat"]
        row["ratio pushpull / allreduce each"] = each
        row["ratio pushpull / allreduce flat"] = flat
        print(f"{row['bytes']:>10}" + "".join(f"{med[n] * 1e3:>21.2f} ms" for n in names)
              + f"{each:>14.2f}x{flat:>14.2f}x")
    folder = os.path.dirname(args.json)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"ranks": size, "arrays": args.arrays, "rows": rows}, f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for name in names:
            ax.plot([r["bytes"] for r in rows], [r["median"][name] * 1e3 for r in rows],
                    marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("model bytes")
        ax.set_ylabel("median step (ms)")
        ax.set_title(f"KVStore vs allreduce, {size} ranks")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot)


if __name__ == "__main__":
    sys.exit(main())
