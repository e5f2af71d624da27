"""The server-backed KVStore (dist_async, dist_ssp) on real jobs: workers and
server processes started by rabit-run --servers (and by a plain mpirun with
two programs), each consistency model's semantics with a straggler, the
staleness bound checked on every pull, priorities, the errors a user meets,
and workers and servers killed from outside: the job ends without hanging,
and rabit-run's restart runs it again to the end."""

import json
import os
import re
import signal
import sys
import threading
from pathlib import Path

import pytest

from .._proc import cpu_hogs, run, server_processes

PROGRAM = [sys.executable, "tests/programs/kv_servers.py"]
WORKERS, SERVERS, ITERATIONS = 3, 2, 20


def servers_job(workers, servers, *args, restarts=0, checkpoint_dir=None):
    return [sys.executable, "-m", "rabit_py.launcher", "-n", str(workers), "--servers",
            str(servers), *(["--max-restarts", str(restarts), "--restart-delay", "0.1"]
                            if restarts else []),
            *(["--checkpoint-dir", str(checkpoint_dir)] if checkpoint_dir else []),
            "--", *PROGRAM, *args]


def results(folder, workers):
    return [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(workers)]


def staleness(records):
    """The largest number of clocks by which a pulled value lagged: own
    clock minus the fewest pushes of any worker that the value held."""
    return max(clock - min(held) for _, _, clock, held in records)


@pytest.mark.parametrize("mode,tau", [("dist_async", None), ("dist_ssp", 0), ("dist_ssp", 2)])
def test_each_consistency_model_with_a_straggler(tmp_path, mode, tau):
    # Worker 1 sleeps 40 ms a step; the others do not wait for it in
    # dist_async, run at most tau clocks ahead in dist_ssp.
    args = ["train", "--mode", mode, "--iterations", str(ITERATIONS), "--straggler", "1",
            "--delay", "0.04", "--out", str(tmp_path)]
    if tau is not None:
        args += ["--staleness", str(tau)]
    code, text = run(servers_job(WORKERS, SERVERS, *args), timeout=120)
    assert code == 0, text[-6000:]
    ranks = results(tmp_path, WORKERS)
    # No updater: a push adds to the value (ps-lite's default), so after the
    # barrier every worker pulls every push of everyone.
    small = ITERATIONS * sum(r + 1 for r in range(WORKERS))
    for result in ranks:
        assert result["type"] == mode and result["workers"] == WORKERS
        assert result["servers"] == SERVERS
        assert result["small"] == [float(small)] * 5
        assert result["big"] == [float(ITERATIONS * WORKERS)] * 200
        parts = {(key, part) for key, part, _, _ in result["pull_clocks"]}
        assert parts == {("small", 0), (7, 0), (7, 1)}     # key 7 is cut over 2 servers
    fast = [r["pull_clocks"] for rank, r in enumerate(ranks) if rank != 1]
    for records in [r["pull_clocks"] for r in ranks]:
        for key, part, clock, held in records:
            assert held[0] + held[1] + held[2] >= clock          # at least its own pushes
    if tau is None:
        # Nobody waited for the straggler: fast workers read values missing
        # many of its pushes (the instrument sees staleness where it exists).
        assert max(staleness(r) for r in fast) > 5
    else:
        for records in [r["pull_clocks"] for r in ranks]:
            assert staleness(records) <= tau, records
        assert max(staleness(r) for r in fast) == tau       # the bound was reached


def test_the_servers_run_the_optimizer(tmp_path):
    code, text = run(servers_job(2, 1, "train", "--mode", "dist_ssp", "--staleness", "1",
                                 "--iterations", "10", "--updater", "sgd",
                                 "--out", str(tmp_path)), timeout=120)
    assert code == 0, text[-6000:]
    for result in results(tmp_path, 2):
        # SGD, learning rate 0.5: each push of (rank + 1) steps by -0.5 (rank + 1).
        assert result["small"] == [-0.5 * 10 * (1 + 2)] * 5
        assert result["big"] == [-0.5 * 10 * 2] * 200
    code, text = run(servers_job(2, 2, "train", "--mode", "dist_async", "--iterations", "10",
                                 "--updater", "scaled", "--out", str(tmp_path)), timeout=120)
    assert code == 0, text[-6000:]
    for result in results(tmp_path, 2):
        assert result["small"] == [2.0 * 10 * 3] * 5 and result["big"] == [2.0 * 20] * 200


def test_priorities_order_the_requests_and_a_key_keeps_its_order(tmp_path):
    code, text = run(servers_job(2, 1, "priority", "--mode", "dist_ssp", "--staleness", "0",
                                 "--out", str(tmp_path)), timeout=120)
    assert code == 0, text[-6000:]
    for result in results(tmp_path, 2):
        # Queued under hold(): push a (0), push b (5), push c (1), push a (9),
        # and from another thread pull d (10): the pull first, then by
        # priority, the second push of a after the first.
        assert result["order"] == ["pull d", "push b", "push c", "push a", "push a"]
        assert result["values"] == {"a": [4.0] * 3, "b": [2.0] * 3, "c": [2.0] * 3,
                                    "d": [0.0] * 3}


