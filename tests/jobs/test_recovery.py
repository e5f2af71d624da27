"""In-job recovery with real processes: ranks are killed (by the mock engine, or
with SIGKILL from outside), replaced under the same rank, and the job finishes
with every rank's models bitwise equal to a failure-free run."""

import json
import os
import re
import signal
import sys
import time

import pytest

from rabit_py.launcher import find_mpirun

from .._proc import rabit_run, run

PROGRAM = [sys.executable, "tests/programs/bsp_train.py"]
RANKS = 4


def parse(out: str, tag: str) -> list:
    return [json.loads(line[len(tag) + 1:]) for line in out.splitlines()
            if line.startswith(tag + " ")]


def run_job(env: dict, *args: str, timeout: float = 120, spares: int = 0,
            on_line=None) -> tuple:
    # A short collective timeout: a stuck job ends with a message well before
    # the test's own timeout.
    env = {"RABIT_TIMEOUT": "45", **env}
    code, out = run(rabit_run(RANKS, *PROGRAM, *args, spares=spares), timeout=timeout, env=env,
                    on_line=on_line)
    return code, out, parse(out, "START"), parse(out, "RESULT")


@pytest.fixture(scope="module")
def reference():
    """The failure-free run, on the robust engine."""
    code, out, starts, results = run_job({"RABIT_ENGINE": "robust"})
    assert code == 0, out
    assert sorted(r["rank"] for r in results) == list(range(RANKS)), out
    return {r["rank"]: r for r in results}


def assert_recovered(out, starts, results, reference, killed):
    assert sorted(r["rank"] for r in results) == list(range(RANKS)), out[-6000:]
    first_pid = {s["rank"]: s["pid"] for s in starts if s["trial"] == 0}
    for r in results:
        ref = reference[r["rank"]]
        assert r["world"] == RANKS
        assert r["model"] == ref["model"], f"rank {r['rank']}: global model differs"
        assert r["local"] == ref["local"], f"rank {r['rank']}: local model differs"
        assert r["version"] == ref["version"]
        if r["rank"] in killed:
            assert r["pid"] != first_pid[r["rank"]], f"rank {r['rank']} was not replaced"
            assert r["trial"] >= 1
        else:
            assert r["pid"] == first_pid[r["rank"]]


# seqnos in one round of bsp_train.py: 0 allreduce with prepare_fun, 1 allreduce,
# 2 broadcast, 3 allgather, 4 checkpoint
CASES = {
    "allreduce": ("1,2,1,0", {1}),
    "allreduce_with_prepare_fun": ("1,2,0,0", {1}),
    "broadcast": ("2,1,2,0", {2}),
    "allgather": ("3,3,3,0", {3}),
    "checkpoint": ("1,2,4,0", {1}),
    "rank0": ("0,3,1,0", {0}),
    "two_at_once_with_rank0": ("0,2,1,0;2,2,1,0", {0, 2}),
    "replacement_dies_again": ("1,1,1,0;1,1,3,1", {1}),
    # the replacement dies while its calls are being served: recovery restarts
    "dies_during_replay": ("1,2,3,0;1,2,1,1", {1}),
    "two_versions": ("2,1,2,0;3,4,3,0", {2, 3}),
    # ranks 1 and 3 are replaced by one spawn; then one of those replacements
    # dies (Note [spawned jobs] in rabit_py/_spawn.py: PRRTE killed its sibling)
    "a_replacement_of_a_burst_dies": ("1,1,1,0;3,1,1,0;3,2,2,1", {1, 3}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mock_kill_is_recovered_bitwise(reference, case):
    plan, killed = CASES[case]
    code, out, starts, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": plan})
    assert_recovered(out, starts, results, reference, killed)
    kills = re.findall(r"rabit_py mock: rank (\d+) killed", out)
    assert sorted(set(int(k) for k in kills)) == sorted(killed)
    assert_prepared(plan, killed, results)


def test_survivors_wait_for_a_slow_replacement_asleep(reference):
    # Note [quiet spawn]: while a replacement starts (here it sleeps 3 s
    # before init()), the survivors must not spin in MPI. In a collective
    # spawn and merge they did, each burning about a core's worth of those
    # 3 s, which on shared cores slowed the replacement's start-up itself.
    code, out, starts, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,2,1,0"},
                                         "--slow-replacement", "3")
    assert_recovered(out, starts, results, reference, {1})
    survivors = [r for r in results if r["rank"] != 1]
    assert all(r["cpu_s"] < 1.5 for r in survivors), [r["cpu_s"] for r in survivors]


def test_a_survivor_killed_while_a_replacement_starts(reference):
    # Note [quiet spawn]: rank 1 dies (mock) and its replacement sleeps 3 s
    # before init(); 1 s into that, rank 3 -- asleep, waiting for it -- is
    # SIGKILLed from outside. The survivors must notice, repair again and
    # replace both ranks in the job.
    import threading

    pids = {}

    def on_line(line: str) -> None:
        if line.startswith("START "):
            start = json.loads(line[6:])
            pids.setdefault(start["rank"], start["pid"])
        elif line.startswith("rabit_py mock: rank 1 killed"):
            threading.Timer(1.0, os.kill, (pids[3], signal.SIGKILL)).start()

    code, out, starts, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,2,1,0"},
                                         "--slow-replacement", "3", on_line=on_line,
                                         timeout=240)
    assert_recovered(out, starts, results, reference, {1, 3})
    assert "restart 1 of" not in out, out[-6000:]


