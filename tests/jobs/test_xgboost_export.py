"""Our GBDT's model in XGBoost's JSON format (trainers/_xgboost_format.py):
XGBoost loads it and predicts what we predict, for the three objectives, on
rows with missing values."""

import json
import sys

import pytest

from .._proc import run

pytest.importorskip("xgboost")


def test_xgboost_loads_our_models_and_predicts_the_same():
    code, out = run([sys.executable, "tests/programs/xgboost_export.py"], timeout=240)
    assert code == 0, out[-4000:]
    line = next(x for x in out.splitlines() if x.startswith("EXPORT "))
    diffs = json.loads(line[7:])
    assert sorted(diffs) == ["binary:logistic", "multi:softprob", "reg:squarederror"]
    for objective, d in diffs.items():
        assert d["rounds"] == 8, objective
        # XGBoost keeps thresholds and leaves in float32 (Note [xgboost json]).
        assert d["predict"] <= 1e-6, (objective, d)
        assert d["to_xgboost"] <= 1e-6, (objective, d)
        assert d["margin"] <= 1e-6, (objective, d)
