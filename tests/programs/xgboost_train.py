"""Real XGBoost through rabit_py.xgboost.train on every rank of a job.

Each rank prints ``START <json>`` when it starts (its pid, to be killed from
outside), ``ROUND <rank> <round>`` after each round (from a callback, so
inside XGBoost's training loop), and ``RESULT <json>`` at the end: the sha256
of the booster's saved JSON bytes, the rounds, XGBoost's best iteration.
"""

import argparse
import hashlib
import json
import logging
import os
import sys
import time

import numpy as np
import xgboost
from xgboost.callback import TrainingCallback

import rabit_py as rabit
import rabit_py.xgboost as rxgb


# Processes that already held once (not in the callback: callbacks are
# checkpointed with the model, from rank 0's copy).
_HELD = []


class Progress(TrainingCallback):
    """Prints each finished round; optionally slows the rounds down, or holds
    one rank after one round until it is killed from outside (``hold``:
    (rank, round)), so that the kill lands while the others are inside
    XGBoost's next round, however late the test reads the cue. The rank is
    read at each call: callbacks are checkpointed with the model, from rank
    0's copy."""

    def __init__(self, sleep: float, hold: tuple) -> None:
        self.sleep = sleep
        self.hold = hold

    def after_iteration(self, model, epoch, evals_log):
        rank = rabit.get_rank()
        print(f"ROUND {rank} {epoch}", flush=True)
        if self.sleep:
            time.sleep(self.sleep)
        if (rank, epoch) == self.hold and not _HELD and rabit.engine_info().trial == 0:
            _HELD.append(epoch)
            time.sleep(120)         # the test kills this process long before
        return False


def rows(rank: int, n: int, features: int = 12, seed: int = 0):
    """This rank's rows of one synthetic task (missing values included)."""
    rng = np.random.default_rng([seed, rank])
    X = rng.normal(size=(n, features)).astype(np.float32)
    X[rng.random(X.shape) < 0.05] = np.nan
    z = np.nan_to_num(X[:, 0]) - np.nan_to_num(X[:, 1]) * np.nan_to_num(X[:, 2]) \
        + 0.5 * rng.normal(size=n)
    return X, (z > 0).astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--sampling", action="store_true")
    ap.add_argument("--early-stopping", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=10)
    ap.add_argument("--bad-param", action="store_true")
    ap.add_argument("--raise-on-rank", type=int, default=-1)
    ap.add_argument("--hold", default="", help="RANK:ROUND: that rank waits after that round "
                    "(in its first process) until it is killed")
    args = ap.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    rabit.init()
    rank = rabit.get_rank()
    trial = rabit.engine_info().trial
    print("START " + json.dumps({"rank": rank, "pid": os.getpid(), "trial": trial}), flush=True)

    params = {"objective": "binary:logistic", "max_depth": 4, "eta": 0.3, "nthread": 1,
              "eval_metric": "logloss", "seed": 7}
    if args.sampling:
        params.update(subsample=0.7, colsample_bytree=0.8)
    if args.bad_param:
        params["max_depth"] = -3
    X, y = rows(rank, args.rows)
    Xv, yv = rows(rank, 500, seed=1)
    if rank == args.raise_on_rank:
        def broken():
            raise ValueError("this rank's data file is unreadable")
        X, y = broken, None
    history = {}
    booster = rxgb.train(params, X, y, num_boost_round=args.rounds,
                         evals=[(Xv, yv, "val")], evals_result=history,
                         early_stopping_rounds=args.early_stopping or None,
                         verbose_eval=False, checkpoint_every=args.every,
                         callbacks=[Progress(args.sleep, tuple(int(x) for x in args.hold.split(':')) if args.hold else ())], timeout=args.timeout)
    raw = bytes(booster.save_raw("json"))
    print("RESULT " + json.dumps({
        "rank": rank, "pid": os.getpid(), "trial": trial, "world": rabit.get_world_size(),
        "sha": hashlib.sha256(raw).hexdigest(), "rounds": booster.num_boosted_rounds(),
        "best": booster.attr("best_iteration"), "history": len(history["val"]["logloss"]),
        "version": rabit.version_number(),
        "predict": float(booster.predict(xgboost.DMatrix(Xv)).sum()),
    }), flush=True)
    rabit.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
