"""Train our GBDT for each objective (world size 1 or under rabit-run), write
it in XGBoost's JSON format, load it with xgboost, and print the largest
difference between XGBoost's predictions and ours (probabilities, margins,
class probabilities) on rows with missing values: EXPORT {json}."""

import json
import sys
import tempfile

import numpy as np
import xgboost

import rabit_py as rabit
from trainers import gbdt


def data(objective, rows=600, features=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, features))
    X[rng.random(X.shape) < 0.15] = np.nan
    signal = np.nan_to_num(X[:, 0]) - 0.5 * np.nan_to_num(X[:, 1]) + 0.3 * rng.normal(size=rows)
    if objective == "binary:logistic":
        y = (signal > 0).astype(float)
    elif objective == "multi:softprob":
        y = np.digitize(signal, [-0.5, 0.5]).astype(float)
    else:
        y = 3.0 * signal + 1.0
    return X, y


def main():
    rabit.init()
    out = {}
    for objective in ("binary:logistic", "reg:squarederror", "multi:softprob"):
        X, y = data(objective)
        params = {"objective": objective, "max_depth": 4, "eta": 0.3}
        if objective == "multi:softprob":
            params["num_class"] = 3
        model = gbdt.train(params, X, y, num_boost_round=8, verbose_eval=False)
        Xt, _ = data(objective, rows=2000, seed=1)
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            model.save_model(f.name, format="xgboost")
            theirs = xgboost.Booster(model_file=f.name)
        direct = model.to_xgboost()
        dm = xgboost.DMatrix(Xt)
        diff = {
            "predict": float(np.abs(theirs.predict(dm) - model.predict(Xt)).max()),
            "margin": float(np.abs(theirs.predict(dm, output_margin=True)
                                   - model.predict(Xt, output_margin=True)).max()),
            "to_xgboost": float(np.abs(direct.predict(dm) - model.predict(Xt)).max()),
            "rounds": theirs.num_boosted_rounds(),
        }
        out[objective] = diff
    if rabit.get_rank() == 0:
        print("EXPORT " + json.dumps(out), flush=True)
    rabit.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