def _last_kill(plan, rank):
    points = [tuple(map(int, p.split(","))) for p in plan.split(";")]
    return max((v, s) for r, v, s, _ in points if r == rank)


def assert_prepared(plan, killed, results):
    """Served results are not recomputed: a replacement's prepare_fun ran only
    for the rounds it executed together with the survivors. A rank killed at
    call #1 of a version dies at the start of that call, after its own call #0
    (the one with prepare_fun) returned -- but the survivors' call #0 may
    still have been under way, and was then interrupted by the death (seen
    under CPU hogs: ranks 0 and 2 killed at (2, 1), ranks 1 and 3 both
    interrupted in (2, 0)). Nobody alive then kept its result, so everyone,
    the replacement too, runs it again: every survivor shows that version's
    prepare (at least) twice."""
    survivors = [r for r in results if r["rank"] not in killed]
    for r in results:
        if r["rank"] not in killed:
            continue
        version, seqno = _last_kill(plan, r["rank"])
        start = version if seqno == 0 else version + 1
        if seqno == 1 and r["prepared"][:1] == [version]:
            assert all(s["prepared"].count(version) >= 2 for s in survivors), \
                (plan, r, survivors)
            start = version
        assert r["prepared"] == list(range(start, 6)), (plan, r, survivors)


def test_sigkill_from_outside_is_recovered(reference):
    # Plain mpirun with fault tolerance, no settings: engine="auto" picks the robust engine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RABIT_")}
    mpirun = [find_mpirun(), "-n", str(RANKS), "--oversubscribe", "--with-ft", "ulfm"]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    victim = []

    def kill_rank_2_after_round_1(line: str) -> None:
        if line.startswith("START ") and json.loads(line[6:])["rank"] == 2:
            victim.append(json.loads(line[6:])["pid"])
        if line.startswith("ROUND 1 done") and victim:
            os.kill(victim.pop(), signal.SIGKILL)

    # Under plain mpirun nothing stops a job that Open MPI's MPI_Finalize
    # leaves hanging after a spawned recovery (the README: wrap it in a
    # timeout and read the program's output): once every rank finalized,
    # the job gets a grace period, then its output is checked.
    _, out = run(mpirun + PROGRAM + ["--sleep", "0.3"], timeout=180, env=env, clear_env=True,
                 on_line=kill_rank_2_after_round_1,
                 finished=lambda lines: sum(ln.startswith("FINALIZED ") for ln in lines) == RANKS)
    assert "ROUND 1 done" in out, out
    assert_recovered(out, parse(out, "START"), parse(out, "RESULT"), reference, {2})


