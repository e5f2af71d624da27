"""rabit_py demo: a BSP loop that fits a linear model by gradient descent.

Each rank holds its own shard of rows. Rank 0 broadcasts the settings; every
iteration, each rank computes the gradient on its shard, ``allreduce`` sums it,
every rank applies the same update, and ``checkpoint`` ends the iteration. The
loop starts from ``load_checkpoint()``, as a fault-tolerant job must.

    python scripts/demo.py                  # one rank, no mpirun needed
    rabit-run -n 4 python scripts/demo.py   # four ranks
    rabit-run -n 4 python scripts/demo.py --kill 2:10
        # rank 2 is killed (SIGKILL) in iteration 10; a replacement takes its
        # rank, replays from the survivors' cache, and the job ends with the
        # same model as without the failure
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import numpy as np

import rabit_py as rabit


def make_shard(rank: int, rows: int, true_w: np.ndarray) -> tuple:
    """This rank's rows: X (rows x d) and noisy targets y."""
    rng = np.random.default_rng(1000 + rank)
    X = rng.normal(size=(rows, true_w.size))
    y = X @ true_w + 0.01 * rng.normal(size=rows)
    return X, y


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--rows", type=int, default=2000, help="rows per rank")
    parser.add_argument("--kill", metavar="RANK:ITERATION",
                        help="kill that rank in that iteration (needs rabit-run: in-job recovery)")
    args = parser.parse_args(argv)
    settings = {}
    if args.kill:
        rank_text, _, iteration_text = args.kill.partition(":")
        # The mock engine kills the original process of that rank when it reaches
        # the allreduce (seqno 0) of that version; its replacement lives on.
        settings = {"engine": "mock", "mock": f"{int(rank_text)},{int(iteration_text)},0,0"}

    with rabit.session(**settings):
        rank, size = rabit.get_rank(), rabit.get_world_size()
        # Settings come from rank 0, as a config file read by one rank would.
        settings = rabit.broadcast({"lr": 0.5, "dim": 8, "seed": 7} if rank == 0 else None, root=0)
        true_w = np.random.default_rng(settings["seed"]).normal(size=settings["dim"])
        X, y = make_shard(rank, args.rows, true_w)
        total_rows = rabit.allreduce(np.array([len(y)], dtype=np.int64), rabit.Op.SUM)[0]

        rabit.tracker_print(f"rabit_py demo: {size} rank(s) on {rabit.get_processor_name()}, "
                            f"{total_rows} rows, {settings['dim']} features")
        version, w = rabit.load_checkpoint()
        if version == 0:
            w = np.zeros(settings["dim"])
        for it in range(version, args.iterations):
            residual = X @ w - y
            grad = np.concatenate([X.T @ residual, [residual @ residual]])
            rabit.allreduce(grad, rabit.Op.SUM)          # sum over all shards
            w = w - settings["lr"] * grad[:-1] / total_rows
            if it % 10 == 0 or it == args.iterations - 1:
                rabit.tracker_print(f"  iteration {it:3d}  mse {grad[-1] / total_rows:.6f}")
            rabit.checkpoint(w)

        # Every rank holds the same model: check it bit for bit.
        lowest = rabit.allreduce(w.copy(), rabit.Op.MIN)
        highest = rabit.allreduce(w.copy(), rabit.Op.MAX)
        identical = bool(np.array_equal(lowest, highest))
        error = float(np.max(np.abs(w - true_w)))
        ranks_seen = rabit.allgather(np.array([rank], dtype=np.int64))
        pids = rabit.allgather(np.array([os.getpid()], dtype=np.int64))
        rabit.tracker_print(f"process ids by rank: {pids.tolist()}")
        rabit.tracker_print(
            f"demo OK: ranks {ranks_seen.tolist()}, version {rabit.version_number()}, "
            f"max |w - w_true| = {error:.4f}, model identical on all ranks: {identical}, "
            f"model digest {hashlib.sha256(w.tobytes()).hexdigest()[:16]}")
        if not identical or error > 0.05:
            print(f"rank {rank}: demo FAILED (identical={identical}, error={error})",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