def test_the_errors_a_user_meets(tmp_path):
    code, text = run(servers_job(2, 1, "errors", "--out", str(tmp_path)), timeout=120)
    assert code == 0, text[-6000:]
    for rank, seen in enumerate(results(tmp_path, 2)):
        assert seen["local_updater"][0] == "TypeError"
        assert "cannot be pickled for the servers" in seen["local_updater"][1]
        # Picklable by name, but the server cannot import __main__'s: every
        # worker raises, with the server's reason.
        kind, message = seen["main_updater"]
        assert kind == "KVStoreError" and "cannot load the updater" in message
        assert "importable by the server process" in message
        assert (rank == 0) == ("failed on rank 0" not in message)
        assert seen["unknown_key"] == ["KVStoreError", f"rank {rank}: push of key 'nope', which "
                                       f"was never initialized; call init('nope', value) first"]
        assert "shape (5,)" in seen["bad_shape"][1] and "holds (4,)" in seen["bad_shape"][1]
        assert "initialized twice" in seen["init_twice"][1]
        assert seen["ssp_without_staleness"][0] == "ValueError"
        assert "needs staleness=tau" in seen["ssp_without_staleness"][1]
        assert "dist_async has no staleness bound" in seen["async_with_staleness"][1]
        assert "checkpointed by its servers" in seen["checkpoint"][1]
        kind, message = seen["checkpoint_without_folder"]
        assert kind == "KVStoreError" and "needs a checkpoint folder" in message
        kind, message = seen["broken_updater"]
        assert kind == "KVStoreError" and "the updater raised on a push of key 'w'" in message
        assert "ZeroDivisionError: updater bug on key 'w'" in message


def test_a_plain_mpirun_with_two_programs(tmp_path):
    mpirun = Path(sys.executable).parent / "mpirun"
    cmd = [str(mpirun), "--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0
                                              else []),
           "-x", "RABIT_SERVERS=1", "-n", "2", *PROGRAM, "train", "--mode", "dist_ssp",
           "--staleness", "1", "--iterations", "5", "--out", str(tmp_path), ":", "-n", "1",
           sys.executable, "-m", "rabit_py.kvstore.server"]
    code, text = run(cmd, timeout=120)
    assert code == 0, text[-6000:]
    for result in results(tmp_path, 2):
        assert result["small"] == [15.0] * 5 and result["servers"] == 1


def test_without_the_variable_the_server_says_how_to_start_it():
    code, text = run([sys.executable, "-m", "rabit_py.kvstore.server"], timeout=60,
                     env={"RABIT_SERVERS": "0"})
    assert code == 2 and "RABIT_SERVERS is not set" in text, text


def kill_when_ready(which, killed, sig=signal.SIGKILL, rank=1, server=0):
    """An ``on_line`` that sends ``sig`` to processes once every worker
    printed "ready", all at once: ``worker`` (worker ``rank``), ``server``
    (server ``server``) or ``both`` (a burst)."""
    ready = {}

    def on_line(line):
        words = line.split()
        if len(words) >= 5 and words[0] == "ready" and words[4] == "0" and not killed:
            ready[int(words[1])] = int(words[2])
        if len(ready) == WORKERS and not killed:
            if which in ("worker", "both"):
                killed.append(ready[rank])
            if which in ("server", "both"):
                killed.append(server_processes()[server])
            victims = list(killed)
            threading.Timer(0.5, lambda: [os.kill(p, sig) for p in victims]).start()
    return on_line


@pytest.mark.parametrize("mode,rank,updater,hogs", [("dist_async", 0, "sgd", 0)])
def test_a_killed_worker_is_replaced_in_the_job_and_resumes_at_its_clock(tmp_path, mode, rank,
                                                                        updater, hogs):
    # Note [replaced workers]: the servers set the dead worker aside and
    # serve the others; the job's recovery replaces it at the survivors'
    # next collective; the replacement connects to the servers, resumes at
    # the dead worker's clock (the pushes the servers applied) and finishes
    # its steps: every worker's every push applied once, no restart.
    killed = []
    steps = 100
    with cpu_hogs(hogs):
        code, text = run(servers_job(WORKERS, 2, "resume", "--mode", mode, "--staleness", "1",
                                     "--iterations", str(steps), "--pace", "0.02",
                                     "--updater", updater, "--out", str(tmp_path)),
                         timeout=240, on_line=kill_when_ready("worker", killed, rank=rank))
    assert killed and code == 0, text[-6000:]
    assert "restart" not in text and "1 in-job recovery (1 process replaced)" in text, \
        text[-6000:]
    assert f"worker(s) [{rank}] died" in text, text[-6000:]
    assert f"the replacement of worker {rank} connected" in text, text[-6000:]
    scale = -0.5 if updater == "sgd" else 1.0
    starts = []
    for result in results(tmp_path, WORKERS):
        assert result["small"] == [scale * steps * sum(r + 1 for r in range(WORKERS))] * 5
        assert result["big"] == [scale * steps * WORKERS] * 200
        starts.append(result["start"])
    # The replacement resumed mid-way (the others ran from 0).
    assert 0 < starts[rank] < steps and starts[:rank] + starts[rank + 1:] == [0, 0], starts