def test_a_rank_stopped_from_outside_is_replaced_in_the_job(reference):
    # Issue 32: a frozen rank (SIGSTOP, as a paused VM or container leaves it)
    # held every rank until rabit-run's wedge rule ended the whole job after
    # 60 s. Now rabit-run kills it once the others wait for it (Note
    # [supervision], rule (e)) and the job replaces it in place: the models
    # of the failure-free run, no restart.
    victim, frozen_at = [], []

    def stop_rank_2_after_round_1(line: str) -> None:
        if line.startswith("START ") and json.loads(line[6:])["rank"] == 2 and not victim:
            victim.append(json.loads(line[6:])["pid"])
        if line.startswith("ROUND 1 done") and victim and not frozen_at:
            os.kill(victim[0], signal.SIGSTOP)
            frozen_at.append(time.monotonic())

    code, out = run(rabit_run(RANKS, *PROGRAM, "--sleep", "0.3"), timeout=180,
                    env={"RABIT_ENGINE": "robust"}, on_line=stop_rank_2_after_round_1)
    assert code == 0 and frozen_at, out[-6000:]
    assert re.search(rf"rabit-run: rank 2 \(pid {victim[0]}\) was stopped \(SIGSTOP\) for "
                     rf"\d+\.\d s while the other ranks waited for it in rabit_py; killed it",
                     out), out[-6000:]
    assert "a wedge" not in out and "restart 1 of" not in out, out[-6000:]
    assert_recovered(out, parse(out, "START"), parse(out, "RESULT"), reference, {2})


def test_a_rank_hung_in_its_own_code_is_replaced_in_the_job(reference):
    # Issue 32: a rank stuck in its own code (here: asleep for an hour in round
    # 1, between calls 1 and 2) made every waiting rank raise
    # CollectiveTimeoutError and the job end. Now the waiting ranks ask
    # rabit-run, at the collective timeout, to end the ranks behind their call
    # (Note [hung ranks]); it kills the hung one and the job replaces it in
    # place: the models of the failure-free run, no restart, no timeout error.
    code, out, starts, results = run_job({"RABIT_ENGINE": "robust", "RABIT_TIMEOUT": "4"},
                                         "--hang", "2,1")
    assert code == 0, out[-6000:]
    hung = re.search(r"^HANG 2 (\d+)$", out, re.M)
    assert hung, out[-6000:]
    assert re.search(rf"rabit-run: rank 2 \(pid {hung[1]}\) was in its own code after call #1 "
                     rf"of version 1 while rank\(s\) [013, ]+ waited \d+\.\d s for it in call "
                     rf"#2 of version 1, past the collective timeout; killed it, so that the "
                     rf"job replaces it in place", out), out[-6000:]
    assert "did not complete within" not in out and "restart 1 of" not in out, out[-6000:]
    assert "1 in-job recovery (1 process replaced)" in out and "\n  hung: rank 2" in out
    assert_recovered(out, starts, results, reference, {2})


def test_a_late_rank_under_plain_mpirun_is_still_a_timeout_naming_it():
    # Without rabit-run nothing can end another process (Note [hung ranks]):
    # the robust engine's waiting ranks raise CollectiveTimeoutError at the
    # timeout, naming the rank that did not arrive.
    program = ("import time, numpy as np, rabit_py as r\n"
               "r.init(engine='robust', timeout=2)\n"
               "r.allreduce(np.zeros(2), r.Op.SUM)\n"
               "if r.get_rank() == 1:\n"
               "    time.sleep(4)\n"
               "try:\n"
               "    r.allreduce(np.zeros(2), r.Op.SUM)\n"
               "except r.CollectiveTimeoutError as exc:\n"
               "    print('TIMEOUT', r.get_rank(), exc, flush=True)\n"
               "    raise SystemExit(5)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RABIT_")}
    mpirun = [find_mpirun(), "-n", "2", "--oversubscribe", "--with-ft", "ulfm"]
    if os.geteuid() == 0:
        mpirun.append("--allow-run-as-root")
    start = time.monotonic()
    code, out = run(mpirun + [sys.executable, "-c", program], timeout=120, env=env,
                    clear_env=True)
    assert code != 0, out
    assert re.search(r"TIMEOUT 0 rank 0: allreduce #1 \(version 0\) did not complete within "
                     r"2 s.*Rank\(s\) 1 did not arrive", out), out[-4000:]
    assert "rabit-run" not in out and time.monotonic() - start < 60, out[-4000:]


