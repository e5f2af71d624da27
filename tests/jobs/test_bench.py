"""The benchmark script runs and writes complete figures (no timing asserted)."""

import json
import sys

import pytest

from .._proc import debris, rabit_run, run


@pytest.fixture(autouse=True)
def leaves_nothing():
    """Every benchmark leaves no Open MPI session folder or /dev/shm segment."""
    before = debris()
    yield
    assert debris() - before == set()


def test_bench_collectives_writes_every_contender(tmp_path):
    out_json = tmp_path / "bench.json"
    code, out = run(rabit_run(2, sys.executable, "scripts/bench_collectives.py",
                              "--max-bytes", "512", "--batches", "2", "--no-xgboost",
                              "--json", str(out_json)), timeout=180)
    assert code == 0, out
    assert "allreduce float32 SUM, 2 ranks" in out and "broadcast float32, 2 ranks" in out
    # Tables a terminal can show (they were 423 characters wide).
    assert max(len(line) for line in out.splitlines()) <= 110, out
    result = json.loads(out_json.read_text())
    assert result["ranks"] == 2
    assert [row["bytes"] for row in result["rows"]] == [8, 64, 512]
    names = set(result["contenders"])
    assert {"mpi4py Allreduce in-place", "rabit allreduce check=off",
            "rabit allreduce check=on", "mpi4py Bcast", "rabit broadcast check=off"} <= names
    for row in result["rows"]:
        assert set(row["seconds"]) == names
        assert all(len(s) == 2 and min(s) > 0 for s in row["seconds"].values())


def test_bench_trainers_runs_every_comparison(tmp_path):
    out_json = tmp_path / "trainers.json"
    code, out = run([sys.executable, "scripts/bench_trainers.py", "--rows", "4000", "--rounds",
                     "3", "--json", str(out_json)], timeout=300)
    assert code == 0, out
    result = json.loads(out_json.read_text())
    runs = result["gbdt"]
    assert {"rabit_py 1 rank", "rabit_py 2 ranks"} <= set(runs)
    assert runs["rabit_py 1 rank"]["auc"] == runs["rabit_py 2 ranks"]["auc"] > 0.6
    assert result["ratios"]["speed-up 2 ranks vs 1 (steady)"] > 0
    for row in runs.values():           # both fits of each run, side by side
        assert row["first"] > 0 and row["steady"] > 0
    small = result["small"]
    assert small["breast_cancer"]["ours"] > 0.95 and small["digits"]["ours"] > 0.85
    assert abs(small["logistic"]["relative difference"]) < 1e-6
    assert abs(small["kmeans"]["relative difference"]) < 1e-3


def test_bench_xgboost_compares_with_plain_xgboost(tmp_path):
    pytest.importorskip("xgboost")
    out_json = tmp_path / "xgb.json"
    code, out = run([sys.executable, "scripts/bench_xgboost.py", "--ranks", "2", "--rows",
                     "4000", "--rounds", "6", "--every", "1,4", "--repeats", "2", "--json",
                     str(out_json)], timeout=300)
    assert code == 0, out
    summary = json.loads(out_json.read_text())["jobs"]["2"]["summary"]
    assert set(summary) == {"xgboost.train", "rabit_py every 1", "rabit_py every 4"}
    for name, row in summary.items():
        # No sampling: ours grows XGBoost's trees (Note [kept booster]).
        assert row["same_predictions"] is True, (name, out)
        assert 0 < row["min"] <= row["median"] <= row["max"]
    assert summary["rabit_py every 4"]["lost_per_failure_s"] > 0
    assert summary["rabit_py every 1"]["lost_per_failure_s"] == 0
    assert "vs xgboost" in out


def test_make_data_writes_shards_that_join_up(tmp_path):
    import numpy as np

    from trainers.data import make_higgs_like

    code, out = run([sys.executable, "scripts/make_data.py", "higgs", "--rows", "1000",
                     "--parts", "3", "--seed", "4", "--out", str(tmp_path / "p-{rank}.npy")],
                    timeout=120)
    assert code == 0, out
    parts = [np.load(tmp_path / f"p-{i}.npy") for i in range(3)]
    X, y = make_higgs_like(1000, seed=4)
    np.testing.assert_array_equal(np.vstack(parts), np.column_stack([y, X]))


def test_bench_overlap_times_every_mode(tmp_path):
    import importlib.util

    out_json = tmp_path / "overlap.json"
    plot = importlib.util.find_spec("matplotlib") is not None     # the "bench" extra
    code, out = run(rabit_run(2, sys.executable, "scripts/bench_overlap.py", "--layers", "3",
                              "--width", "64", "--batch", "16", "--steps", "2", "--bucket-mb",
                              "0.01", "--json", str(out_json),
                              *(["--plot", str(tmp_path / "overlap.png")] if plot else [])),
                    timeout=120)
    assert code == 0, out
    result = json.loads(out_json.read_text())
    assert set(result["median"]) == {"no communication", "reduce alone",
                                     "reduce after backward", "bucketed overlap"}
    assert all(len(t) == 2 and min(t) > 0 for t in result["seconds"].values())
    assert result["device"] == "cpu" and result["speedup"] > 0
    assert not plot or (tmp_path / "overlap.png").stat().st_size > 0


