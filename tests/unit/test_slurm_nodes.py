"""Note [slurm nodes] (rabit_py/launcher/_slurm.py): a Slurm allocation as
rabit-run's host list, its lost nodes left out of the next attempt through
the narrowed Slurm variables; srun as the launch agent inside an allocation;
--launcher srun refuses the engines that need MPI fault tolerance. Slurm's
commands are stand-ins here; tests/jobs/test_slurm.py runs a real Slurm."""

import os
import subprocess

import pytest

from rabit_py import launcher
from rabit_py.launcher import _slurm
from rabit_py.launcher._command import Launch, agent_name, launch_agent
from rabit_py.launcher._hosts import leave_out_lost_hosts


def fake_tool(folder, name, script, monkeypatch):
    tool = folder / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return tool


@pytest.mark.parametrize("value,counts", [("4", [4]), ("2(x2),1", [2, 2, 1]),
                                          ("1,3(x3)", [1, 3, 3, 3])])
def test_task_counts_are_expanded_per_node(value, counts):
    assert _slurm.task_counts(value) == counts


@pytest.mark.parametrize("value", ["", "2(x)", "two", "2;1"])
def test_a_task_count_list_not_in_slurms_form_is_refused(value):
    with pytest.raises(ValueError, match="not a Slurm task count list"):
        _slurm.task_counts(value)


def test_the_allocations_nodes_come_from_scontrol_with_their_slots(tmp_path, monkeypatch):
    log = tmp_path / "log"
    fake_tool(tmp_path, "scontrol", f'echo "$*" > {log}\necho "n1\nn2\nn3"\n', monkeypatch)
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2,1(x2)",
           "PATH": os.environ["PATH"]}
    assert _slurm.allocation(env) == [("n1", 2), ("n2", 1), ("n3", 1)]
    assert log.read_text().split() == ["show", "hostnames", "n[1-3]"]
    # Not several nodes, or the counts do not match the names: no host list.
    assert _slurm.allocation({**env, "SLURM_TASKS_PER_NODE": "4"}) is None
    assert _slurm.allocation({k: v for k, v in env.items() if k != "SLURM_JOB_NODELIST"}) is None


def test_the_narrowed_variables_name_only_the_nodes_left():
    env = _slurm.narrowed_environment([("n1", 2), ("n3", 2)])
    assert env["SLURM_JOB_NODELIST"] == env["SLURM_NODELIST"] == "n1,n3"
    assert env["SLURM_JOB_NUM_NODES"] == env["SLURM_NNODES"] == "2"
    assert env["SLURM_TASKS_PER_NODE"] == env["SLURM_JOB_CPUS_PER_NODE"] == "2,2"
    assert env["SLURM_OVERLAP"] == "1"


def test_a_lost_node_is_left_out_through_the_slurm_variables(tmp_path, monkeypatch, capsys):
    # srun cannot start a process on n2: the next attempt's mpirun gets the
    # allocation narrowed to n1 and n3 (no hostfile: mpirun takes the nodes
    # from Slurm).
    log = tmp_path / "log"
    fake_tool(tmp_path, "srun", f'echo "$*" >> {log}\ncase "$*" in *"-w n2 "*) exit 1;; esac\n',
              monkeypatch)
    launch = Launch(["mpirun", "-n", "4", "prog"], 4, processes=4, program_words=1,
                    hosts=[("n1", 2), ("n2", 2), ("n3", 2)], slurm=True)
    assert leave_out_lost_hosts(launch, str(tmp_path)) is None
    assert launch.hosts == [("n1", 2), ("n3", 2)]
    assert launch.env["SLURM_JOB_NODELIST"] == "n1,n3"
    assert launch.cmd == ["mpirun", "-n", "4", "prog"]
    assert sorted(line.split("-w ")[1].split()[0] for line in log.read_text().splitlines()) \
        == ["n1", "n2", "n3"]
    err = capsys.readouterr().err
    assert ("host(s) n2 cannot be reached (srun of one process there failed or did not answer "
            "within 15 s); the next attempt runs on n1, n3") in err


