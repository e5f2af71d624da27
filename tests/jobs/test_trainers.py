"""The trainers on real ranks: the same GBDT model (bit for bit) for 1, 2 and
4 workers, linear and k-means within floating tolerance, quality against
scikit-learn, in-job recovery giving the failure-free model, the CLIs, and
bad data reported on every rank."""

import json
import sys

import numpy as np
import pytest

from trainers import gbdt
from trainers.gbdt import _auc, _metric

from .._proc import ROOT, rabit_run, run

sys.path.insert(0, str(ROOT / "tests" / "programs"))
import train_models as programs  # noqa: E402

PROGRAM = [sys.executable, "tests/programs/train_models.py"]
GBDT_NAMES = ("gbdt_binary", "gbdt_regression", "gbdt_multiclass", "gbdt_early_stop")


def read(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every trainer at world sizes 1 (no mpirun), 2 and 4: {size: out dir}."""
    out = {}
    for size in (1, 2, 4):
        folder = tmp_path_factory.mktemp(f"world{size}")
        cmd = PROGRAM + [str(folder)] if size == 1 else rabit_run(size, *PROGRAM, str(folder))
        code, text = run(cmd, timeout=240)
        assert code == 0, text[-6000:]
        for name in programs.NAMES:
            assert f"DONE {name} same on every rank" in text, text[-6000:]
        out[size] = folder
    return out


@pytest.mark.parametrize("name", GBDT_NAMES)
def test_gbdt_is_the_same_model_for_any_world_size(runs, name):
    models = [(runs[size] / f"{name}.json").read_bytes() for size in (1, 2, 4)]
    assert models[0] == models[1] == models[2]
    assert len(read(runs[1] / f"{name}.json")["trees"]) > 0


def test_linear_and_kmeans_agree_across_world_sizes(runs):
    lin = [read(runs[s] / "linear.json") for s in (1, 2, 4)]
    km = [read(runs[s] / "kmeans.json") for s in (1, 2, 4)]
    for other in lin[1:]:
        assert other["objective"] == pytest.approx(lin[0]["objective"], rel=1e-9)
        np.testing.assert_allclose(other["coef"], lin[0]["coef"], rtol=1e-4, atol=1e-6)
    for other in km[1:]:
        assert other["init"] == km[0]["init"]        # exact k-means++ draws
        assert other["inertia"] == pytest.approx(km[0]["inertia"], rel=1e-9)
        np.testing.assert_allclose(other["centers"], km[0]["centers"], rtol=1e-9)


def test_mlp_matches_the_single_process_run(runs):
    # The 1-rank run is the single process; 2 and 4 ranks see the same global
    # batches, so only the summation order of the gradients differs.
    ref = read(runs[1] / "mlp.json")
    for size in (2, 4):
        other = read(runs[size] / "mlp.json")
        for a, b in zip(other["params"], ref["params"]):
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-10)
    assert ref["loss"] < 0.66                # it learned something (chance: 0.693)
    from trainers.mlp import MLPClassifier

    X, y = programs.linear_data()
    model = MLPClassifier([16, 8], 2)       # fitted attributes set by hand, as when loading
    model.params_ = [np.array(p) for p in ref["params"]]
    model.classes_, model.n_features_in_ = np.arange(2), X.shape[1]
    assert np.mean(model.predict(X) == y) > 0.6


def test_gbdt_metrics_match_predict_on_raw_values(runs):
    # Training routes binned values; predict() routes raw values with the cut
    # thresholds: the validation metric logged in training must come out again.
    for name in GBDT_NAMES:
        booster = gbdt.Booster.load_model(str(runs[1] / f"{name}.json"))
        params, rounds, make = programs.GBDT_PARAMS[name]
        X, y = make()
        margin = booster.predict(X[-1000:], output_margin=True)
        margin = margin if margin.ndim == 2 else margin[:, None]
        logged = booster.evals_result["valid"]
        for metric, values in logged.items():
            assert len(values) == booster.num_boosted_rounds()
            assert _metric(metric, params["objective"], margin, y[-1000:]) == \
                pytest.approx(values[-1], rel=1e-12, abs=1e-12), (name, metric)


def test_gbdt_numpy_kernel_grows_the_same_model(runs, tmp_path):
    code, text = run(rabit_run(2, *PROGRAM, str(tmp_path), "--only", "gbdt_binary",
                               "--only", "gbdt_multiclass"), timeout=120,
                     env={"TRAIN_HIST_KERNEL": "numpy"})
    assert code == 0, text[-6000:]
    for name in ("gbdt_binary", "gbdt_multiclass"):
        assert (tmp_path / f"{name}.json").read_bytes() == (runs[2] / f"{name}.json").read_bytes()


def test_gbdt_early_stopping(runs):
    booster = gbdt.Booster.load_model(str(runs[1] / "gbdt_early_stop.json"))
    history = booster.evals_result["valid"]["logloss"]
    best = booster.best_iteration
    assert booster.num_boosted_rounds() == best + 4 < 60      # 3 rounds without progress
    assert booster.best_score == history[best] == min(history)
    assert all(v > history[best] for v in history[best + 1:])


def test_gbdt_quality_against_sklearn(runs):
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    X, y = programs.binary_data()
    ours = gbdt.Booster.load_model(str(runs[1] / "gbdt_binary.json"))
    ref = HistGradientBoostingClassifier(max_iter=12, learning_rate=0.3, max_depth=4,
                                         max_bins=64, l2_regularization=1.0,
                                         early_stopping=False, random_state=0)
    ref.fit(X[:-1000], y[:-1000])
    ours_auc = _auc(ours.predict(X[-1000:]), y[-1000:])
    ref_auc = _auc(ref.predict_proba(X[-1000:])[:, 1], y[-1000:])
    assert ours_auc > 0.7 and abs(ours_auc - ref_auc) < 0.02, (ours_auc, ref_auc)

    X, y = programs.regression_data()
    ours = gbdt.Booster.load_model(str(runs[1] / "gbdt_regression.json"))
    ref = HistGradientBoostingRegressor(max_iter=10, learning_rate=0.3, max_depth=3,
                                        l2_regularization=2.0, early_stopping=False)
    ref.fit(X[:-1000], y[:-1000])
    ours_rmse = np.sqrt(np.mean((ours.predict(X[-1000:]) - y[-1000:]) ** 2))
    ref_rmse = np.sqrt(np.mean((ref.predict(X[-1000:]) - y[-1000:]) ** 2))
    assert ours_rmse < 1.1 * ref_rmse and ours_rmse < 0.9 * y.std(), (ours_rmse, ref_rmse)

    X, y = programs.multiclass_data()
    ours = gbdt.Booster.load_model(str(runs[1] / "gbdt_multiclass.json"))
    proba = ours.predict(X[-1000:])
    assert proba.shape == (1000, 10)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert np.mean(proba.argmax(axis=1) == y[-1000:]) > 0.8


def test_linear_matches_sklearn(runs):
    from sklearn.linear_model import LogisticRegression

    X, y = programs.linear_data()
    ours = read(runs[1] / "linear.json")
    ref = LogisticRegression(C=0.5, tol=1e-12, max_iter=5000).fit(X, y)

    def objective(coef, intercept):
        z = X @ np.asarray(coef) + intercept
        return 0.5 * np.logaddexp(0, -(2 * y - 1) * z).sum() + 0.5 * np.dot(coef, coef)

    ref_objective = objective(ref.coef_[0], ref.intercept_[0])
    assert ours["objective"] == pytest.approx(objective(ours["coef"][0], ours["intercept"][0]),
                                              rel=1e-12)
    assert abs(ours["objective"] - ref_objective) <= 1e-6 * ref_objective
    np.testing.assert_allclose(ours["coef"][0], ref.coef_[0], atol=1e-3)


def test_kmeans_matches_sklearn_from_the_same_start(runs):
    from sklearn.cluster import KMeans

    ours = read(runs[1] / "kmeans.json")
    ref = KMeans(6, init=np.array(ours["init"]), n_init=1, tol=1e-4).fit(programs.blobs())
    assert ours["inertia"] == pytest.approx(ref.inertia_, rel=1e-3)


# ---------------------------------------------------------------- recovery
RECOVERY = {
    # name: (trainer, RABIT_MOCK plan, ranks killed)
    # rank 1 inside a round, then rank 0 (one run for both: CI time)
    "gbdt_in_a_round_then_rank0": ("gbdt_binary", "1,3,2,0;0,6,0,0", {0, 1}),
    "gbdt_during_start_up": ("gbdt_binary", "2,0,3,0", {2}),
    "linear": ("linear", "3,8,1,0", {3}),
    "kmeans": ("kmeans", "1,2,0,0", {1}),
    # mid-step: the bucketer's allreduce on its thread is the call that is cut
    "mlp": ("mlp", "2,3,4,0", {2}),
}


@pytest.mark.parametrize("case", list(RECOVERY))
def test_a_killed_worker_is_replaced_and_the_model_is_unchanged(runs, tmp_path, case):
    name, plan, killed = RECOVERY[case]
    code, text = run(rabit_run(4, *PROGRAM, str(tmp_path), "--only", name), timeout=240,
                     env={"RABIT_ENGINE": "mock", "RABIT_MOCK": plan, "RABIT_TIMEOUT": "60"})
    assert code == 0, text[-6000:]
    starts = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("START ")]
    assert {s["rank"] for s in starts if s["trial"] >= 1} == killed, text[-6000:]
    assert (tmp_path / f"{name}.json").read_bytes() == (runs[4] / f"{name}.json").read_bytes()


# ---------------------------------------------------------------- CLIs and bad data
def test_gbdt_cli_trains_and_saves_a_model(tmp_path):
    X, y = programs.binary_data(3000)
    np.save(tmp_path / "train.npy", np.column_stack([y, X]))
    out = tmp_path / "model.json"
    code, text = run(rabit_run(2, sys.executable, "-m", "trainers.gbdt",
                               "--train", str(tmp_path / "train.npy"), "--rounds", "5",
                               "--param", "objective=binary:logistic", "--param", "max_depth=3",
                               "--out", str(out)), timeout=120)
    assert code == 0, text[-6000:]
    assert "trained 5 rounds on 2 rank(s)" in text
    booster = gbdt.Booster.load_model(str(out))
    assert booster.num_boosted_rounds() == 5
    assert _auc(booster.predict(X), y) > 0.7


def test_one_file_per_rank_gives_the_same_model_as_row_ranges(tmp_path):
    X, y = programs.binary_data(3000)
    table = np.column_stack([y, X])
    np.save(tmp_path / "all.npy", table)
    np.save(tmp_path / "part-0.npy", table[:1500])
    np.save(tmp_path / "part-1.npy", table[1500:])
    for source, model in (("all.npy", "a.json"), ("part-{rank}.npy", "b.json")):
        code, text = run(rabit_run(2, sys.executable, "-m", "trainers.gbdt", "--train",
                                   str(tmp_path / source), "--rounds", "3", "--quiet",
                                   "--out", str(tmp_path / model)), timeout=120)
        assert code == 0, text[-6000:]
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_nan_for_linear_and_an_empty_shard_are_clear_errors(tmp_path):
    X, y = programs.linear_data(200)
    X[150, 2] = np.nan                 # in rank 1's half
    np.save(tmp_path / "nan.npy", np.column_stack([y, X]))
    code, text = run(rabit_run(2, sys.executable, "-m", "trainers.linear", "--train",
                               str(tmp_path / "nan.npy")), timeout=120)
    assert code != 0
    # scikit-learn's own check finds it on rank 1 (Input X contains NaN);
    # the other rank is told which rank's data is bad.
    assert "DataError: rank 1: Input X contains NaN" in text, text[-6000:]
    np.save(tmp_path / "tiny.npy", np.column_stack([y, X])[:3])
    code, text = run(rabit_run(4, sys.executable, "-m", "trainers.kmeans", "--train",
                               str(tmp_path / "tiny.npy")), timeout=120)
    assert code != 0
    assert "this rank's shard is empty" in text and "DataError: rank 0:" in text, text[-6000:]


def test_linear_and_kmeans_clis(tmp_path):
    from sklearn.datasets import dump_svmlight_file

    X, y = programs.linear_data(2000)
    dump_svmlight_file(X, y, str(tmp_path / "train.svm"))
    code, text = run(rabit_run(2, sys.executable, "-m", "trainers.linear", "--train",
                               str(tmp_path / "train.svm"), "--out", str(tmp_path / "lin.json"),
                               "--quiet"), timeout=120)
    assert code == 0, text[-6000:]
    assert len(read(tmp_path / "lin.json")["coef"][0]) == X.shape[1]
    np.savetxt(tmp_path / "blobs.csv", programs.blobs(3000), delimiter=",",
               header="a,b,c,d,e", comments="")
    code, text = run(rabit_run(2, sys.executable, "-m", "trainers.kmeans", "--train",
                               str(tmp_path / "blobs.csv"), "--clusters", "6", "--quiet",
                               "--out", str(tmp_path / "km.json")), timeout=120)
    assert code == 0, text[-6000:]
    assert np.array(read(tmp_path / "km.json")["centers"]).shape == (6, 5)


def test_bad_labels_on_one_rank_stop_every_rank(tmp_path):
    X, y = programs.binary_data(1000)
    y[700] = 3.0                       # in rank 1's half
    np.save(tmp_path / "train.npy", np.column_stack([y, X]))
    code, text = run(rabit_run(2, sys.executable, "-m", "trainers.gbdt", "--train",
                               str(tmp_path / "train.npy"), "--param",
                               "objective=binary:logistic"), timeout=120)
    assert code != 0
    assert text.count("DataError: rank 1: binary labels must be 0 or 1, found [3.0]") == 2, \
        text[-6000:]


def test_ragged_csv_is_a_clear_error(tmp_path):
    (tmp_path / "bad.csv").write_text("1,2,3\n0,4\n")
    code, text = run([sys.executable, "-m", "trainers.gbdt", "--train", str(tmp_path / "bad.csv")],
                     timeout=60)
    assert code != 0
    assert "DataError: rank 0: cannot read" in text and "bad.csv as csv" in text, text[-3000:]


def test_bad_parameters_are_refused_before_training():
    with pytest.raises(ValueError, match="unknown GBDT parameter 'max_dept'"):
        gbdt.train({"max_dept": 3}, np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="multi:softprob needs num_class"):
        gbdt.train({"objective": "multi:softprob"}, np.zeros((2, 2)), np.zeros(2))


def test_a_second_training_on_other_data_of_the_same_shape_does_not_resume_the_first():
    # The checkpoint belongs to the job: a second training whose resume key
    # matched the first's (same shapes and settings, e.g. cross-validation
    # folds) took over its finished state. The key now has a checksum of the
    # data, so fitting B, then A, then B again gives B's model both times.
    program = (
        "import json, numpy as np, rabit_py as r\n"
        "from trainers import linear, kmeans, gbdt\n"
        "rng = np.random.default_rng(0)\n"
        "A, B = rng.normal(size=(200, 4)), rng.normal(size=(200, 4)) + 1.0\n"
        "ya, yb = (A[:, 0] > 0).astype(float), (B[:, 1] > 1).astype(float)\n"
        "out = {}\n"
        "for name, fit in [\n"
        "    ('linear', lambda X, y: linear.LogisticRegression(max_iter=30).fit(X, y)"
        ".coef_.tolist()),\n"
        "    ('kmeans', lambda X, y: kmeans.KMeans(n_clusters=3, max_iter=20).fit(X)"
        ".cluster_centers_.tolist()),\n"
        "    ('gbdt', lambda X, y: gbdt.train({'objective': 'binary:logistic', 'max_depth': 3},"
        " X, y, num_boost_round=3, verbose_eval=False).predict(X).tolist())]:\n"
        "    out[name] = [fit(B, yb), fit(A, ya), fit(B, yb)]\n"
        "print('FITS ' + json.dumps(out), flush=True)\n")
    code, text = run([sys.executable, "-c", program], timeout=240)
    assert code == 0, text[-4000:]
    fits = json.loads(next(x for x in text.splitlines() if x.startswith("FITS "))[5:])
    for name, (first_b, a, second_b) in fits.items():
        assert first_b == second_b, name
        assert a != first_b, name


def test_the_estimators_pass_scikit_learns_own_checks():
    # sklearn.utils.estimator_checks.check_estimator (the installed
    # scikit-learn's), at world size 1, no check marked expected to fail;
    # small settings (few rounds/steps) keep the ~50 fits each quick.
    code, text = run([sys.executable, "tests/programs/sklearn_checks.py"], timeout=300)
    assert code == 0, text[-4000:]
    checks = json.loads(next(x for x in text.splitlines() if x.startswith("CHECKS "))[7:])
    assert sorted(checks) == ["GBDTClassifier", "GBDTRegressor", "KMeans", "LogisticRegression",
                              "MLPClassifier"]
    for name, result in checks.items():
        assert result["failed"] == {}, (name, result["failed"])
        assert result["passed"] >= 40, (name, result)
