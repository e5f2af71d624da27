"""scikit-learn's own check_estimator on the trainers' estimators, at world
size 1: prints CHECKS {estimator: {"passed": n, "failed": {check: error},
"skipped": n}} (JSON)."""

import json
import sys
import warnings

from sklearn.utils.estimator_checks import check_estimator

from trainers.gbdt_sklearn import GBDTClassifier, GBDTRegressor
from trainers.kmeans import KMeans
from trainers.linear import LogisticRegression
from trainers.mlp import MLPClassifier

# Small settings so that the ~50 fits of each check run take seconds.
ESTIMATORS = {"KMeans": lambda: KMeans(n_clusters=3, max_iter=30),
              "LogisticRegression": lambda: LogisticRegression(max_iter=50),
              "MLPClassifier": lambda: MLPClassifier(hidden=(16,), steps=100, batch_size=64,
                                                     learning_rate=0.01),
              "GBDTClassifier": lambda: GBDTClassifier(n_estimators=10, max_depth=3),
              "GBDTRegressor": lambda: GBDTRegressor(n_estimators=10, max_depth=3)}


def main(names):
    out = {}
    for name in names or ESTIMATORS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = check_estimator(ESTIMATORS[name](), on_fail=None, on_skip=None)
        summary = {"passed": 0, "failed": {}, "skipped": 0}
        for r in results:
            if r["status"] == "passed":
                summary["passed"] += 1
            elif r["status"] == "skipped":
                summary["skipped"] += 1
            else:
                summary["failed"][r["check_name"]] = repr(r["exception"])[:400]
        out[name] = summary
    print("CHECKS " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
