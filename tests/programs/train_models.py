"""Train every trainer on seeded data split across the job's ranks and write
the models to OUT_DIR (rank 0). Used by tests/jobs/test_trainers.py to compare
world sizes, failure-free and recovered runs, and the references.

    python tests/programs/train_models.py OUT_DIR [--only NAME ...]
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np

import rabit_py as rabit
from trainers import gbdt, kmeans, linear, mlp
from trainers.data import make_blobs, make_higgs_like, shard_range

NAMES = ("gbdt_binary", "gbdt_regression", "gbdt_multiclass", "gbdt_early_stop", "linear",
         "kmeans", "mlp")


def binary_data(n=6000, seed=11):
    X, y = make_higgs_like(n, seed=seed)
    holes = np.random.default_rng(seed).random(X.shape) < 0.05
    X[holes] = np.nan                     # missing values
    return X, y


def regression_data(n=4000, seed=12):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=n)
    return X, y


def multiclass_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.data.astype(np.float64), digits.target.astype(np.float64)


def linear_data(n=6000, seed=13):
    X, y = make_higgs_like(n, seed=seed)
    return (X - X.mean(axis=0)) / X.std(axis=0), y


def blobs(n=6000, seed=14):
    return make_blobs(n, n_clusters=6, n_features=5, seed=seed)


GBDT_PARAMS = {
    "gbdt_binary": ({"objective": "binary:logistic", "eta": 0.3, "max_depth": 4,
                     "subsample": 0.8, "colsample_bytree": 0.75, "max_bin": 64, "seed": 3,
                     "eval_metric": ["logloss", "auc"]}, 12, binary_data),
    "gbdt_regression": ({"objective": "reg:squarederror", "eta": 0.3, "max_depth": 3,
                         "lambda": 2.0, "gamma": 0.1, "min_child_weight": 3},
                        10, regression_data),
    "gbdt_multiclass": ({"objective": "multi:softprob", "num_class": 10, "eta": 0.3,
                         "max_depth": 3, "max_bin": 16, "eval_metric": ["mlogloss", "merror"]},
                        4, multiclass_data),
    # Deep trees at a high learning rate on 1000 noisy rows overfit quickly.
    "gbdt_early_stop": ({"objective": "binary:logistic", "eta": 1.0, "max_depth": 8,
                         "min_child_weight": 0, "eval_metric": "logloss"}, 60,
                        lambda: binary_data(2000, seed=15)),
}
EARLY_STOPPING = {"gbdt_early_stop": 3}


def shard(a):
    lo, hi = shard_range(a.shape[0], rabit.get_rank(), rabit.get_world_size())
    return a[lo:hi]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--only", action="append", choices=NAMES)
    args = parser.parse_args()
    rabit.init()
    rank = rabit.get_rank()
    print("START " + json.dumps({"rank": rank, "pid": os.getpid(),
                                 "trial": rabit.engine_info().trial}), flush=True)
    for name in args.only or NAMES:
        path = os.path.join(args.out, name + ".json")
        if name in GBDT_PARAMS:
            params, rounds, make = GBDT_PARAMS[name]
            X, y = make()
            evals = [(shard(X[-1000:]), shard(y[-1000:]), "valid")]
            # TRAIN_HIST_KERNEL: the tests compare the numba and NumPy kernels.
            params = {**params, "hist_kernel": os.environ.get("TRAIN_HIST_KERNEL", "auto")}
            booster = gbdt.train(params, shard(X[:-1000]), shard(y[:-1000]), rounds, evals,
                                 early_stopping_rounds=EARLY_STOPPING.get(name),
                                 verbose_eval=False)
            result = booster.to_dict()
        elif name == "linear":
            X, y = linear_data()
            model = linear.LogisticRegression(C=0.5, max_iter=200).fit(shard(X), shard(y))
            result = {"coef": model.coef_.tolist(), "intercept": model.intercept_.tolist(),
                      "objective": model.objective_, "n_iter": model.n_iter_}
        elif name == "mlp":
            X, y = linear_data()
            model = mlp.MLPClassifier([16, 8], 2, steps=30, batch_size=256, learning_rate=0.01,
                                      checkpoint_every=5, bucket_cap_mb=0.001, seed=2)
            model.fit(shard(X), shard(y))
            result = {"params": [p.tolist() for p in model.params_], "loss": model.loss_}
        else:
            model = kmeans.KMeans(6, seed=5).fit(shard(blobs()))
            result = {"centers": model.cluster_centers_.tolist(),
                      "init": model.initial_centers_.tolist(),
                      "inertia": model.inertia_, "n_iter": model.n_iter_}
        text = json.dumps(result)
        # Every rank must end with the same model: compare digests.
        digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.uint8)
        digests = rabit.allgather(digest[None].copy())
        if rank == 0:
            with open(path, "w") as f:
                f.write(text)
            same = bool((digests == digests[0]).all())
            print(f"DONE {name} {'same on every rank' if same else 'DIFFERS between ranks'}",
                  flush=True)
    rabit.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