@pytest.mark.parametrize("mode,updater,servers,then,hogs", [
    ("dist_ssp", "sgd", 2, "the other", 0), ("dist_async", "none", 3, "the new one", 2),
    ("dist_ssp", "none", 2, "a worker", 0)])
def test_a_killed_server_is_replaced_by_a_new_process_that_keeps_the_copy(
        tmp_path, mode, updater, servers, then, hogs):
    # Note [server replicas]: server A is killed; its next server holds a
    # copy of A's parts, serves them, and every worker sends it what A may
    # not have applied. Note [replaced servers]: then the survivors spawn a
    # new server A' and hand it A's parts and
    # the copy of the previous server's; the workers connect to A'. Then
    # "the other" (the server A' keeps the copy of) or "the new one" (A',
    # whose copy the next server keeps, kept up by A') is killed: it is
    # failed over and replaced again. Or "a worker" (worker 1): its
    # replacement finds the port A' (server 0) published (Note [the servers'
    # port] in _servers.py). Every push applied exactly once through both
    # failures, no restart.
    killed = []
    steps = 200
    workers = {}

    def second(line):
        words = line.split()
        if len(words) >= 5 and words[0] == "ready":
            workers[int(words[1])] = int(words[2])
        if "a new process took the place of server" in line and len(killed) == 1:
            killed.append(workers[1] if then == "a worker" else
                          next(p for p in server_processes(then == "the new one")
                               if p not in killed))
            threading.Timer(1.0, os.kill, (killed[1], signal.SIGKILL)).start()

    first = kill_when_ready("server", killed)

    def on_line(line):
        first(line)
        second(line)

    with cpu_hogs(hogs):
        code, text = run(servers_job(WORKERS, servers, "resume", "--mode", mode, "--staleness",
                                     "1", "--iterations", str(steps), "--pace", "0.02",
                                     "--replicas", "1", "--updater", updater,
                                     "--out", str(tmp_path)),
                         timeout=240, on_line=on_line)
    assert len(killed) == 2 and code == 0, text[-6000:]
    assert "restart" not in text, text[-6000:]
    assert "from the replica here" in text and "request(s) sent there again" in text, \
        text[-6000:]
    replaced = re.findall(r"server \d: a new process took the place of server (\d) \([\d.]+ "
                          r"s\); its parts of 1 store\(s\) moved there", text)
    assert len(replaced) == (1 if then == "a worker" else 2), text[-6000:]
    assert (replaced[0] == replaced[-1]) == (then != "the other"), text[-6000:]
    for rank in range(WORKERS):
        for index in replaced:
            assert f"worker {rank} connected to the new server {index}" in text, text[-6000:]
    if then == "a worker":
        for index in range(servers):
            assert f"server {index}: the replacement of worker 1 connected" in text, text[-6000:]
    scale = -0.5 if updater == "sgd" else 1.0
    for rank, result in enumerate(results(tmp_path, WORKERS)):
        assert result["small"] == [scale * steps * sum(r + 1 for r in range(WORKERS))] * 5
        assert result["big"] == [scale * steps * WORKERS] * 200
        assert (result["start"] > 0) == (then == "a worker" and rank == 1), (rank, result)