def test_robust_engine_refuses_a_job_without_fault_tolerance():
    code, out = run([sys.executable, "-c", "import rabit_py as r; r.init(engine='robust')"],
                    timeout=60)
    assert code != 0
    assert "engine='robust' needs MPI fault tolerance" in out and "rabit-run" in out


def test_mismatch_after_recovery_is_reported():
    code, out, _, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,1,1,0"},
                                    "--mismatch-at", "3")
    mismatches = parse(out, "MISMATCH")
    assert sorted(m["rank"] for m in mismatches) == list(range(RANKS)), out[-6000:]
    assert all("shape" in m["message"] and "rank 1" in m["message"] for m in mismatches)


REPLAY = [sys.executable, "tests/programs/replay_check.py"]


def run_replay(*args: str, kill: bool = True) -> tuple:
    # Rank 1 is killed at call #3 of version 0; its replacement replays #0-#2.
    env = {"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,0,3,0"} if kill else \
        {"RABIT_ENGINE": "robust"}
    code, out = run(rabit_run(2, *REPLAY, *args), timeout=120,
                    env={"RABIT_TIMEOUT": "45", **env})
    return code, out, {int(line.split()[1]): json.loads(line.split(" ", 2)[2])
                       for line in out.splitlines() if line.startswith("RESULT ")}


@pytest.mark.parametrize("differ,call,mine,theirs", [
    ("allreduce", "call #0", "allreduce (op Op.SUM, dtype float32, shape (3,))",
     "allreduce (op Op.SUM, dtype float64, shape (3,))"),
    ("broadcast", "call #1", "broadcast (dtype float32, shape (4,), root 0)",
     "broadcast (dtype float64, shape (4,), root 0)"),
    ("allgather", "call #2", "allgather (dtype float64, shape (*, 3))",
     "allgather (dtype float64, shape (*, 2))"),
])
def test_a_replacement_making_another_call_is_refused_the_survivors_result(
        differ, call, mine, theirs):
    # One description of a call serves the cross-rank check and the replay
    # check: before, a broadcast was checked by its root only and an
    # allgather by its kind, and a replacement got a result of another
    # dtype or shape than it asked for.
    code, out, results = run_replay("--differ", differ)
    assert code != 0, out[-4000:]
    expected = (f"CollectiveMismatchError on rank 1: after recovery, {call} of version 0 is "
                f"{mine} but the other ranks ran {theirs}")
    assert expected in out, out[-4000:]
    assert results == {}


@pytest.mark.parametrize("receivers", ["buffer", "none"])
def test_a_replacement_making_the_same_calls_replays_them(receivers):
    args = ["--receivers-pass-none"] if receivers == "none" else []
    code, out, reference = run_replay(*args, kill=False)
    assert code == 0 and sorted(reference) == [0, 1], out[-4000:]
    code, out, results = run_replay(*args)
    assert code == 0, out[-4000:]
    assert "replaced rank(s) [1]" in out
    for rank in (0, 1):
        got = dict(results[rank])
        assert got.pop("recoveries") == 1
        want = dict(reference[rank])
        assert want.pop("recoveries") == 0
        assert got == want


