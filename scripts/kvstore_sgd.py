"""A single-process gradient-descent loop made distributed with the KVStore.

Linear least squares on the same global data (generated from a seed; each
worker keeps its rows) with SGD + momentum. The lines marked ``# +`` are all
that the distributed version adds to the single-process loop, and those
marked ``# -`` are what it removes:

    X, y = make_data(rows, features)
    # + X, y = my_rows(X, y)
    w, b = np.zeros(features), np.zeros(1)
    velocity_w, velocity_b = np.zeros(features), np.zeros(1)   # - (the optimizer's)
    # + kv = KVStore("dist_sync")
    # + kv.set_optimizer(SGD(learning_rate=lr, momentum=0.9, rescale_grad=1 / rows))
    # + kv.init(["w", "b"], [w, b])
    for step in range(steps):
        residual = X @ w + b - y
        grad_w, grad_b = X.T @ residual, residual.sum(keepdims=True)
        velocity_w = 0.9 * velocity_w - lr / rows * grad_w   # - ...
        velocity_b = 0.9 * velocity_b - lr / rows * grad_b   # - ...
        w += velocity_w                                      # - ...
        b += velocity_b                                      # -
        # + kv.pushpull(["w", "b"], [grad_w, grad_b], out=[w, b])

Run:

    python scripts/kvstore_sgd.py --out w1.json                 # one process
    rabit-run -n 4 -- python scripts/kvstore_sgd.py --out w4.json
        # four workers: the same weights up to summation order, and the
        # same distance to the least-squares solution

With ``--checkpoint-every K`` the store's weights and momentum are the job's
checkpoint: a worker killed mid-run (e.g. ``RABIT_ENGINE=mock
RABIT_MOCK=2,5,1,0``) is replaced and the job ends with the weights of a
failure-free run, bit for bit.

On server processes (``--kvtype dist_async``, or ``dist_ssp --staleness
TAU``; start the job with ``rabit-run -n 4 --servers 2``) the optimizer runs
on the servers and each worker's gradient is applied as it arrives; with
``--checkpoint-every K`` the servers write their parts every K pushes and a
restarted job resumes at the workers' clocks (``--checkpoint-dir``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional, Sequence, Tuple

import numpy as np

import rabit_py as rabit
from rabit_py.kvstore import KVStore, create
from rabit_py.kvstore.optimizer import SGD


def make_data(rows: int, features: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The global data set: ``y = X w* + b* + noise``, features of different scales."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, features)) * rng.uniform(0.5, 2.0, size=features)
    y = X @ rng.normal(size=features) + 1.5 + 0.1 * rng.normal(size=rows)
    return X, y


def my_rows(X: np.ndarray, y: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """This worker's contiguous block of rows."""
    rank, world = rabit.get_rank(), rabit.get_world_size()
    lo, hi = X.shape[0] * rank // world, X.shape[0] * (rank + 1) // world
    return X[lo:hi], y[lo:hi]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="store the weights and momentum every K steps (0: never)")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="the store's bucket size (tiny: one key per bucket)")
    parser.add_argument("--kvtype", default="dist_sync",
                        choices=["dist_sync", "dist_async", "dist_ssp"],
                        help="dist_sync (BSP on allreduce), or on server processes "
                             "dist_async / dist_ssp")
    parser.add_argument("--staleness", type=int, default=2, help="dist_ssp's bound")
    parser.add_argument("--out", help="write the final weights and figures here (JSON)")
    args = parser.parse_args(argv)

    rabit.init()
    started = time.perf_counter()
    X_all, y_all = make_data(args.rows, args.features)
    X, y = my_rows(X_all, y_all)
    on_servers = args.kvtype != "dist_sync"
    if on_servers:
        kv = create(args.kvtype, checkpoint_every=args.checkpoint_every,
                    **({"staleness": args.staleness} if args.kvtype == "dist_ssp" else {}))
        # Each worker's gradient is an update of its own: a worker's share.
        lr = args.lr / rabit.get_world_size()
    else:
        kv = KVStore("dist_sync", bucket_cap_mb=args.bucket_mb)
        lr = args.lr
    kv.set_optimizer(SGD(learning_rate=lr, momentum=0.9, rescale_grad=1.0 / args.rows))
    kv.init(["w", "b"], [np.zeros(args.features), np.zeros(1)])
    w, b = kv.pull(["w", "b"])
    # A replaced (or restarted) worker resumes after the last checkpoint.
    if on_servers:
        first = kv.clock()
    else:
        first = kv.load_checkpoint() * args.checkpoint_every if args.checkpoint_every else 0
    if first:
        kv.pull(["w", "b"], out=[w, b])
    for step in range(first, args.steps):
        residual = X @ w + b - y
        grad_w, grad_b = X.T @ residual, residual.sum(keepdims=True)
        kv.pushpull(["w", "b"], [grad_w, grad_b], out=[w, b])
        if not on_servers and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            kv.checkpoint()
    if on_servers:
        kv.barrier()                    # every worker's pushes applied: the final weights
        kv.pull(["w", "b"], out=[w, b])
    kv.close()

    # Figures: the global loss and the distance to the least-squares solution.
    sse = rabit.allreduce(np.array([float(np.sum((X @ w + b - y) ** 2))]), rabit.Op.SUM)[0]
    design = np.column_stack([X_all, np.ones(args.rows)])
    best = np.linalg.lstsq(design, y_all, rcond=None)[0]
    ours = np.concatenate([w, b])
    figures = {"world_size": rabit.get_world_size(), "steps": args.steps, "kvtype": args.kvtype,
               "loss": sse / args.rows / 2,
               "best_loss": float(np.sum((design @ best - y_all) ** 2)) / args.rows / 2,
               "relative_distance_to_lstsq": float(np.linalg.norm(ours - best)
                                                   / np.linalg.norm(best)),
               "seconds": time.perf_counter() - started, "weights": ours.tolist()}
    if rabit.get_rank() == 0:
        print(f"kvstore_sgd: {figures['world_size']} worker(s), {args.kvtype}, {args.steps} "
              f"steps: loss "
              f"{figures['loss']:.6f} (least squares {figures['best_loss']:.6f}), |w - w*|/|w*| = "
              f"{figures['relative_distance_to_lstsq']:.2e}, {figures['seconds']:.2f} s",
              flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(figures, f)
    rabit.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