@pytest.mark.parametrize("hogs", [2])
def test_a_killed_server_ends_the_job_and_a_restart_resumes_from_the_shards(tmp_path, hogs):
    # A server's parts die with it: the job ends (no pull waits for ever),
    # and rabit-run --max-restarts runs it again. The servers wrote their parts
    # every 4 pushes (a step is 6 pushes on one server, 3 on the other: the
    # parts are restored at different steps): the restarted servers load
    # them, each worker resumes at its clock and pushes again only the steps
    # a part lacks, so every worker's every push is applied exactly once.
    killed = []
    steps = 100
    with cpu_hogs(hogs):
        code, text = run(servers_job(WORKERS, 2, "resume", "--mode", "dist_ssp", "--staleness",
                                     "1", "--iterations", str(steps), "--pace", "0.02",
                                     "--checkpoint-every", "4", "--out", str(tmp_path),
                                     restarts=1, checkpoint_dir=tmp_path / "ck"),
                         timeout=240, on_line=kill_when_ready("server", killed))
    assert killed, text[-6000:]
    assert code == 0, text[-6000:]
    assert "restart 1 of 1" in text, text[-6000:]
    first = text[:text.index("restart 1 of 1")]
    assert "holds no part of server" in first and "replicas=1" in first, first[-6000:]
    restored = [line for line in text.splitlines() if "restored from its checkpoint" in line]
    assert len(restored) == 2, text[-6000:]                 # both servers
    starts = []
    for result in results(tmp_path, WORKERS):
        assert result["small"] == [float(steps * sum(r + 1 for r in range(WORKERS)))] * 5
        assert result["big"] == [float(steps * WORKERS)] * 200
        starts.append(result["start"])
    # The restart resumed mid-way: not from scratch, not past the end.
    assert 0 < min(starts) and max(starts) < steps, (starts, text[-3000:])


@pytest.mark.parametrize("replicas", [1])
def test_a_frozen_server_is_killed_by_rabit_run(tmp_path, replicas):
    # SIGSTOP: the server holds its state but answers nothing, and every
    # worker that pulls from it waits. rabit-run kills it after FROZEN_S
    # (rule (g) of Note [supervision]); then its replica serves its parts
    # (replicas=1), or the job ends and a restart resumes from the shards.
    stopped = []
    steps = 100
    code, text = run(servers_job(WORKERS, 2, "resume", "--mode", "dist_async",
                                 "--iterations", str(steps), "--pace", "0.02",
                                 "--checkpoint-every", "4", "--timeout", "60",
                                 "--replicas", str(replicas), "--out", str(tmp_path),
                                 restarts=1, checkpoint_dir=tmp_path / "ck"),
                     timeout=150, on_line=kill_when_ready("server", stopped, signal.SIGSTOP))
    assert stopped and code == 0, text[-6000:]
    assert re.search(r"rabit-run: server \d \(pid \d+\) was stopped \(SIGSTOP\) for [\d.]+ s, "
                     r"holding the workers' pulls; killed it", text), text[-6000:]
    assert ("restart 1 of 1" in text) == (replicas == 0), text[-6000:]
    for result in results(tmp_path, WORKERS):
        assert result["small"] == [float(steps * sum(r + 1 for r in range(WORKERS)))] * 5
        assert result["big"] == [float(steps * WORKERS)] * 200


@pytest.mark.parametrize("server,hogs", [(1, 2), (0, 0)])
def test_a_worker_and_a_server_killed_together(tmp_path, server, hogs):
    # A burst: worker 1 and a server SIGKILLed at once (beside CPU hogs for
    # server 1). Server 1 (Note [replaced servers]): if server 0 replaces it
    # before it sees the worker die, the new server learns of the dead
    # worker from server 0 and takes part in accepting the worker's
    # replacement, all in the job; if server 0 saw the worker die first, the
    # accept under way includes the dead server: the job ends saying so and
    # the restart resumes from the shard checkpoints. Server 0: a
    # replacement worker connects on server 0's port, which died with it:
    # if the servers saw the worker die before the new server 0 published
    # its port, the job ends, saying so, and restarts; else the replacement
    # finds the new port (Note [the servers' port]). Exact sums in every case.
    killed = []
    steps = 200
    with cpu_hogs(hogs):
        code, text = run(servers_job(WORKERS, 2, "resume", "--mode", "dist_ssp", "--staleness",
                                     "1", "--iterations", str(steps), "--pace", "0.02",
                                     "--replicas", "1", "--checkpoint-every", "4", "--out",
                                     str(tmp_path), restarts=1, checkpoint_dir=tmp_path / "ck"),
                         timeout=240, on_line=kill_when_ready("both", killed, server=server))
    assert killed and code == 0, text[-6000:]
    if "restart 1 of" not in text:
        assert f"a new process took the place of server {server}" in text, text[-6000:]
        for index in (0, 1):
            assert f"server {index}: the replacement of worker 1 connected" in text, text[-6000:]
    else:
        # Whichever the survivor met first: the accept failing, or the death.
        assert "restart 1 of 1" in text, text[-6000:]
        accept_failed = re.search(r"server \d: (server 1|a server) died while the servers were "
                                  r"accepting the replacement of worker\(s\) \[1\]", text)
        port_died = server == 0 and re.search(
            r"server 1: server 0 died, and worker\(s\) \[1\] with it: a replacement worker "
            r"connects to the servers on server 0's port", text)
        assert accept_failed or port_died, text[-6000:]
    for result in results(tmp_path, WORKERS):
        assert result["small"] == [float(steps * sum(r + 1 for r in range(WORKERS)))] * 5
        assert result["big"] == [float(steps * WORKERS)] * 200
