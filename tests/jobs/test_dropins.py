"""Existing programs switched by their import line: Rabit's API, XGBoost's
``xgboost.collective`` and mpi4py, run as real jobs (rabit-run, mpirun), with
values checked against the upstream behaviour and, for mpi4py, against
mpi4py itself; and each with a rank SIGKILLed from outside mid-run, bitwise
equal to the failure-free run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

import pytest

from rabit_py.launcher._command import find_mpirun

from .._proc import ROOT, _kill_tree, rabit_run, run

PROGRAMS = ROOT / "tests" / "programs"


def results(out: str, tag: str = "RESULT ") -> List[dict]:
    return [json.loads(line[len(tag):]) for line in out.splitlines() if line.startswith(tag)]


def rabit_results(out: str) -> Dict[str, List[dict]]:
    found: Dict[str, List[dict]] = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            _, scenario, payload = line.split(" ", 2)
            found.setdefault(scenario, []).append(json.loads(payload))
    return {k: sorted(v, key=lambda r: r["rank"]) for k, v in found.items()}


# ------------------------------------------------------------------ xgboost.collective
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_an_xgboost_collective_program_runs_unchanged(world):
    program = [sys.executable, str(PROGRAMS / "dropin_collective.py"), "--world", str(world)]
    cmd = program if world == 1 else rabit_run(world, *program)
    code, out = run(cmd, timeout=240)
    assert code == 0, out[-6000:]
    passes = [line.split()[1] for line in out.splitlines() if line.startswith("PASS ")]
    scenarios = ("outside", "communicator", "ops", "large", "broadcasts", "reuse",
                 "worker_port")
    assert sorted(passes) == sorted(list(scenarios) * world), out[-6000:]


# ------------------------------------------------------------------ Rabit
RABIT = [sys.executable, str(PROGRAMS / "dropin_rabit.py")]


@pytest.mark.parametrize("module", ["rabit_py", "rabit_py.rabit"])
def test_rabit_programs_run_unchanged(module):
    code, out = run(rabit_run(3, *RABIT, "--module", module, "basic", "broadcast", "lazy",
                              "semantics"), timeout=180)
    assert code == 0, out[-6000:]
    found = rabit_results(out)
    for r in found["basic"]:
        assert r["world"] == 3
        assert r["max"] == [4.0, 5.0, 1.5] and r["sum"] == [12.0, 15.0, 4.5], r
    for r in found["broadcast"]:
        assert r["s"] == [["9", "nine"], ["model", [0.5, 7]]], r
    for r in found["lazy"]:
        assert r["a"] == [6.0, 1.0, 0.0] and r["prepared"] == [r["rank"]], r
    sem = found["semantics"]
    assert [r["rank"] for r in sem] == [0, 1, 2]
    for r in sem:
        assert r["result"] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
        assert r["view_result"] == [6, 9, 12, 15]
        assert r["view_after"] == ([6, 9, 12, 15] if module == "rabit_py" else [2, 3, 4, 5])
    if module == "rabit_py":
        # rabit_py's own API: in place, the input's shape, rank 0 prints once.
        assert all(r["result_shape"] == [2, 3] and r["owned_shared"] for r in sem)
        assert out.count("hello from rank") == 1 and "hello from rank 0" in out
    else:
        # Rabit's: a 1-D result, in place only in an array that owns its
        # memory (Note [Rabit's semantics]), every rank's message printed.
        assert all(r["result_shape"] == [6] and r["owned_shared"] for r in sem)
        assert all(r["owned_after"] == r["result"] for r in sem)
        assert sorted(line for line in out.splitlines() if line.startswith("hello")) == \
            [f"hello from rank {i}" for i in range(3)]
        assert {r["host"] for r in sem} == {os.uname().nodename}


@pytest.mark.parametrize("module", ["rabit_py", "rabit_py.rabit"])
def test_rabit_mock_arguments_kill_and_recover(module):
    # Rabit's own fault-injection form: init(sys.argv, lib='mock') with mock=
    # arguments; ranks 1 and 2 die at different versions and come back.
    code, out = run(rabit_run(3, *RABIT, "--module", module, "recover", "mock=1,1,0,0",
                              "mock=2,2,1,0"), timeout=180)
    assert code == 0, out[-6000:]
    assert "rank 1 killed at version 1" in out and "rank 2 killed at version 2" in out, out
    found = rabit_results(out)["recover"]
    assert [r["rank"] for r in found] == [0, 1, 2]
    # As without kills (computed by hand: model <- sum over ranks of model / 2 +
    # local, local <- local + round + 1, from local = rank).
    assert all(r["model"] == [62.625] * 4 and r["version"] == 4 for r in found), found
    assert [r["local"] for r in found] == [[10.0 + r] * 4 for r in range(3)], found


def test_an_xgboost_rabit_program_runs_unchanged():
    code, out = run(rabit_run(3, *RABIT, "--module", "rabit_py.rabit", "xgboost_rabit"),
                    timeout=180)
    assert code == 0, out[-6000:]
    found = rabit_results(out)["xgboost_rabit"]
    assert [(r["world"], r["or"], r["distributed"]) for r in found] == [(3, 7, True)] * 3


# ------------------------------------------------------------------ mpi4py
@pytest.mark.parametrize("ranks", [1, 4])
def test_an_mpi4py_program_gives_what_mpi4py_gives(ranks):
    program = [sys.executable, str(PROGRAMS / "dropin_mpi4py.py")]
    mpirun = [find_mpirun(), "-n", str(ranks), "--oversubscribe"]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    code, real_out = run(mpirun + program + ["--real"], timeout=180)
    assert code == 0, real_out[-6000:]
    code, out = run(rabit_run(ranks, *program), timeout=180)
    assert code == 0, out[-6000:]
    real = sorted(results(real_out), key=lambda r: r["rank"])
    ours = sorted(results(out), key=lambda r: r["rank"])
    assert [r["rank"] for r in real] == list(range(ranks))
    for theirs, mine in zip(real, ours):
        differ = {k: (theirs[k], mine.get(k)) for k in theirs if theirs[k] != mine.get(k)}
        assert not differ, differ
    if ranks == 4:
        # The case that tells mpi4py's tree order from rank order.
        assert all(r["sum_cancel"] == "0.0" for r in ours)


def test_unprotected_mpi4py_calls_are_refused_by_name():
    code, out = run([sys.executable, "-c", (
        "import numpy as np\n"
        "from rabit_py.mpi4py import MPI\n"
        "import rabit_py\n"
        "comm = MPI.COMM_WORLD\n"
        "for call in (lambda: comm.Send(np.zeros(1), dest=0), lambda: comm.Split(0),\n"
        "             lambda: comm.Iallreduce(np.zeros(1), np.zeros(1)),\n"
        "             lambda: comm.Alltoall(np.zeros(1), np.zeros(1))):\n"
        "    try:\n"
        "        call()\n"
        "    except NotImplementedError as exc:\n"
        "        assert isinstance(exc, rabit_py.UnsupportedCallError)\n"
        "        print('REFUSED', exc)\n"
        "try:\n"
        "    comm.no_such_call\n"
        "except AttributeError as exc:\n"
        "    print('NO ATTRIBUTE', exc)\n")], timeout=60)
    assert code == 0, out
    refused = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 4, out
    assert "MPI.COMM_WORLD.Send: point-to-point messages are not fault tolerant" in refused[0]
    assert "MPI.COMM_WORLD.Split: a new communicator would not be repaired" in refused[1]
    assert "MPI.COMM_WORLD.Iallreduce: nonblocking calls" in refused[2]
    assert "MPI.COMM_WORLD.Alltoall: rabit_py runs Allreduce" in refused[3]
    assert "NO ATTRIBUTE 'Intracomm' object has no attribute 'no_such_call'" in out


# ------------------------------------------------------------------ recovery
TRAIN = [sys.executable, str(PROGRAMS / "dropin_train.py")]


def train(api: str, kill_after_round: int = -1, *extra: str, max_restarts: int = 0,
          env: Optional[Dict[str, str]] = None) -> Tuple[int, str, List[dict]]:
    """One 4-rank run of the training loop (``extra``: more of its arguments;
    ``max_restarts``: rabit-run's); with ``kill_after_round`` >= 0, rank 2 is
    SIGKILLed from outside once rank 0 has finished that round."""
    cmd = rabit_run(4, *TRAIN, "--api", api, "--sleep", "0.3" if kill_after_round >= 0 else "0",
                    *extra)
    if max_restarts:
        at = cmd.index("--")
        cmd[at:at] = ["--max-restarts", str(max_restarts), "--restart-delay", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, **(env or {})})
    lines: List[str] = []
    try:
        victim, killed = None, False
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("START ") and victim is None and json.loads(line[6:])["rank"] == 2:
                victim = json.loads(line[6:])["pid"]
            if not killed and victim and line.startswith(f"ROUND {kill_after_round} "):
                os.kill(victim, signal.SIGKILL)
                killed = True
            assert time.monotonic() < deadline, "".join(lines)[-6000:]
        proc.wait(timeout=60)
        assert killed or kill_after_round < 0, "".join(lines)[-6000:]
    finally:
        _kill_tree(proc.pid)
    out = "".join(lines)
    return proc.returncode, out, results(out)


@pytest.mark.parametrize("api", ["rabit", "collective", "mpi4py"])
def test_a_rank_killed_from_outside_is_replaced_and_the_model_is_bitwise_the_same(api):
    code, reference_out, reference = train(api)
    assert code == 0 and len(reference) == 4, reference_out[-6000:]
    code, out, found = train(api, kill_after_round=2)
    assert code == 0, out[-6000:]
    assert "1 in-job recovery (1 process replaced)" in out, out[-6000:]
    assert len(found) == 4, out[-6000:]
    assert {r["digest"] for r in found} == {reference[0]["digest"]}, out[-6000:]
    # Rank 2 started twice: the killed process and its replacement, which
    # ran the program from its start and gave the result.
    starts = [r for r in results(out, "START ") if r["rank"] == 2]
    assert len(starts) == 2 and starts[1]["pid"] in {r["pid"] for r in found}, out[-6000:]


def test_a_loop_that_never_checkpoints_recovers_within_its_budget_and_restarts_past_it():
    # Note [cache budget]: start-up calls may use 1/8 of the budget, here
    # about 3.5 rounds of a 1 MiB sum: a kill after round 1 is recovered in
    # the job (the replacement replays rounds 0-1); past the budget every
    # rank sums with MPI's own allreduce, decided alike on the survivors and
    # the replacement (Note [uniform budget]: a rank that took another path
    # would hang the call or change the bits); a kill after round 5 needs
    # results nobody kept, so the job restarts from its start. Every run
    # gives the failure-free run's bits.
    big = ["--big", str(1 << 18)]
    env = {"RABIT_CACHE_BUDGET": str(28 << 20)}
    code, reference_out, reference = train("mpi4py", -1, *big, max_restarts=1, env=env)
    assert code == 0 and len(reference) == 4, reference_out[-6000:]
    assert "passed the part of the cache budget that start-up calls may use" in reference_out
    assert "at call #19 " in reference_out, reference_out[-6000:]   # round 3's sum (5 a round)
    expected = {(reference[0]["digest"], reference[0]["big"])}
    for kill_after, recovered in ((1, True), (5, False)):
        code, out, found = train("mpi4py", kill_after, *big, max_restarts=1, env=env)
        assert code == 0 and len(found) == 4, out[-6000:]
        assert {(r["digest"], r["big"]) for r in found} == expected, out[-6000:]
        if recovered:
            assert "1 in-job recovery (1 process replaced)" in out, out[-6000:]
            assert "restart 1 of 1" not in out, out[-6000:]
        else:
            assert "restart 1 of 1" in out, out[-6000:]