def test_too_few_task_slots_left_after_a_node_loss_is_said_clearly(tmp_path, monkeypatch):
    fake_tool(tmp_path, "srun", 'case "$*" in *"-w n2 "*) exit 1;; esac\n', monkeypatch)
    launch = Launch(["mpirun", "-n", "4", "prog"], 4, processes=4, program_words=1,
                    hosts=[("n1", 2), ("n2", 1), ("n3", 1)], slurm=True)
    why = leave_out_lost_hosts(launch, str(tmp_path))
    assert why is not None
    assert "the hosts left (n1, n3) have 3 slot(s) for 4 process(es)" in why
    assert "salloc -N 3 -n 6 and rabit-run -n 4" in why
    assert launch.env == {}


def test_rabit_run_takes_the_allocation_and_says_what_a_node_failure_does(
        tmp_path, monkeypatch, capsys):
    fake_tool(tmp_path, "scontrol", 'echo "n1 n2"\n', monkeypatch)
    mpirun = fake_tool(tmp_path, "mpirun", "exit 0\n", monkeypatch)
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                        "SLURM_JOB_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
                        "SLURM_NTASKS": "4"}.items():
        monkeypatch.setenv(name, value)
    assert launcher.main(["--no-ft", "--mpirun", str(mpirun), "--", "true"]) == 0
    err = capsys.readouterr().err
    assert ("rabit-run: Slurm allocation 7: 2 nodes (n1, n2); a node lost is left out of "
            "restarts; Slurm revokes the whole allocation when a node fails unless it was "
            "made with --no-kill") in err
    monkeypatch.setenv("SALLOC_NO_KILL", "1")
    assert launcher.main(["--no-ft", "--mpirun", str(mpirun), "--", "true"]) == 0
    err = capsys.readouterr().err
    assert "a node lost is left out of restarts" in err and "--no-kill" not in err


def test_inside_an_allocation_a_rank_on_another_node_is_reached_with_srun(
        tmp_path, monkeypatch):
    fake_tool(tmp_path, "srun", "exit 0\n", monkeypatch)
    agent = launch_agent(["mpirun", "-n", "2", "x"], {"SLURM_JOB_ID": "7"})
    assert agent[:2] == ["sh", "-c"] and "srun --overlap" in agent[2]
    assert agent_name(agent) == "srun"
    # AGENT HOST COMMAND: srun runs COMMAND on HOST.
    log = tmp_path / "srun-args"
    fake_tool(tmp_path, "srun", f'echo "$*" > {log}\n', monkeypatch)
    subprocess.run([*agent, "n2", "kill -KILL 123"], check=True)
    assert log.read_text().split() == ["--overlap", "--quiet", "-N1", "-n1", "-w", "n2", "sh",
                                       "-c", "kill", "-KILL", "123"]
    # An rsh agent the user gave still wins.
    rsh = fake_tool(tmp_path, "myrsh", "exit 0\n", monkeypatch)
    assert launch_agent(["mpirun", "--mca", "plm_rsh_agent", str(rsh), "-n", "2", "x"],
                        {"SLURM_JOB_ID": "7"}) == [str(rsh)]


def test_srun_as_launcher_refuses_the_engines_that_recover_in_the_job(
        tmp_path, monkeypatch, capsys):
    fake_tool(tmp_path, "srun", "exit 0\n", monkeypatch)
    monkeypatch.setenv("RABIT_ENGINE", "robust")
    assert launcher.main(["-n", "2", "--launcher", "srun", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert ("the job cannot start: RABIT_ENGINE=robust recovers in the job, which needs MPI "
            "fault tolerance (mpirun --with-ft ulfm), and srun starts the ranks without it") \
        in err
