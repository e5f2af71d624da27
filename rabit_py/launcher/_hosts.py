"""The host list of a job on several hosts: reading it from the mpirun
options, probing the hosts after a failed attempt, and leaving the lost ones
out of the next (Note [several hosts] in ``_command.py``; for a Slurm
allocation's nodes, Note [slurm nodes] in ``_slurm.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ._command import Launch
from ._slurm import narrowed_environment, srun_probe

__all__ = ["PROBE_TIMEOUT_S", "host_list", "reachable_hosts", "probe_all",
           "leave_out_lost_hosts"]


PROBE_TIMEOUT_S = 15.0
_HOSTFILE_OPTIONS = ("--hostfile", "-hostfile", "--machinefile", "-machinefile")
_HOST_OPTIONS = ("--host", "-host", "-H")


def host_list(words: Sequence[str]) -> Optional[Tuple[int, int, List[Tuple[str, Optional[int]]]]]:
    """The host list that ``words`` (an mpirun command or options) give:
    (index of the option, words it takes, [(host, slots or None)]), or None.

    Raises:
        FileNotFoundError: the hostfile cannot be read.
    """
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in _HOSTFILE_OPTIONS + _HOST_OPTIONS:
            continue
        taken = 1 if eq else 2
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        hosts: List[Tuple[str, Optional[int]]] = []
        if name in _HOST_OPTIONS:
            for item in value.split(","):
                host, _, slots = item.partition(":")
                hosts.append((host, int(slots) if slots.isdigit() else 1))
        else:
            with open(value) as f:
                for line in f:
                    fields = line.split("#", 1)[0].split()
                    if not fields:
                        continue
                    slots = next((int(f.split("=", 1)[1]) for f in fields[1:]
                                  if f.startswith("slots=") and f[6:].isdigit()), None)
                    hosts.append((fields[0], slots))
        return i, taken, hosts
    return None


def _probe_command(cmd: Sequence[str], host: str) -> List[str]:
    """A one-process mpirun on ``host`` with ``cmd``'s MCA options."""
    probe = [cmd[0], "-n", "1", "--host", f"{host}:1"]
    i = 1
    while i < len(cmd):
        word = cmd[i]
        if word in ("--mca", "-mca", "--prtemca", "--gmca", "-gmca"):
            probe += cmd[i:i + 3]
            i += 3
            continue
        if word in ("--allow-run-as-root",):
            probe.append(word)
        i += 1
    return probe + ["true"]


def reachable_hosts(cmd: Sequence[str], hosts: Sequence[str],
                    timeout: float = PROBE_TIMEOUT_S) -> Dict[str, bool]:
    """Probe every host at once (Note [several hosts]): whether MPI can
    start a process there."""
    return probe_all({h: _probe_command(cmd, h) for h in hosts}, timeout)


def probe_all(commands: Dict[str, List[str]], timeout: float,
              env: Optional[Dict[str, str]] = None) -> Dict[str, bool]:
    """Run each host's probe command at once; whether each exited 0 within
    ``timeout`` (those still running then are ended)."""
    from ._supervisor import kill_tree

    procs = {h: subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True, env=env)
             for h, command in commands.items()}
    deadline = time.monotonic() + timeout
    answers: Dict[str, bool] = {}
    for host, proc in procs.items():
        try:
            answers[host] = proc.wait(timeout=max(0.0, deadline - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            answers[host] = False
        kill_tree(proc.pid)
        proc.wait()
    return answers


def leave_out_lost_hosts(launch: Launch, folder: str) -> Optional[str]:
    """After a failed attempt on several hosts: probe them and, if some are
    lost, start the next attempt without them. Returns why the job cannot
    be restarted (not slots enough), else None."""
    if not launch.hosts or len(launch.hosts) < 2:
        return None
    names = [h for h, _ in launch.hosts]
    answers = (probe_all({n: srun_probe(n) for n in names}, PROBE_TIMEOUT_S,
                         {**os.environ, **launch.env})
               if launch.slurm else reachable_hosts(launch.options(), names))
    lost = [h for h, ok in answers.items() if not ok]
    if not lost:
        return None
    left = [(h, s) for h, s in launch.hosts if answers[h]]
    slots = sum(s or 0 for _, s in left) if all(s for _, s in left) else None
    if not left or (slots is not None and slots < launch.processes
                    and "--oversubscribe" not in launch.cmd):
        return (f"host(s) {', '.join(lost)} cannot be reached, and the hosts left "
                f"({', '.join(h for h, _ in left) or 'none'}) have {slots or 0} slot(s) for "
                f"{launch.processes} process(es): "
                + ("make the allocation with room for a lost node (more tasks than ranks: "
                   "salloc -N 3 -n 6 and rabit-run -n 4)" if launch.slurm else
                   "add hosts to the list")
                + ", or restart with fewer ranks (possible with checkpoints that have no "
                  "local models)")
    probe = "srun of one process" if launch.slurm else "a one-process mpirun"
    print(f"rabit-run: host(s) {', '.join(lost)} cannot be reached ({probe} there failed or did "
          f"not answer within {PROBE_TIMEOUT_S:g} s); the next attempt runs on "
          f"{', '.join(h for h, _ in left)}", file=sys.stderr, flush=True)
    if launch.slurm:
        # Note [slurm nodes]: mpirun takes the nodes from Slurm's variables.
        launch.env.update(narrowed_environment([(h, s or 1) for h, s in left]))
        launch.hosts = left
        return None
    hostfile = os.path.join(folder, f"hostfile-{len(os.listdir(folder))}")
    with open(hostfile, "w") as f:
        f.writelines(f"{h}{f' slots={s}' if s else ''}\n" for h, s in left)
    found = host_list(launch.options())
    assert found is not None
    index, taken, _ = found
    launch.cmd = launch.cmd[:index] + ["--hostfile", hostfile] + launch.cmd[index + taken:]
    launch.hosts = left
    return None
