"""The KVStore example (scripts/kvstore_sgd.py) on real ranks: one process and
four workers converge to the same weights; a worker killed mid-run (in-job
recovery) and a whole job killed with recovery off (rabit-run restart from
the durable checkpoint) end with the weights of a failure-free run, bit for
bit."""

import json
import sys

import pytest

from .._proc import rabit_run, run

# Tiny buckets: "w" and "b" are reduced in two buckets, two collectives a step.
PROGRAM = [sys.executable, "scripts/kvstore_sgd.py", "--steps", "200", "--bucket-mb", "1e-4"]


def weights(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """The failure-free four-worker run with a checkpoint every 10 steps."""
    out = tmp_path_factory.mktemp("reference") / "w.json"
    code, text = run(rabit_run(4, *PROGRAM, "--checkpoint-every", "10", "--out", str(out)),
                     timeout=120)
    assert code == 0, text[-6000:]
    return weights(out)


def test_one_process_and_four_workers_converge_to_the_same_weights(checkpointed, tmp_path):
    code, text = run(PROGRAM + ["--out", str(tmp_path / "one.json")], timeout=120)
    assert code == 0, text[-6000:]
    one = weights(tmp_path / "one.json")
    assert one["world_size"] == 1 and checkpointed["world_size"] == 4
    assert one["weights"] == pytest.approx(checkpointed["weights"], rel=1e-12, abs=1e-14)
    for figures in (one, checkpointed):
        assert figures["relative_distance_to_lstsq"] < 1e-4
        assert figures["loss"] == pytest.approx(figures["best_loss"], rel=1e-6)


def test_a_killed_worker_is_replaced_and_the_weights_are_unchanged(checkpointed, tmp_path):
    out = tmp_path / "w.json"
    code, text = run(rabit_run(4, *PROGRAM, "--checkpoint-every", "10", "--out", str(out)),
                     timeout=120, env={"RABIT_ENGINE": "mock", "RABIT_MOCK": "2,5,3,0;0,9,0,0",
                                       "RABIT_TIMEOUT": "60"})
    assert code == 0, text[-6000:]
    assert "rank 2 killed at version 5" in text and "rank 0 killed at version 9" in text
    assert text.count("replaced rank(s) [2]") == 3, text[-6000:]
    assert weights(out)["weights"] == checkpointed["weights"]


def test_a_restarted_job_resumes_from_the_durable_checkpoint(checkpointed, tmp_path):
    out = tmp_path / "w.json"
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", "4", "--max-restarts", "1",
           "--restart-delay", "0.1", "--checkpoint-dir", str(tmp_path / "ckpt"), "--",
           *PROGRAM, "--checkpoint-every", "10", "--out", str(out)]
    code, text = run(cmd, timeout=180, env={"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,7,0,0",
                                            "RABIT_MAX_RECOVERIES": "0", "RABIT_TIMEOUT": "45"})
    assert code == 0, text[-6000:]
    assert "restart 1 of 1" in text and "resumed from durable checkpoint version 7" in text, \
        text[-6000:]
    assert weights(out)["weights"] == checkpointed["weights"]


@pytest.mark.parametrize("kvtype", ["dist_async", "dist_ssp"])
def test_the_example_on_server_processes_reaches_the_least_squares_solution(tmp_path, kvtype):
    out = tmp_path / "w.json"
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", "4", "--servers", "2", "--",
           sys.executable, "scripts/kvstore_sgd.py", "--steps", "200", "--kvtype", kvtype,
           "--out", str(out)]
    code, text = run(cmd, timeout=120)
    assert code == 0, text[-6000:]
    figures = weights(out)
    assert figures["kvtype"] == kvtype and figures["world_size"] == 4
    assert figures["relative_distance_to_lstsq"] < 1e-3
    assert figures["loss"] == pytest.approx(figures["best_loss"], rel=1e-3)
