"""One data-parallel training loop written three ways: for Rabit's API, for
XGBoost's ``xgboost.collective`` and for mpi4py, each switched to rabit_py by
its import line (tests/jobs/test_dropins.py kills a rank of it from outside).

    rabit-run -n 4 python dropin_train.py --api mpi4py [--rounds 8] [--sleep 0.3]
                                          [--big N]

Linear regression by full-batch gradient descent over rank-local data: each
round allreduces the gradient (an array), the loss (an object or a
one-element array) and broadcasts a step size from the last rank. Only the
Rabit version checkpoints; the other two are replayed from their start when a
rank is replaced. Every rank prints ``START {json}`` (rank, pid), rank 0
``ROUND <i>`` after each round, and every rank ``RESULT {json}`` with the
model's SHA-256 at the end. ``--big N`` (mpi4py only): each round also sums
N random float32 per rank in place, as a gradient too large for the engine
to keep past its cache budget; their SHA-256 is in ``RESULT`` as well.
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

DIM = 6


def local_data(rank: int):
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((64, DIM))
    y = x @ np.linspace(-1.0, 1.0, DIM) + 0.01 * rng.standard_normal(64)
    return x, y


def gradient(w, x, y):
    residual = x @ w - y
    return x.T @ residual, float(residual @ residual)


def run_rabit(args) -> np.ndarray:
    import rabit_py.rabit as rabit

    rabit.init(sys.argv)
    rank = rabit.get_rank()
    start(rank)
    x, y = local_data(rank)
    version, w = rabit.load_checkpoint()
    if version == 0:
        w = np.zeros(DIM)
    for it in range(version, args.rounds):
        grad, loss = gradient(w, x, y)
        grad = rabit.allreduce(grad, rabit.SUM)
        total = rabit.allreduce(np.array([loss]), rabit.SUM)[0]
        step = rabit.broadcast(0.001 * (1 + it % 2) if rank == rabit.get_world_size() - 1
                               else None, rabit.get_world_size() - 1)
        w = w - step * grad
        pause(args, rank, it, total)
        rabit.checkpoint(w)
    rabit.finalize()
    return w


def run_collective(args) -> np.ndarray:
    import rabit_py.collective as collective

    with collective.CommunicatorContext(dmlc_task_id=str(os.getpid())):
        rank, world = collective.get_rank(), collective.get_world_size()
        start(rank)
        x, y = local_data(rank)
        w = np.zeros(DIM)
        for it in range(args.rounds):
            grad, loss = gradient(w, x, y)
            grad = collective.allreduce(grad, collective.Op.SUM)
            total = collective.allreduce(np.array([loss]), collective.Op.SUM)[0]
            step = collective.broadcast(0.001 * (1 + it % 2), world - 1)
            w = w - step * grad
            pause(args, rank, it, total)
    return w


def run_mpi4py(args) -> np.ndarray:
    from rabit_py.mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    start(rank)
    x, y = local_data(rank)
    w = np.zeros(DIM)
    for it in range(args.rounds):
        grad, loss = gradient(w, x, y)
        total_grad = np.empty_like(grad)
        comm.Allreduce(grad, total_grad, op=MPI.SUM)
        total = comm.allreduce(loss, op=MPI.SUM)
        step = comm.bcast(0.001 * (1 + it % 2) if rank == size - 1 else None, root=size - 1)
        w = w - step * total_grad
        if args.big:
            big = np.random.default_rng([rank, it]).standard_normal(args.big, dtype=np.float32)
            comm.Allreduce(MPI.IN_PLACE, big, op=MPI.SUM)
            BIG.update(big.tobytes())
        pause(args, rank, it, total)
    comm.Barrier()
    return w


BIG = hashlib.sha256()      # the --big sums, in order


def start(rank: int) -> None:
    print("START " + json.dumps({"rank": rank, "pid": os.getpid()}), flush=True)


def pause(args, rank: int, it: int, loss: float) -> None:
    if rank == 0:
        print(f"ROUND {it} {loss!r}", flush=True)
    time.sleep(args.sleep)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", choices=("rabit", "collective", "mpi4py"), required=True)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--big", type=int, default=0)
    args, _ = parser.parse_known_args()
    w = {"rabit": run_rabit, "collective": run_collective, "mpi4py": run_mpi4py}[args.api](args)
    print("RESULT " + json.dumps({"digest": hashlib.sha256(w.tobytes()).hexdigest(),
                                  "big": BIG.hexdigest(), "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
