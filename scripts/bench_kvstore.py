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

    python scripts/bench_kvstore.py --consistency [--workers 4] [--servers 2] [--plot c.png]

The consistency models side by side in one job (``rabit-run -n W --servers
S``, started by the script): logistic regression by minibatch SGD on
``--workers`` workers until the servers (or BSP's allreduce) applied
``--updates`` minibatch gradients, for BSP (``dist_sync``), bounded delay
(``dist_ssp``, each ``--staleness``) and ``dist_async``, each in three
settings: every worker alike, one worker twice as slow as the others
(``slow``), and random stalls (``jitter``: each step of each worker, with
probability 0.1, five times as long). A step's compute is emulated by a
sleep of ``--step-ms`` (the real gradient is computed too, and is small):
this 2-core VM cannot give 4 busy workers a core each, and a sleep keeps
the straggler's slowness its own. Prints, per setting, the median wall time
to the updates and its range over ``--repeats`` rounds (the contenders
alternating), the time against BSP, and the logistic loss reached on the
whole data set; writes JSON; ``--plot`` draws the times. ``dist_async`` runs
also with ``replicas=1`` (each server's parts copied on the next server),
for the cost of replication.
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
    parser.add_argument("--consistency", action="store_true",
                        help="compare BSP, bounded delay and async on server processes")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--updates", type=int, default=1200,
                        help="minibatch gradients applied per run")
    parser.add_argument("--step-ms", type=float, default=4.0,
                        help="a step's emulated compute (ms)")
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--features", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--in-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    if args.consistency:
        return consistency(args, argv if argv is not None else sys.argv[1:])
    from rabit_py.engine._mpistart import MPI
    rabit.init()
    rank, size = rabit.get_rank(), rabit.get_world_size()
    comm = MPI.COMM_WORLD
    rows = [bench_size(total, args, comm) for total in args.sizes]
    if rank == 0:
        report(rows, args, size)
    rabit.finalize()
    return 0


def bench_size(total: int, args: argparse.Namespace, comm: object) -> dict:
    """Median step time of every mode for a model of ``total`` bytes."""
    from rabit_py.engine._mpistart import MPI
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


# ---------------------------------------------------------------- consistency models
SETTINGS = ("alike", "slow", "jitter")


def consistency(args: argparse.Namespace, argv: list) -> int:
    """Outside the job: start it; inside: run the rounds (rank 0 reports)."""
    if not args.in_job:
        import subprocess
        cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(args.workers),
               "--servers", str(args.servers), "--", sys.executable, os.path.abspath(__file__),
               *argv, "--in-job"]
        return subprocess.run(cmd).returncode
    from rabit_py.kvstore import create
    from rabit_py.kvstore.optimizer import SGD as Sgd

    rabit.init()
    rank, workers = rabit.get_rank(), rabit.get_world_size()
    rng = np.random.default_rng(100 + rank)
    truth = np.random.default_rng(0).standard_normal(args.features) / np.sqrt(args.features)
    X = rng.standard_normal((4000, args.features))
    y = (rng.random(4000) < 1 / (1 + np.exp(-4 * X @ truth))).astype(np.float64)
    contenders = [("BSP (dist_sync)", "dist_sync", None)] + \
        [(f"SSP tau={t}", "dist_ssp", t) for t in args.staleness] + \
        [("async", "dist_async", None)] + \
        ([("async, replicas=1", "dist_async+replicas", None)] if args.servers > 1 else [])
    times: dict = {(s, c[0]): [] for s in SETTINGS for c in contenders}
    losses: dict = {(s, c[0]): [] for s in SETTINGS for c in contenders}
    done: dict = {(s, c[0]): [] for s in SETTINGS for c in contenders}
    lr = 0.5
    for repeat in range(args.repeats):
        for setting in SETTINGS:
            for name, kvtype, tau in contenders:
                seconds, weights, updates = _train(kvtype, tau, setting, X, y, args, rank,
                                                   workers, lr, repeat, Sgd, create)
                times[(setting, name)].append(seconds)
                losses[(setting, name)].append(_loss(weights, X, y))
                done[(setting, name)].append(updates)
                if rank == 0:
                    print(f"  round {repeat + 1}/{args.repeats} {setting:>6} {name:<16} "
                          f"{seconds:6.3f} s {updates} updates", flush=True)
    if rank == 0:
        _report_consistency(times, losses, done, contenders, args, workers)
    rabit.finalize()
    return 0


