"""Note [kept booster] in rabit_py/xgboost/_rounds.py: where the parameters
draw no random numbers, the booster of one interval trains the next as it
is, and the model is the bytes a rebuild at every interval gives, and what
one ``xgboost.train`` call grows; with sampling, every interval is rebuilt."""

import numpy as np
import pytest

xgboost = pytest.importorskip("xgboost")

from rabit_py.xgboost._rounds import Interval, initial_state  # noqa: E402

PARAMS = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": 4, "eta": 0.3,
          "nthread": 1, "seed": 3}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 6))
    y = (X[:, 0] + X[:, 1] * X[:, 2] + 0.3 * rng.standard_normal(3000) > 0).astype(float)
    return xgboost.DMatrix(X, label=y), X


@pytest.mark.parametrize("params,keeps", [
    ({}, True),
    ({"subsample": 1.0, "colsample_bytree": 1}, True),
    ({"subsample": 0.8}, False),
    ({"colsample_bynode": 0.5}, False),
    ({"colsample_bylevel": 0.9}, False),
    ({"booster": "dart"}, False),
    ({"booster": "gblinear"}, False),
])
def test_only_parameters_without_sampling_keep_the_booster(params, keeps):
    interval = Interval({**PARAMS, **params}, 10, 2, None, None, 3)
    assert interval.keeps_booster is keeps


def _train(interval, dtrain, keep):
    state, kept, kept_ids = initial_state([]), None, []
    while not state.finished(interval.num_boost_round):
        state, booster = interval.run(state, dtrain, [], kept if keep else None)
        kept_ids.append(None if booster is None else id(booster))
        kept = booster
    return state, kept_ids


def test_a_kept_booster_gives_the_bytes_of_a_rebuilt_one_and_of_xgboost_train(data):
    dtrain, X = data
    interval = Interval(PARAMS, 9, 2, None, None, PARAMS["seed"])
    kept_state, ids = _train(interval, dtrain, keep=True)
    rebuilt_state, _ = _train(interval, dtrain, keep=False)
    assert len(set(ids)) == 1 and ids[0] is not None     # one booster, all five intervals
    assert kept_state.next_round == rebuilt_state.next_round == 9
    assert kept_state.model == rebuilt_state.model
    plain = xgboost.train(PARAMS, dtrain, 9)
    ours = interval.finish(kept_state)
    dx = xgboost.DMatrix(X)
    assert ours.predict(dx).tobytes() == plain.predict(dx).tobytes()
    assert ours.get_dump() == plain.get_dump()


def test_with_sampling_every_interval_is_rebuilt(data):
    dtrain, _ = data
    interval = Interval({**PARAMS, "subsample": 0.7}, 6, 2, None, None, PARAMS["seed"])
    state, ids = _train(interval, dtrain, keep=True)
    assert ids == [None, None, None]
    again, _ = _train(interval, dtrain, keep=False)
    assert state.model == again.model       # the same model, rebuilt either way


def test_a_booster_of_another_round_is_not_trained_on(data):
    dtrain, _ = data
    interval = Interval(PARAMS, 6, 2, None, None, PARAMS["seed"])
    first, kept = interval.run(initial_state([]), dtrain, [])
    second, _ = interval.run(first, dtrain, [], kept)
    # An older state (as after a failed attempt) with the newer booster: rebuilt.
    again, booster = interval.run(first, dtrain, [], kept)
    assert booster is not kept and again.model == second.model
