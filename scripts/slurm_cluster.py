"""A real Slurm cluster on one machine: Debian's slurmctld and slurmd over the
namespace hosts of ``cluster_demo.Hosts``.

    sudo "$(command -v python)" scripts/slurm_cluster.py
        [--hosts 3] [--cpus 2] [--scenario all|salloc|sbatch|kill-rank|lose-node|srun]
        [--xgboost] [--json out.json]

Each host runs its own ``slurmd`` (its own hostname, spool folder and log,
``-N`` its node name); the first host runs ``slurmctld`` and is where users
submit (a login node that is also a compute node). One ``munged`` with its
own socket serves every host (a socket is a file path: network namespaces do
not matter). The configuration lives in the hosts' folder and every Slurm
command reads it through ``SLURM_CONF``: nothing under ``/etc`` changes.
What was verified about Slurm on this machine is in
``shared/notes/slurm.md``.

Scenarios (``tests/programs/bsp_train.py`` on 4 ranks, each compared bitwise
with a failure-free run on this machine alone):

- ``salloc``: ``salloc -N 2 -n 4 --no-kill rabit-run ...``;
- ``sbatch``: the same job as a batch script (``sbatch --wait``);
- ``kill-rank``: one rank SIGKILLed on the second node inside the
  allocation: replaced in the job (the spawn may oversubscribe a slot of
  the allocation: Note [spawn inside an allocation]);
- ``lose-node``: ``salloc -N 3 -n 4 --no-kill`` (4 ranks on 2 of 3 nodes),
  every process of a node holding ranks SIGKILLed and its network cut:
  rabit-run restarts from the durable checkpoint on the nodes Slurm still
  has (Note [slurm nodes] in ``rabit_py/launcher/_hosts.py``);
- ``srun``: ``rabit-run --launcher srun`` (Slurm's own launch, PMIx), a
  rank killed: no in-job recovery there, a restart from the checkpoint.

``--xgboost`` runs real XGBoost through ``rabit_py.xgboost.train``
(``tests/programs/xgboost_train.py``) instead, compared with the booster
bytes of a one-machine run.

Needs root, the namespace tools of ``cluster_demo`` and Debian's
``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge``. Everything it
makes is removed at the end, however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster_demo  # noqa: E402
from cluster_demo import Hosts  # noqa: E402

SLURM_TOOLS = ("slurmctld", "slurmd", "munged", "salloc", "sbatch", "srun", "sinfo",
               "scontrol")


def can_make_cluster() -> Tuple[bool, str]:
    """Whether a Slurm cluster can be made here, and why not."""
    ok, why = cluster_demo.can_make_hosts()
    if not ok:
        return ok, why
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if missing:
        return False, (f"needs Slurm and munge ({', '.join(missing)} missing: apt-get install "
                       f"slurmctld slurmd slurm-client munge)")
    if not Path("/etc/munge/munge.key").exists():
        return False, "needs munge's key (/etc/munge/munge.key, made when munge is installed)"
    if not Path("/sys/fs/cgroup").is_dir():
        return False, "needs /sys/fs/cgroup (slurmd's cgroup plugin)"
    return True, ""


class SlurmCluster(cluster_demo.Made):
    """Slurm over ``hosts`` (a context manager: started on entry, stopped and
    removed on exit).

    Args:
        hosts: the namespace hosts (made by the caller); each is a node.
        cpus: CPUs Slurm gives each node.
        node_timeout: seconds of silence before slurmctld takes a node for
            down (``SlurmdTimeout``).
    """

    def __init__(self, hosts: Hosts, cpus: int = 2, node_timeout: int = 10) -> None:
        self.hosts = hosts
        self.cpus = cpus
        self.node_timeout = node_timeout
        self.folder = hosts.base / "slurm"
        self.conf = self.folder / "slurm.conf"
        self._munge = self.folder / "munge"
        self.env = {"SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------ making
    def _up(self) -> None:
        hosts = self.hosts
        for folder in (self.folder, self._munge, self.folder / "state", self.folder / "spool"):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o755)
        # munged checks that the folders above its socket are not writable by others.
        for folder in (hosts.base, hosts.base.parent):
            mode = folder.stat().st_mode
            if mode & 0o002 and not mode & 0o1000:
                raise RuntimeError(f"munged refuses {folder}: writable by all")
        os.chmod(hosts.base, 0o755)
        subprocess.run(["munged", "--force", f"--socket={self._munge}/socket",
                        f"--pid-file={self._munge}/pid", f"--log-file={self._munge}/log",
                        f"--seed-file={self._munge}/seed"], check=True,
                       capture_output=True, text=True)
        for name in hosts.names:
            (self.folder / "spool" / name).mkdir()
        nodes = "".join(f"NodeName={name} NodeAddr={hosts.address(name)} CPUs={self.cpus} "
                        f"State=UNKNOWN\n" for name in hosts.names)
        first = hosts.names[0]
        f = self.folder
        self.conf.write_text(
            "ClusterName=rabit\n"
            f"SlurmctldHost={first}({hosts.address(first)})\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={self._munge}/socket\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "MpiDefault=none\nReturnToService=2\n"
            f"SlurmdTimeout={self.node_timeout}\nMessageTimeout=5\nKillWait=5\n"
            "InactiveLimit=0\nMinJobAge=5\n"
            f"StateSaveLocation={f}/state\nSlurmdSpoolDir={f}/spool/%n\n"
            f"SlurmctldPidFile={f}/slurmctld.pid\nSlurmdPidFile={f}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={f}/slurmctld.log\nSlurmdLogFile={f}/slurmd-%n.log\n"
            + nodes +
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:4\n")
        # slurmd stops at start without a cgroup plugin; this machine has cgroup v1.
        version = "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1"
        cgroup = (f"CgroupPlugin=cgroup/{version}\nCgroupMountpoint=/sys/fs/cgroup\n"
                  "CgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\n")
        (self.folder / "cgroup.conf").write_text(cgroup)
        env = {**os.environ, **self.env}
        subprocess.run(hosts.command(["slurmctld", "-i", "-f", str(self.conf)]), check=True,
                       capture_output=True, text=True, env=env)
        for name in hosts.names:
            # Each slurmd reads its own copy of the files (the same slurm.conf):
            # the PMIx plugin's folders (mpi.conf) must be the host's own, as
            # its /tmp would be; the hosts here share the machine's /tmp.
            own = self.folder / f"conf-{name}"
            own.mkdir()
            shutil.copy(self.conf, own / "slurm.conf")
            (own / "cgroup.conf").write_text(cgroup)
            (own / "mpi.conf").write_text(f"PMIxCliTmpDirBase={hosts.base / name / 'tmp'}\n")
            subprocess.run(hosts.command(["slurmd", "-f", str(own / "slurm.conf"), "-N", name],
                                         name),
                           check=True, capture_output=True, text=True,
                           env={**env, "SLURM_CONF": str(own / "slurm.conf")})
        self.wait_idle(len(hosts.names), timeout=60)

    def down(self) -> None:
        """Stop munged (the Slurm daemons end with their hosts); the files go
        with the hosts' folder."""
        pid_file = self._munge / "pid"
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass

    # ------------------------------------------------------------ using
    def command(self, argv: Sequence[str], host: Optional[str] = None) -> List[str]:
        """``argv`` run inside ``host`` (default: the first, the login node)."""
        return self.hosts.command(argv, host)

    def run(self, argv: Sequence[str], timeout: float = 60) -> str:
        """Run a Slurm client command on the login node; its output."""
        out = subprocess.run(self.command(argv), capture_output=True, text=True,
                             timeout=timeout, env={**os.environ, **self.env})
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr}")
        return out.stdout

    def node_states(self) -> Dict[str, str]:
        """Each node's state as ``sinfo`` gives it (``idle``, ``alloc``, ``down*``...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_idle(self, count: int, timeout: float) -> None:
        """Wait until ``count`` nodes are idle."""
        deadline = time.monotonic() + timeout
        states: Dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                states = self.node_states()
            except RuntimeError:
                states = {}
            if sum(state == "idle" for state in states.values()) >= count:
                return
            time.sleep(0.5)
        logs = "".join(f"--- {p.name}\n{p.read_text()[-1500:]}"
                       for p in sorted(self.folder.glob("*.log")))
        raise RuntimeError(f"Slurm's nodes did not become idle in {timeout:.0f} s: {states}\n"
                           f"{logs}")


# ---------------------------------------------------------------- scenarios
SCENARIOS = ("salloc", "sbatch", "kill-rank", "lose-node", "srun")


def run_scenario(slurm: SlurmCluster, name: str, ranks: int, rounds: int,
                 timeout: float = 240, program: Optional[Sequence[str]] = None,
                 cue: str = "ROUND 2 done") -> dict:
    """Run one scenario (see the module's docstring) as a cluster user would,
    from the login node; returns its record (status, seconds, results,
    output). ``program`` (default: bsp_train.py for ``rounds`` rounds)
    prints ``START`` and ``RESULT`` lines as bsp_train.py does; the failure
    comes at the first output line that starts with ``cue``."""
    hosts = slurm.hosts
    program = (list(program) if program is not None
               else [*cluster_demo.PROGRAM, "--rounds", str(rounds), "--sleep", "0.3"])
    run = [sys.executable, "-m", "rabit_py.launcher", "-n", str(ranks),
           "--checkpoint-dir", str(hosts.shared / f"ckpt-{name}"), "--max-restarts", "2",
           "--restart-delay", "0.5"]
    env = {**cluster_demo.JOB_ENV, **slurm.env}
    # Two nodes of two CPUs hold the ranks; losing one needs room on a third.
    allocation = ["-N", "2", "-n", str(ranks), "--no-kill"]
    if name == "lose-node":
        allocation = ["-N", "3", "-n", str(ranks + 2), "--no-kill"]
    if name == "srun":
        # srun starts the ranks without MPI fault tolerance: the default
        # engine, and a killed rank costs a restart from the durable checkpoint.
        run += ["--launcher", "srun"]
        del env["RABIT_ENGINE"]
    output = hosts.shared / f"sbatch-{name}.out"
    if name == "sbatch":
        script = hosts.shared / "job.sh"
        script.write_text("#!/bin/sh\n"
                          + "".join(f"#SBATCH {option}\n" for option in
                                    ["-N 2", f"-n {ranks}", "--no-kill", f"-o {output}"])
                          + f"cd {shlex.quote(str(cluster_demo.ROOT))}\n"
                          + "exec " + shlex.join([*run, "--", *program]) + "\n")
        cmd = ["sbatch", "--wait", str(script)]
    else:
        cmd = ["salloc", *allocation, *run, "--", *program]
    lines: List[str] = []
    pids: Dict[int, int] = {}
    done: List[bool] = []

    def on_line(line: str) -> None:
        if line.startswith("START "):
            start = json.loads(line[6:])
            pids[start["rank"]] = start["pid"]
        if line.startswith(cue) and not done:
            done.append(True)
            if name in ("kill-rank", "srun"):
                victim = pids.get(ranks - 1)
                if victim is not None:
                    os.kill(victim, signal.SIGKILL)
                    lines.append(f"slurm_cluster: killed rank {ranks - 1} (pid {victim})\n")
            elif name == "lose-node":
                lost = hosts.names[1]
                hosts.signal_host(lost, signal.SIGKILL)
                hosts.cut(lost)
                lines.append(f"slurm_cluster: lost node {lost}\n")

    start = time.monotonic()
    proc = cluster_demo._start(slurm.command(cmd), env)
    reader = cluster_demo._reader(proc, lines, on_line)
    code = cluster_demo._finish(proc, lines, timeout)
    reader.join(timeout=10)
    if name == "sbatch" and output.exists():
        for line in output.read_text().splitlines(keepends=True):
            lines.append(line)
    return {"scenario": name, "status": code, "seconds": time.monotonic() - start,
            "results": cluster_demo._results("".join(lines)), "output": "".join(lines),
            "nodes": slurm.node_states()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--scenario", default="all", choices=("all",) + SCENARIOS)
    parser.add_argument("--xgboost", action="store_true",
                        help="run real XGBoost (tests/programs/xgboost_train.py) instead")
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args(argv)
    ok, why = can_make_cluster()
    if not ok:
        print(f"slurm_cluster.py: {why}", file=sys.stderr)
        return 2
    program: Optional[List[str]] = None
    cue, key = "ROUND 2 done", "model"
    if args.xgboost:
        program = cluster_demo.xgboost_program(args.rounds)
        cue, key = "ROUND 0 2", "sha"
    reference, _ = cluster_demo.reference(args.ranks, args.rounds, program)
    records = []
    for name in SCENARIOS if args.scenario == "all" else (args.scenario,):
        # A fresh cluster each: lose-node leaves one node dead.
        with Hosts(args.hosts, args.cpus) as hosts, SlurmCluster(hosts, args.cpus) as slurm:
            record = run_scenario(slurm, name, args.ranks, args.rounds, program=program,
                                  cue=cue)
        same = (record["status"] == 0 and sorted(record["results"]) == sorted(reference)
                and all(record["results"][r][key] == reference[r][key] for r in reference))
        record["bitwise"] = same
        records.append(record)
        print(f"{name:10s} exit {record['status']}  {record['seconds']:5.1f} s  "
              f"{'bitwise equal to the one-machine run' if same else 'DIFFERS'}  "
              f"nodes after: {record['nodes']}", flush=True)
        if not same:
            print(record["output"][-4000:], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{k: v for k, v in r.items() if k != "output"} for r in records], indent=1))
    return 0 if all(r["bitwise"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