def _train(kvtype, tau, setting, X, y, args, rank, workers, lr, repeat, Sgd, create):
    """One run to ``args.updates`` minibatch gradients: (seconds, weights,
    updates applied). The job's time: the last worker's stop."""
    from rabit_py.kvstore import KVStore

    batch = 64
    stalls = np.random.default_rng(1000 * repeat + rank)
    if kvtype == "dist_sync":
        kv = KVStore()
        # The sum of the workers' gradients, averaged: one step per W minibatches.
        kv.set_optimizer(Sgd(learning_rate=lr, rescale_grad=1.0 / workers))
    else:
        replicas = kvtype.endswith("+replicas")
        kv = create(kvtype.split("+")[0], replicas=int(replicas),
                    **({} if tau is None else {"staleness": tau}))
        # One worker's gradient per update, the same length per minibatch as BSP's.
        kv.set_optimizer(Sgd(learning_rate=lr / workers))
    kv.init("w", np.zeros(args.features))
    w = np.zeros(args.features)
    kv.barrier()
    start = time.perf_counter()
    step = 0
    while True:
        rows = slice((step * batch) % len(X), (step * batch) % len(X) + batch)
        xb, yb = X[rows], y[rows]
        grad = xb.T @ (1 / (1 + np.exp(-xb @ w)) - yb) / len(yb)
        pause = args.step_ms / 1e3
        if setting == "slow" and rank == workers - 1:
            pause *= 2
        elif setting == "jitter" and stalls.random() < 0.1:
            pause *= 5
        time.sleep(pause)
        kv.push("w", grad)
        kv.pull("w", out=w)
        step += 1
        if kvtype == "dist_sync":
            if step * workers >= args.updates:
                break
        elif sum(kv.pull_clocks[-1][3]) >= args.updates:
            break
    stop = time.perf_counter() - start
    kv.barrier()
    w = kv.pull("w")
    updates = step * workers if kvtype == "dist_sync" else sum(kv.pull_clocks[-1][3])
    kv.close()
    seconds = float(rabit.allreduce(np.array([stop]), rabit.Op.MAX)[0])
    rabit.checkpoint(None)      # untimed: frees the robust engine's kept results
    return seconds, w, int(updates)


def _loss(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """The logistic loss over every worker's rows."""
    z = X @ w
    local = np.array([np.sum(np.logaddexp(0, z) - y * z), len(y)], dtype=np.float64)
    total = rabit.allreduce(local, rabit.Op.SUM)
    return float(total[0] / total[1])


def _report_consistency(times, losses, done, contenders, args, workers) -> None:
    print(f"\nConsistency models: {workers} workers, {args.servers} server(s), "
          f"{os.cpu_count()} cores (oversubscribed), logistic regression with "
          f"{args.features} features, {args.updates} minibatch updates, {args.step_ms:g} ms "
          f"of emulated compute a step; median [range] of {args.repeats} rounds")
    rows = []
    print(f"{'setting':>8} {'contender':<18}{'seconds':>22}{'vs BSP':>9}{'loss':>10}"
          f"{'updates':>9}")
    for setting in SETTINGS:
        bsp = statistics.median(times[(setting, contenders[0][0])])
        for name, _, _ in contenders:
            t = times[(setting, name)]
            med = statistics.median(t)
            loss = statistics.median(losses[(setting, name)])
            rows.append({"setting": setting, "contender": name, "seconds": t,
                         "median": med, "speed_vs_bsp": bsp / med,
                         "loss": losses[(setting, name)], "updates": done[(setting, name)]})
            updates = int(statistics.median(done[(setting, name)]))
            print(f"{setting:>8} {name:<18}{med:8.3f} [{min(t):.3f}-{max(t):.3f}]"
                  f"{bsp / med:8.2f}x{loss:10.5f}{updates:>9}")
    folder = os.path.dirname(args.json)
    if folder:
        os.makedirs(folder, exist_ok=True)
    path = args.json.replace(".json", "-consistency.json") if args.json.endswith(
        "kvstore.json") else args.json
    with open(path, "w") as f:
        json.dump({"workers": workers, "servers": args.servers, "updates": args.updates,
                   "step_ms": args.step_ms, "features": args.features, "rows": rows}, f,
                  indent=1)
    print(f"wrote {path}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4))
        names = [c[0] for c in contenders]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            ax.bar([j + i * width for j in range(len(SETTINGS))],
                   [statistics.median(times[(s, name)]) for s in SETTINGS], width, label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(SETTINGS))], list(SETTINGS))
        ax.set_ylabel(f"seconds to {args.updates} updates")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot)


if __name__ == "__main__":
    sys.exit(main())
