"""Example: fault-tolerant XGBoost on a HIGGS-like task, one shard per rank.

    rabit-run -n 4 -- python scripts/xgboost_train.py --rows 400000 --rounds 50
    rabit-run -n 4 -- python scripts/xgboost_train.py --data 'data/part-{rank}.npy'

Each rank reads its own rows: generated (``--rows`` in all, split by rank, the
same rows whatever the world size), or ``--data`` files written by
``python scripts/make_data.py higgs --parts 4 --out 'data/part-{rank}.npy'``
(label in column 0). Rank 0 prints the validation log-loss and AUC of each
round and writes the model in XGBoost's JSON format (``--out``). Kill any rank
(``kill -9``) while it trains: a replacement takes its place and the model is
the same, byte for byte.

``--xgboost-only`` trains with XGBoost alone (its tracker, no rabit_py
recovery; rabit_py only passes the tracker's address), saving the model to
``--save-dir`` every ``--every`` rounds and resuming from it when restarted:
what an XGBoost user does today, for ``scripts/bench_recovery.py --xgboost``.
With ``--print-pid`` it prints ``ROUND <rank> <round> <time>`` after each round.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import time
import zlib

import numpy as np

from rabit_py.extras import require

require("xgboost", "xgboost", "scripts/xgboost_train.py")

import xgboost  # noqa: E402
from xgboost.callback import TrainingCallback  # noqa: E402

import rabit_py as rabit
import rabit_py.xgboost as rxgb
from trainers.data import load_shard, make_higgs_like, shard_range

PARAMS = {"objective": "binary:logistic", "eval_metric": ["logloss", "auc"],
          "max_depth": 6, "eta": 0.2, "tree_method": "hist", "nthread": 1}


class Rounds(TrainingCallback):
    """Prints ``ROUND <rank> <round> <time>``, the round counted from the
    first (XGBoost counts from its own start when it resumes from a file);
    the rank is read at each call (rabit_py checkpoints callbacks with the
    model, from rank 0's copy)."""

    def after_iteration(self, model, epoch, evals_log) -> bool:
        print(f"ROUND {rabit.get_rank()} {model.num_boosted_rounds() - 1} {time.time():.6f}",
              flush=True)
        return False


def rounds(args: argparse.Namespace) -> list:
    return [Rounds()] if args.print_pid else []


class SaveEvery(TrainingCallback):
    """The XGBoost user's own periodic save (``--xgboost-only``)."""

    def __init__(self, path: str, every: int) -> None:
        self.path, self.every = path, every

    def after_iteration(self, model, epoch, evals_log) -> bool:
        if (epoch + 1) % self.every == 0 and xgboost.collective.get_rank() == 0:
            model.save_model(self.path + ".tmp.json")
            os.replace(self.path + ".tmp.json", self.path)
        return False


def my_rows(args: argparse.Namespace, rank: int, world: int):
    """(X, y, X_val, y_val) of this rank."""
    if args.data:
        X, y = load_shard(args.data.format(rank=rank), label_column=0)
    else:
        start, stop = shard_range(args.rows, rank, world)
        X, y = make_higgs_like(stop - start, seed=args.seed, start=start)
    held_out = max(1, len(y) // 10)
    return X[held_out:], y[held_out:], X[:held_out], y[:held_out]


def train_xgboost_only(args: argparse.Namespace, X, y, Xv, yv) -> xgboost.Booster:
    """Plain XGBoost distributed training, resuming from the user's last save."""
    rank, world = rabit.get_rank(), rabit.get_world_size()
    tracker = None
    # Across hosts the tracker must listen where the others reach rank 0:
    # the address of its host name (XGBoost's own guess needs a route to the
    # outside, which a cluster's private network may lack).
    host = np.array([zlib.crc32(socket.gethostname().encode())] * 2, dtype=np.int64)
    host[1] = -host[1]
    rabit.allreduce(host, rabit.Op.MAX)
    one_host = host[0] == -host[1]
    if rank == 0:
        tracker = xgboost.tracker.RabitTracker(
            n_workers=world, sortby="task", timeout=60,
            host_ip="127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname()))
        tracker.start()
    worker_args = rabit.broadcast(tracker.worker_args() if tracker else None, 0)
    path = os.path.join(args.save_dir, "model.json")
    resume = path if os.path.exists(path) else None
    done = xgboost.Booster(model_file=resume).num_boosted_rounds() if resume else 0
    with xgboost.collective.CommunicatorContext(**worker_args, dmlc_task_id=f"{rank:09d}",
                                                dmlc_timeout=args.timeout):
        dtrain, dval = xgboost.DMatrix(X, label=y), xgboost.DMatrix(Xv, label=yv)
        booster = xgboost.train(PARAMS, dtrain, args.rounds - done, evals=[(dval, "val")],
                                xgb_model=resume, verbose_eval=False,
                                callbacks=rounds(args) + [SaveEvery(path, args.every)])
    if tracker is not None:
        tracker.wait_for(60)
    return booster


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="generated rows in all")
    parser.add_argument("--data", help="this rank's file, with {rank} in the path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--every", type=int, default=1, help="rounds per checkpoint")
    parser.add_argument("--timeout", type=int, default=30,
                        help="seconds XGBoost waits for a peer")
    parser.add_argument("--out", default="xgboost-model.json")
    parser.add_argument("--quiet", action="store_true", help="no evaluation log")
    parser.add_argument("--xgboost-only", action="store_true")
    parser.add_argument("--save-dir", default="xgboost-saves")
    parser.add_argument("--print-pid", action="store_true",
                        help="print PID <rank> <pid> and ROUND <rank> <round> <time> lines "
                             "(for benchmarks that kill a rank)")
    args = parser.parse_args(argv)

    with rabit.session():
        rank, world = rabit.get_rank(), rabit.get_world_size()
        if args.print_pid:
            print(f"PID {rank} {os.getpid()}", flush=True)
        started = time.time()
        X, y, Xv, yv = my_rows(args, rank, world)
        if rank == 0:
            print(f"{world} ranks, {len(y)} training rows on rank 0, {args.rounds} rounds",
                  flush=True)
        if args.xgboost_only:
            os.makedirs(args.save_dir, exist_ok=True)
            booster = train_xgboost_only(args, X, y, Xv, yv)
        else:
            booster = rxgb.train(PARAMS, X, y, num_boost_round=args.rounds,
                                 evals=[(Xv, yv, "val")], verbose_eval=not args.quiet,
                                 checkpoint_every=args.every, callbacks=rounds(args),
                                 timeout=args.timeout)
        raw = bytes(booster.save_raw("json"))
        if rank == 0:
            booster.save_model(args.out)
            print(f"trained {booster.num_boosted_rounds()} rounds in "
                  f"{time.time() - started:.1f} s; model {args.out} "
                  f"(sha256 {hashlib.sha256(raw).hexdigest()[:16]})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
