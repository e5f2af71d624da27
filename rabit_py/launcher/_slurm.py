"""A Slurm allocation as rabit-run's host list: its nodes and task slots, which
of them Slurm can still start a process on, and the environment that makes
the next attempt's mpirun use only those (Note [slurm nodes]).

# Note [slurm nodes]
Inside an allocation of several nodes mpirun takes the nodes from Slurm
itself (``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``) and starts its
daemons on them with ``srun``. When a node is lost (verified on a real Slurm
22.05 over namespace hosts, ``scripts/slurm_cluster.py``), PRRTE ends the
job, and a restart on the same allocation starts a daemon on the dead node
again and fails at launch, restart after restart. So rabit-run takes the
allocation's nodes as its host list (with ``scontrol show hostnames``, and
each node's task slots from ``SLURM_TASKS_PER_NODE``); after a failed
attempt it asks Slurm to start ``true`` on each node (``srun --overlap -N1
-n1 -w NODE``, all at once, ``PROBE_TIMEOUT_S`` at most: a dead slurmd fails
it within seconds, long before Slurm marks the node down), and gives the
next attempt's mpirun the Slurm variables narrowed to the nodes that
answered. PRRTE then maps and starts daemons on those only; the dead node
stays in the allocation, untouched. Too few slots left is said as for a
hostfile (``_hosts.py``).

Slurm revokes a whole allocation when one of its nodes fails unless it was
made with ``--no-kill``, and 22.05 does not let a job read that flag back
(neither ``scontrol show job`` nor the job's environment show it): rabit-run
says so at start unless ``SALLOC_NO_KILL``/``SBATCH_NO_KILL`` are set.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["task_counts", "allocation", "srun_probe", "narrowed_environment",
           "node_failure_warning"]

_SLURM_NODE_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")


def task_counts(value: str) -> List[int]:
    """``SLURM_TASKS_PER_NODE``'s counts, one per node: ``"2(x2),1"`` ->
    ``[2, 2, 1]``.

    Raises:
        ValueError: the value is not in Slurm's form.
    """
    counts: List[int] = []
    for item in value.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise ValueError(f"not a Slurm task count list: {value!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def allocation(environ: Mapping[str, str]) -> Optional[List[Tuple[str, int]]]:
    """The nodes of the Slurm allocation this process runs in, with each
    one's task slots, in Slurm's order; None outside an allocation, on one
    node, or where ``scontrol`` cannot list them."""
    nodes = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    tasks = environ.get("SLURM_TASKS_PER_NODE")
    if not nodes or not tasks or shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                             text=True, timeout=30, env=dict(environ))
        counts = task_counts(tasks)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    names = out.stdout.split()
    if out.returncode != 0 or len(names) < 2 or len(names) != len(counts):
        return None
    return list(zip(names, counts))


def srun_probe(node: str) -> List[str]:
    """The command that tells whether Slurm can start a process on ``node``
    now (Note [slurm nodes]); ``_hosts.probe_all`` runs it for every node."""
    return ["srun", "--overlap", "-N1", "-n1", "-w", node, "--quiet", "true"]


def narrowed_environment(nodes: Sequence[Tuple[str, int]]) -> Dict[str, str]:
    """The Slurm variables that make mpirun use only ``nodes`` (with their
    task slots) of the allocation."""
    names = ",".join(name for name, _ in nodes)
    slots = ",".join(str(count) for _, count in nodes)
    # SLURM_OVERLAP: srun's --overlap for the steps PRRTE starts its daemons
    # with. The last attempt's step still spans the lost node and cannot end
    # until Slurm gives that node up, holding its CPUs on the nodes left: a
    # new step without --overlap waited for them ("Requested nodes are
    # busy"), past 240 s.
    return {**{name: names for name in _SLURM_NODE_VARIABLES},
            "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
            "SLURM_TASKS_PER_NODE": slots, "SLURM_JOB_CPUS_PER_NODE": slots,
            "SLURM_OVERLAP": "1"}


def node_failure_warning(environ: Mapping[str, str], nodes: Sequence[Tuple[str, int]]) -> str:
    """What rabit-run says at the start of a job on an allocation of several
    nodes (Note [slurm nodes])."""
    job = environ.get("SLURM_JOB_ID", "?")
    line = (f"rabit-run: Slurm allocation {job}: {len(nodes)} nodes "
            f"({', '.join(name for name, _ in nodes)}); a node lost is left out of restarts")
    if not (environ.get("SALLOC_NO_KILL") or environ.get("SBATCH_NO_KILL")):
        line += ("; Slurm revokes the whole allocation when a node fails unless it was made "
                 "with --no-kill (salloc/sbatch -k), which a job cannot read back: make it so")
    return line
