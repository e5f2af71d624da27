"""Note [missing-only child] in trainers/gbdt.py: a split may send every value
of a feature one way and its missing values the other, as XGBoost's hist does;
such a model predicts the same through our Booster, XGBoost's JSON and XGBoost."""

import json
import sys

import pytest

from .._proc import run

pytest.importorskip("xgboost")

PROGRAM = r'''
import json
import numpy as np
import xgboost as xgb
from trainers import gbdt

rng = np.random.default_rng(0)
n = 20000
y = (rng.random(n) < 0.5).astype(float)
X = rng.standard_normal((n, 3))
X[y == 1, 0] = np.nan                   # the label is "f0 is missing" ...
X[rng.random(n) < 0.1, 0] = np.nan      # ... up to 10% noise
params = {"eta": 1.0, "max_depth": 1, "seed": 0, "objective": "binary:logistic",
          "max_bin": 256}
ours = gbdt.train(params, X, y, 1, verbose_eval=False)
theirs = xgb.train({**params, "tree_method": "hist", "nthread": 1}, xgb.DMatrix(X, y), 1)
node = json.loads(theirs.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"][0]
exported = ours.to_xgboost()
dx = xgb.DMatrix(X)
print("RESULT " + json.dumps({
    "ours": [int(ours.trees[0]["feature"][0]), float(ours.trees[0]["threshold"][0]),
             bool(ours.trees[0]["default_left"][0])],
    "xgboost": [node["split_indices"][0], node["split_conditions"][0],
                bool(node["default_left"][0])],
    "xgboost_max_f0": float(np.nanmax(X[:, 0])),
    "ours_predict": ours.predict(X).tolist()[:50],
    "exported_predict": exported.predict(dx).tolist()[:50],
    "xgboost_predict": theirs.predict(dx).tolist()[:50],
    "missing": np.isnan(X[:50, 0]).tolist()}))
'''


def test_missing_values_get_a_child_of_their_own_as_in_xgboost():
    code, out = run([sys.executable, "-c", PROGRAM], timeout=240)
    assert code == 0, out[-4000:]
    r = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
    feature, threshold, default_left = r["ours"]
    assert (feature, threshold, default_left) == (0, float("inf"), False)
    # XGBoost makes the same split: above the largest value, missing right.
    assert r["xgboost"][0] == 0 and r["xgboost"][1] > r["xgboost_max_f0"]
    assert r["xgboost"][2] is False
    ours, exported, xgboost = r["ours_predict"], r["exported_predict"], r["xgboost_predict"]
    assert len(set(round(p, 5) for p in ours)) == 2          # one leaf per side
    for missing, a, b, c in zip(r["missing"], ours, exported, xgboost):
        assert a == pytest.approx(b, abs=1e-6)               # float32 in XGBoost's JSON
        assert a == pytest.approx(c, abs=1e-4)               # same tree, their leaf values
        assert (a > 0.5) == missing                          # missing -> the positive leaf