def test_uncaught_exception_aborts_with_traceback():
    code, out, _, results = run_job({"RABIT_ENGINE": "robust"}, "--raise-at", "2")
    assert code != 0
    assert "RuntimeError: a bug in round 2 on rank 1" in out
    assert "rank 1: uncaught RuntimeError; aborting the job" in out
    assert results == []


def test_local_model_lost_with_its_replicas():
    # Ranks 1 and 2 die together: rank 1's only replica lived on rank 2.
    code, out, _, _ = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,2,1,0;2,2,1,0"})
    errors = parse(out, "RECOVERY_ERROR")
    assert errors, out[-6000:]
    assert all("local model of rank 1 at version 2 is lost" in e["message"] for e in errors)


def test_recoveries_are_capped():
    code, out, _, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "2,1,2,0;3,3,1,0",
                                     "RABIT_MAX_RECOVERIES": "1"})
    errors = parse(out, "RECOVERY_ERROR")
    assert errors and results == [], out[-6000:]
    assert all("a peer was lost, and the job was recovered 1 time(s) already "
               "(RABIT_MAX_RECOVERIES=1): the job ends" in e["message"] for e in errors)


# ---------------------------------------------------------------- shared memory
@pytest.mark.parametrize("node_size,plan,killed,spares", [
    ("0", "1,2,1,0", {1}, 0),             # one node: peers wait on rank 1's flags
    ("2", "0,3,0,0;3,4,1,0", {0, 3}, 0),  # two pseudo-nodes: a leader, then a member
    ("2", "0,3,0,0;3,4,1,0", {0, 3}, 1),  # the same, a spare then a spawned process
])
def test_a_rank_dying_while_peers_wait_in_shared_memory(node_size, plan, killed, spares):
    # Every allreduce takes the shared-memory path; the killed rank dies just
    # before one, while its peers already wait for its flag: they must notice
    # (its process is gone), recover, and end as a failure-free run does.
    env = {"RABIT_SHM_MIN_BYTES": "1", "RABIT_NODE_SIZE": node_size}
    code, out, _, results = run_job({"RABIT_ENGINE": "robust", **env})
    assert code == 0, out[-6000:]
    reference = {r["rank"]: r for r in results}
    code, out, starts, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": plan, **env},
                                         spares=spares)
    assert code == 0, out[-6000:]
    assert_recovered(out, starts, results, reference, killed)
    assert sorted(set(map(int, re.findall(r"rabit_py mock: rank (\d+) killed", out)))) == \
        sorted(killed)
    if spares:
        assert sorted(r["joined"] for r in results if r["rank"] in killed) == \
            ["spare", "spawned"]


# (A non-leader victim at 2 ranks is not run apart from (4, 2): CI time.)
@pytest.mark.parametrize("ranks,victim", [(2, 0), (4, 2)])
def test_a_rank_killed_inside_a_large_shared_memory_allreduce_recovers_bitwise(ranks, victim):
    # The ranks of one node reduce 16 MiB arrays in place through shared
    # memory, each chunk's result kept in an area the node keeps too (Note
    # [fused in place] in _shm.py). The victim is SIGKILLed from outside three
    # times, a few milliseconds after rounds 2, 5 and 8 are done, mostly
    # inside one of the allreduces (they are nearly all of the run's time):
    # rank 1, node rank 0 (which makes the areas), or on 4 ranks rank 2. The
    # survivors, part-way through one with their arrays part result and part
    # input, run it again with the replacement from the parts that the
    # areas hold and the rest, serving results from areas whose maker died:
    # the models are the failure-free run's. (An engine that wrote results
    # into the input chunk by chunk and ran the call again from the array
    # failed this test 4 runs in 4: tried.)
    program = [sys.executable, "tests/programs/large_sums.py"]
    env = {"RABIT_ENGINE": "robust", "RABIT_SHM_MIN_BYTES": "1", "RABIT_TIMEOUT": "60"}
    code, out = run(rabit_run(ranks, *program), timeout=300, env=env)
    assert code == 0, out[-6000:]
    reference = {r["rank"]: r for r in parse(out, "RESULT")}
    pids, killed = {}, []

    def on_line(line):
        if line.startswith("START "):
            start = json.loads(line[6:])
            pids[start["rank"]] = start["pid"]
        if line.split() in (["ROUND", "2"], ["ROUND", "5"], ["ROUND", "8"]) \
                and pids.get(victim) not in killed:
            time.sleep(0.001 * len(killed) * 7)     # 0, 7 and 14 ms after the cue
            os.kill(pids[victim], signal.SIGKILL)
            killed.append(pids[victim])

    code, out = run(rabit_run(ranks, *program), timeout=300, env=env, on_line=on_line)
    assert code == 0, out[-6000:]
    results = {r["rank"]: r for r in parse(out, "RESULT")}
    assert sorted(results) == list(range(ranks)), out[-6000:]
    assert len(killed) == 3, f"kills sent: {killed}"
    for rank, r in results.items():
        assert (r["model"], r["version"]) == (reference[rank]["model"],
                                              reference[rank]["version"]), out[-6000:]
        if rank != victim:
            assert r["recoveries"] == 3, out[-6000:]