def test_bench_kvstore_times_every_mode(tmp_path):
    import importlib.util

    out_json = tmp_path / "kvstore.json"
    plot = importlib.util.find_spec("matplotlib") is not None     # the "bench" extra
    code, out = run(rabit_run(2, sys.executable, "scripts/bench_kvstore.py", "--arrays", "3",
                              "--sizes", "4096", "65536", "--steps", "2", "--json", str(out_json),
                              *(["--plot", str(tmp_path / "kv.png")] if plot else [])),
                    timeout=120)
    assert code == 0, out
    result = json.loads(out_json.read_text())
    assert result["ranks"] == 2 and [r["bytes"] for r in result["rows"]] == [4092, 65532]
    for row in result["rows"]:
        assert set(row["median"]) == {"mpi4py Allreduce each", "rabit allreduce each",
                                      "rabit allreduce flat", "kvstore pushpull",
                                      "kvstore pushpull+SGD"}
        assert all(len(t) == 2 and min(t) > 0 for t in row["seconds"].values())
        assert row["ratio pushpull / allreduce flat"] > 0
    assert not plot or (tmp_path / "kv.png").stat().st_size > 0


def test_bench_kvstore_compares_the_consistency_models(tmp_path):
    out_json = tmp_path / "consistency.json"
    code, out = run([sys.executable, "scripts/bench_kvstore.py", "--consistency", "--workers",
                     "3", "--servers", "2", "--updates", "30", "--repeats", "1", "--step-ms",
                     "1", "--staleness", "1", "--features", "50", "--json", str(out_json)],
                    timeout=300)
    assert code == 0, out
    assert "Consistency models: 3 workers, 2 server(s)" in out, out
    result = json.loads(out_json.read_text())
    assert result["workers"] == 3 and result["updates"] == 30
    rows = {(r["setting"], r["contender"]): r for r in result["rows"]}
    assert set(rows) == {(s, c) for s in ("alike", "slow", "jitter")
                         for c in ("BSP (dist_sync)", "SSP tau=1", "async",
                                   "async, replicas=1")}
    for (setting, contender), row in rows.items():
        assert len(row["seconds"]) == 1 and row["median"] > 0
        assert min(row["updates"]) >= 30              # ran to the updates, and a little past
        assert 0 < min(row["loss"]) < 0.6932          # below log 2: it learned something
        if contender.startswith("BSP"):
            assert row["speed_vs_bsp"] == 1.0


def test_bench_hotpath_compares_two_trees_for_every_setting(tmp_path):
    out_json = tmp_path / "hotpath.json"
    code, out = run([sys.executable, "scripts/bench_hotpath.py", "--before", "HEAD",
                     "--runs", "1", "--calls", "1000", "--json", str(out_json)], timeout=300)
    assert code == 0, out
    assert "small calls (8-byte allreduce and broadcast" in out, out
    result = json.loads(out_json.read_text())
    assert set(result["table"]) == {f"{call}, {setting}"
                                    for call in ("allreduce", "broadcast", "allgather")
                                    for setting in ("mpi check=off", "mpi check=on",
                                                    "robust check=off", "robust check=on")}
    for row in result["table"].values():
        assert 0 < row["raw"] and 0 < row["before"] and 0 < row["after"], row
    for setting, runs in result["runs"].items():
        assert [len(runs["before"]), len(runs["after"])] == [1, 1], setting


def test_bench_recovery_compares_the_steps_of_two_trees(tmp_path):
    out_json = tmp_path / "steps.json"
    code, out = run([sys.executable, "scripts/bench_recovery.py", "--before", "HEAD",
                     "--runs", "1", "--rounds", "6", "--load-rows", "0", "--elements", "64",
                     "--json", str(out_json)], timeout=300)
    assert code == 0, out
    assert "recovery of one killed rank, 4 ranks" in out, out
    result = json.loads(out_json.read_text())
    assert set(result["table"]) == {"spawned before", "spawned after", "spare before",
                                    "spare after"}
    for name, row in result["table"].items():
        median, low, high = row["kill_to_progress"]
        assert 0 < low <= median <= high, (name, row)
        assert row["detect"][0] > 0, (name, row)
    for name in ("before", "after"):
        assert [len(result["runs"][name][k]) for k in ("spawned", "spare")] == [1, 1]
        spawned = result["runs"][name]["spawned"][0]["steps"]
        assert spawned["spawn"] > 0 and spawned["merge"] > 0, spawned
