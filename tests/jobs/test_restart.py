"""Whole-job restart by rabit-run from durable checkpoints: the job fails as a
whole (in-job recovery off, or every rank killed), rabit-run starts it again,
it resumes from the newest complete version on disk and ends with the same
models as a failure-free run."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

from rabit_py.engine._store import write_file

from .._proc import ROOT, _kill_tree, run
from .._planted import Planted

PROGRAM = [sys.executable, "tests/programs/bsp_train.py"]
RANKS = 4


def launcher(*options):
    return [sys.executable, "-m", "rabit_py.launcher", "-n", str(RANKS), *options, "--",
            *PROGRAM]


def parse(out, tag):
    return [json.loads(line[len(tag) + 1:]) for line in out.splitlines()
            if line.startswith(tag + " ")]


@pytest.fixture(scope="module")
def reference():
    code, out = run(launcher(), timeout=120, env={"RABIT_ENGINE": "robust"})
    assert code == 0, out
    return {r["rank"]: r for r in parse(out, "RESULT")}


def assert_same_models(out, reference):
    results = parse(out, "RESULT")
    assert sorted(r["rank"] for r in results) == list(range(RANKS)), out[-6000:]
    for r in results:
        ref = reference[r["rank"]]
        assert (r["model"], r["local"], r["version"]) == \
            (ref["model"], ref["local"], ref["version"]), f"rank {r['rank']} differs"


def test_a_fault_with_recovery_off_restarts_the_job_from_disk(reference, tmp_path):
    code, out = run(launcher("--max-restarts", "2", "--restart-delay", "0.2",
                             "--checkpoint-dir", str(tmp_path)), timeout=240,
                    env={"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,3,1,0",
                         "RABIT_MAX_RECOVERIES": "0", "RABIT_TIMEOUT": "45"})
    assert code == 0, out[-6000:]
    assert "rabit-run: the job failed" in out and "restart 1 of 2" in out, out[-6000:]
    assert "rabit-run: 2 attempts" in out
    assert len(parse(out, "START")) == 2 * RANKS
    assert "resumed from durable checkpoint version" in out, out[-6000:]
    assert_same_models(out, reference)
    # Only the newest complete versions stay on disk (RABIT_KEEP_CHECKPOINTS=2),
    # and the files of one pruned version, kept for reuse.
    names = [f"v0000000{v}.{n}" for v in (5, 6)
             for n in [f"MANIFEST.f2.w{RANKS}.local", "global.ckpt"]
             + [f"local-{r}.ckpt" for r in range(RANKS)]]
    assert sorted(os.listdir(tmp_path)) == [".recycle"] + sorted(names)
    assert sorted(os.listdir(tmp_path / ".recycle")) == \
        ["global.ckpt"] + [f"local-{r}.ckpt" for r in range(RANKS)]


def test_every_rank_killed_from_outside_resumes_from_disk(reference, tmp_path):
    proc = subprocess.Popen(launcher("--max-restarts", "1", "--restart-delay", "0.2",
                                     "--checkpoint-dir", str(tmp_path)) + ["--sleep", "0.4"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, "RABIT_ENGINE": "robust"})
    lines = []
    try:
        deadline = time.monotonic() + 120
        pids = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("START "):
                pids.append(json.loads(line[6:])["pid"])
            if line.startswith("ROUND 2 done"):
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "".join(lines)
        out, _ = proc.communicate(timeout=180)
    finally:
        _kill_tree(proc.pid)
    out = "".join(lines) + out
    assert proc.returncode == 0, out[-6000:]
    assert "restart 1 of 1" in out and "resumed from durable checkpoint version" in out
    assert_same_models(out, reference)


@pytest.mark.parametrize("seqno,where", [(1, "load_checkpoint"), (0, "config broadcast")])
def test_a_rank_lost_before_the_disk_resume_still_resumes_from_disk(reference, tmp_path,
                                                                     seqno, where):
    # Attempt 0: rank 1 and its replica holder die together (the local model
    # is lost): a restart. Attempt 1: rank 1 dies at its first
    # load_checkpoint (seqno 1) or at the config broadcast before it (seqno
    # 0), before the ranks resumed from disk. Recovered in place, the job
    # started over from version 0 beside the newer versions on disk; now the
    # replacement resumes from disk with the survivors (Note [fresh start
    # with a store]).
    code, out = run(launcher("--max-restarts", "2", "--restart-delay", "0.1",
                             "--checkpoint-dir", str(tmp_path)) + ["--sleep", "0.1"],
                    timeout=240, env={"RABIT_ENGINE": "mock",
                                      "RABIT_MOCK": f"1,3,1,0;2,3,1,0;1,0,{seqno},1",
                                      "RABIT_TIMEOUT": "45"})
    assert code == 0, out[-6000:]
    assert "rabit-run: 2 attempts" in out, out[-6000:]
    assert "1 in-job recovery (1 process replaced)" in out, out[-6000:]
    resumed = [line for line in out.splitlines() if "resumed from durable checkpoint" in line]
    assert len(resumed) == RANKS, out[-6000:]     # all four, the replacement too
    assert_same_models(out, reference)


def test_used_up_restarts_end_with_a_clear_message(tmp_path):
    # A fault in every attempt (a restart counts as a life of the mock plan),
    # one call after a checkpoint: under load the rank's writer may still be
    # behind, so the versions on disk may be unfinished (Note [unfinished
    # versions]): the restart then starts from the beginning (was: "no
    # version can be loaded", taken for a bug, in 2 of 9 runs under load).
    code, out = run(launcher("--max-restarts", "1", "--restart-delay", "0.1",
                             "--checkpoint-dir", str(tmp_path)),
                    timeout=240, env={"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,2,1,0;1,3,1,1",
                                      "RABIT_MAX_RECOVERIES": "0", "RABIT_TIMEOUT": "45"})
    assert code != 0
    assert "1 restart(s) are used up; giving up" in out, out[-6000:]
    assert "rabit-run: 2 attempts" in out
    assert parse(out, "RESULT") == []


def test_a_bug_is_not_restarted(tmp_path):
    # An uncaught exception is a bug: a restart would raise it again.
    code, out = run(launcher("--max-restarts", "3", "--restart-delay", "0.1",
                             "--checkpoint-dir", str(tmp_path)) + ["--raise-at", "2"],
                    timeout=240, env={"RABIT_ENGINE": "robust"})
    assert code != 0
    assert ("the job failed: RuntimeError on rank 1: a bug in round 2 on rank 1. A bug in the "
            "program, which a restart would repeat: not restarting it" in out), out[-6000:]
    assert "restart 1 of 3" not in out
    assert len(parse(out, "START")) == RANKS


def test_dry_run_shows_the_command_without_rabit_run_options():
    code, out = run(launcher("--max-restarts", "3", "--checkpoint-dir", "/tmp/x", "--dry-run"),
                    timeout=30)
    assert code == 0
    command = next(line for line in out.splitlines() if "bsp_train.py" in line)
    assert "--max-restarts" not in command and "--checkpoint-dir" not in command
    assert "# restarts: up to 3 after a failure" in out and "RABIT_CHECKPOINT_DIR=/tmp/x" in out


def test_a_replacement_gets_the_settings_that_do_not_fit_in_its_environment(reference,
                                                                             tmp_path):
    # A checkpoint path longer than an MPI info value (255): passing it in
    # the spawn's environment made every spawn fail (MPI_ERR_INFO_VALUE, 10
    # repair attempts, then a restart). The replacement now gets the job's
    # settings with the join state and writes its durable files there.
    folder = tmp_path / ("d" * 120) / ("e" * 120)
    code, out = run(launcher("--checkpoint-dir", str(folder)), timeout=240,
                    env={"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,2,1,0", "RABIT_TIMEOUT": "45"})
    assert code == 0, out[-6000:]
    assert "replaced rank(s) [1]" in out and "could not repair" not in out, out[-6000:]
    assert "1 in-job recovery (1 process replaced)" in out
    assert_same_models(out, reference)
    assert (folder / "v00000006.local-1.ckpt").exists(), sorted(os.listdir(folder))


# ---------------------------------------------------------------- checkpoints are data
def test_a_planted_checkpoint_runs_nothing_and_is_refused_on_every_rank(tmp_path):
    folder, marker = tmp_path / "ckpt", tmp_path / "PLANTED-RAN"
    code, out = run(launcher("--checkpoint-dir", str(folder)), timeout=120,
                    env={"RABIT_ENGINE": "robust"})
    assert code == 0, out[-6000:]
    newest = sorted(folder.glob("v*.global.ckpt"))[-1]
    version = int(newest.name[1:9])
    write_file(str(newest), pickle.dumps(Planted(marker)), RANKS, version)
    code, out = run(launcher("--checkpoint-dir", str(folder), "--max-restarts", "2"),
                    timeout=120, env={"RABIT_ENGINE": "robust"})
    assert code != 0, out[-6000:]
    assert not marker.exists(), out[-6000:]
    assert f"the global model of checkpoint version {version} in {folder} names " \
           f"{os.system.__module__}.system, which is not data" in out, out[-6000:]
    assert "RABIT_TRUST_CHECKPOINTS=1" in out and "RESULT" not in out, out[-6000:]
    # said once (rank 0 for every rank), and not restarted: it would fail again
    assert out.count("CheckpointError (every rank): the global model") == 1, out[-6000:]
    assert "not restarting it" in out and "restart 1 of 2" not in out, out[-6000:]


def test_a_class_of_the_program_loads_only_when_allowed(tmp_path):
    folder = tmp_path / "ckpt"
    program = [sys.executable, "tests/programs/custom_model.py"]

    def job(rounds, **env):
        return run([sys.executable, "-m", "rabit_py.launcher", "-n", "2", "--checkpoint-dir",
                    str(folder), "--", *program, "--rounds", str(rounds)], timeout=120,
                   env={"RABIT_ENGINE": "robust", **env})

    code, out = job(2)
    assert code == 0 and "RESUMED 0 0" in out and "RESULT 2 2" in out, out[-6000:]
    code, out = job(3)
    assert code != 0, out[-6000:]
    assert "names __main__.Model, which is not data" in out, out[-6000:]
    assert "RABIT_CHECKPOINT_CLASSES=__main__.Model" in out, out[-6000:]
    code, out = job(3, RABIT_CHECKPOINT_CLASSES="__main__.Model")
    assert code == 0 and "RESUMED 2 2" in out and "RESULT 3 3" in out, out[-6000:]
    code, out = job(4, RABIT_TRUST_CHECKPOINTS="1")
    assert code == 0 and "RESUMED 3 3" in out and "RESULT 4 4" in out, out[-6000:]