@pytest.mark.parametrize("seqno", [1, 3], ids=["allreduce", "lazy_checkpoint"])
def test_a_rank_dead_after_its_check_flag_is_passed_by_the_others(seqno):
    # Note [uniform check] in rabit_py/engine/_shm.py: a rank raises its flag
    # of the check on the node and dies. The others pass that check (a flag
    # once up stays up) and meet the loss after it: in the reduction of
    # allreduce #1, or, after lazy_checkpoint #3 of version 2, which that
    # check committed without an Agree, in the next version's first call.
    # Rank 2 comes late: rank 0 waits for its flag while rank 1 is dead, and
    # must not give up on the check (rank 2 then passes it: a lazy
    # checkpoint committed on one survivor only ends the job). Either way the
    # replacement catches up to the failure-free models.
    program = [sys.executable, "tests/programs/large_sums.py", "--mib", "1", "--rounds", "5",
               "--calls", "3", "--lazy"]
    env = {"RABIT_ENGINE": "robust", "RABIT_TIMEOUT": "60"}
    code, out = run(rabit_run(3, *program), timeout=300, env=env)
    assert code == 0, out[-6000:]
    reference = {r["rank"]: r for r in parse(out, "RESULT")}
    code, out = run(rabit_run(3, *program, "--die-after-check", f"1,2,{seqno}", "--late", "2"),
                    timeout=300, env=env)
    assert code == 0, out[-6000:]
    assert f"DYING after the check flag of version 2 call {seqno}" in out, out[-6000:]
    results = {r["rank"]: r for r in parse(out, "RESULT")}
    assert sorted(results) == [0, 1, 2], out[-6000:]
    for rank, r in results.items():
        assert (r["model"], r["version"]) == (reference[rank]["model"],
                                              reference[rank]["version"]), out[-6000:]
        assert r["recoveries"] == 1 or rank == 1, out[-6000:]


# ---------------------------------------------------------------- spread results
@pytest.mark.parametrize("plan,killed", [
    ("1,2,3,0", {1}),                     # the holders of #1 and #2 include rank 1
    ("0,2,1,0;2,2,1,0", {0, 2}),          # two at once, not both holders of a result
])
def test_results_spread_over_two_ranks_still_recover(reference, plan, killed):
    code, out, starts, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": plan,
                                          "RABIT_RESULT_COPIES": "2"})
    assert code == 0, out[-6000:]
    assert_recovered(out, starts, results, reference, killed)


# ---------------------------------------------------------------- spares
def test_unused_spares_are_released(reference):
    code, out, starts, results = run_job({"RABIT_ENGINE": "robust"}, spares=2)
    assert code == 0, out[-6000:]
    assert len(starts) == RANKS and {s["joined"] for s in starts} == {"start"}, out[-6000:]
    assert_recovered(out, starts, results, reference, set())


@pytest.mark.parametrize("spares,plan,killed,joined", [
    (1, "1,2,1,0", {1}, {1: "spare"}),
    (1, "2,2,4,0", {2}, {2: "spare"}),                      # in a checkpoint
    # two at once, one spare: the other is spawned (and joins the pool)
    (1, "0,2,1,0;2,2,1,0", {0, 2}, {0: "spare", 2: "spawned"}),
    # the spare that took rank 1 dies too: the second spare takes it
    (2, "1,1,1,0;1,1,3,1", {1}, {1: "spare"}),
    # one spare, two failures at different versions: a spare, then a spawn
    (1, "2,1,2,0;3,4,3,0", {2, 3}, {2: "spare", 3: "spawned"}),
])
def test_a_spare_takes_the_place_of_a_killed_rank(reference, spares, plan, killed, joined):
    code, out, starts, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": plan},
                                         spares=spares)
    assert code == 0, out[-6000:]
    assert_recovered(out, starts, results, reference, killed)
    assert {r["rank"]: r["joined"] for r in results if r["rank"] in killed} == joined
    assert_prepared(plan, killed, results)


def test_a_dead_spare_is_skipped(reference):
    # The last of two spares is SIGKILLed while it waits, just before rank 1
    # dies (at the round before): the other spare takes rank 1's place, and the
    # job ends (releasing a dead spare does not hang). The kill follows the
    # job's own output: a timer from the spare's start (as before) fired inside
    # the job's start-up under load, before the spare waited.
    spare = []

    def on_line(line: str) -> None:
        if line.startswith("SPARE "):
            spare.append(int(line.split()[1]))
        elif line.startswith("ROUND 3 done") and spare:
            os.kill(spare[0], signal.SIGKILL)

    code, out, starts, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,4,1,0"},
                                         "--announce-last-spare", "--sleep", "0.3",
                                         spares=2, on_line=on_line)
    assert spare, out[-6000:]
    assert code == 0, out[-6000:]
    assert_recovered(out, starts, results, reference, {1})
    assert [r["joined"] for r in results if r["rank"] == 1] == ["spare"]


def test_spares_are_told_when_the_job_cannot_be_recovered():
    # Ranks 1 and 2 die together: rank 1's only replica lived on rank 2. The
    # spares must end too, not wait for a rebuild that never comes. The ranks
    # stay a while after their error: mpirun ends the job at the second
    # non-zero exit, and a spare still on its way out would be cut short.
    code, out, _, results = run_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,2,1,0;2,2,1,0"},
                                    "--linger-on-error", "3", spares=2)
    assert code != 0 and results == []
    errors = parse(out, "RECOVERY_ERROR")
    assert errors and all("local model of rank 1 at version 2 is lost" in e["message"]
                          for e in errors), out[-6000:]
    assert out.count("the job cannot be recovered") == 2, out[-6000:]


def test_spares_need_the_robust_engine():
    code, out = run([sys.executable, "-c", "import rabit_py as r; r.init(engine='mpi')"],
                    timeout=60, env={"RABIT_SPARES": "1"})
    assert code != 0
    assert "RABIT_SPARES=1: spares replace failed ranks, which only the robust engine" in out


# ---------------------------------------------------------------- NCCL (stand-ins)
NCCL_PROGRAM = [sys.executable, "tests/programs/nccl_recover.py"]


def nccl_job(env, spares=0):
    env = {"RABIT_TIMEOUT": "45", "RABIT_GPU_BACKEND": "nccl", **env}
    code, out = run(rabit_run(RANKS, *NCCL_PROGRAM, spares=spares), timeout=120, env=env)
    return out, {r["rank"]: r for r in parse(out, "RESULT")}


@pytest.mark.parametrize("check,spares", [("1", 0), ("0", 1)])
def test_a_rank_killed_around_nccl_allreduces_is_recovered_bitwise(check, spares):
    # With the signature check off, the survivors are inside the NCCL call
    # (waiting for the dead peer) when it dies: MPI's detector must get them out.
    out, reference = nccl_job({"RABIT_ENGINE": "robust", "RABIT_CHECK": check})
    assert sorted(reference) == list(range(RANKS)), out[-6000:]
    assert all(r["communicators"] == 1 for r in reference.values())
    out, results = nccl_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,2,1,0",
                             "RABIT_CHECK": check}, spares=spares)
    assert sorted(results) == list(range(RANKS)), out[-6000:]
    for rank, r in results.items():
        assert r["model"] == reference[rank]["model"], f"rank {rank} differs"
        assert r["world"] == RANKS
    assert results[1]["joined"] == ("spare" if spares else "spawned")
    # the replacement's calls of version 2 before the kill were served from
    # the cache; from the killed call on it ran them (prepare_fun included)
    assert results[1]["prepared"] == [2, 3, 4, 5]
    # the survivors made a new NCCL communicator for the new membership
    assert all(results[r]["communicators"] == 2 for r in (0, 2, 3))


@pytest.mark.parametrize("mock,check", [("1,2,2,0", "1"), ("0,3,3,0", "0")])
def test_a_rank_killed_in_a_nccl_broadcast_or_allgather_is_recovered_bitwise(mock, check):
    # Killed in the device broadcast (rank 1, a receiver) or in the device
    # allgather (rank 0, the next broadcast's root; the check off, so the
    # survivors meet the failure in the allgather's exchange of row counts);
    # the replacement gets the cached results as device arrays (the program
    # asserts it).
    out, reference = nccl_job({"RABIT_ENGINE": "robust"})
    assert sorted(reference) == list(range(RANKS)), out[-6000:]
    out, results = nccl_job({"RABIT_ENGINE": "mock", "RABIT_MOCK": mock, "RABIT_CHECK": check})
    assert sorted(results) == list(range(RANKS)), out[-6000:]
    killed = int(mock.split(",")[0])
    for rank, r in results.items():
        assert r["model"] == reference[rank]["model"], f"rank {rank} differs"
        assert r["world"] == RANKS
    assert results[killed]["joined"] == "spawned"
    assert all(results[r]["communicators"] == 2 for r in range(RANKS) if r != killed)


TEARDOWN_CRASH = r"""
import atexit, os, sys, numpy as np
from mpi4py import MPI
if MPI.Comm.Get_parent() != MPI.COMM_NULL:
    # A replacement dies of SIGABRT after MPI_Finalize, as Open MPI's own
    # teardown (ompi_dpm_dyn_finalize) sometimes makes it do after recoveries.
    atexit.register(lambda: (MPI.Finalize(), os.abort()))
import rabit_py as rabit
rabit.init(timeout=30)
version, model = rabit.load_checkpoint()
model = 0.0 if version == 0 else model
for it in range(version, 3):
    x = np.full(4, rabit.get_rank() + it, dtype=np.float64)
    rabit.allreduce(x, rabit.Op.SUM)
    model += x.sum()
    rabit.checkpoint(model)
print("DONE", rabit.get_rank(), model, flush=True)
rabit.finalize()
"""


def test_a_replacement_crashing_in_mpis_teardown_after_finalize_is_not_a_failure():
    # Every rank finalizes cleanly and prints its result, then a spawned
    # replacement aborts inside MPI_Finalize and mpirun exits 134.
    code, out = run(rabit_run(2, sys.executable, "-c", TEARDOWN_CRASH), timeout=90,
                    env={"RABIT_ENGINE": "mock", "RABIT_MOCK": "1,1,0,0"})
    assert "DONE 0 36.0" in out and "DONE 1 36.0" in out, out[-4000:]
    assert "replaced rank(s) [1]" in out
    assert code == 0, out[-4000:]
    # mpirun reports the signal (then rabit-run explains its 0), stays after
    # every rank ended (then rabit-run stops it), or, the spawned job being
    # recoverable (Note [spawned jobs]), exits 0 itself; never a failed attempt
    assert "1 attempt," in out and "0.0 s in failed attempts" in out, out[-4000:]
