"""Starting a process that replaces a dead one (a worker rank's, spawned by
the robust engine's repair; a parameter server's, spawned by the surviving
servers): the MPI info of the spawn and the environment it carries (a T0
contract between ``rabit_py.engine.recovery`` and ``rabit_py.kvstore.server``)."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from ._status import STATUS_DIR_VARIABLE

__all__ = ["spawn_environment", "spawn_info"]


# What a replacement needs in its environment before it joins, most needed
# first; the other RABIT_* settings come with the join state.
_SPAWN_ENV_FIRST = ("PYTHONPATH", "PYTHONHASHSEED", STATUS_DIR_VARIABLE, "RABIT_ENGINE",
                    "RABIT_SPARES", "RABIT_RECOVERY_TIMEOUT", "RABIT_RESTART_COUNT")


def spawn_environment(environ: Dict[str, str], limit: int) -> str:
    """The ``PMIX_ENVAR`` value for a replacement: ``NAME=VALUE`` lines of the
    import path and the ``RABIT_*`` settings, most needed first, as many as
    fit in ``limit`` characters (an MPI info value: 255 in Open MPI; a value
    longer than that makes every spawn fail with MPI_ERR_INFO_VALUE, which a
    long checkpoint path and a few settings reach)."""
    names = [n for n in _SPAWN_ENV_FIRST if n in environ] + sorted(
        n for n in environ if n.startswith("RABIT_") and n not in _SPAWN_ENV_FIRST)
    lines: List[str] = []
    for name in names:
        line = f"{name}={environ[name]}"
        if "\n" in line or len("\n".join(lines + [line])) > limit:
            continue
        lines.append(line)
    return "\n".join(lines)


# Note [spawned jobs]
# ~~~~~~~~~~~~~~~~~~~
# The replacements of one repair are one MPI_Comm_spawn, so one PRRTE job.
# `mpirun --with-ft ulfm` makes only the job it launches recoverable: when one
# process of a spawned job died, PRRTE killed the others of that job (ranks
# replaced together: one of them killed took the others with it, and the
# spawn of the next repair could not finish). No spawn info key carries PMIx's "recoverable"
# (Open MPI 5's dpm.c passes a fixed list), so rabit-run sets PRRTE's default
# for every job: `--prtemca state_base_recoverable 1`. A plain mpirun needs
# the same option (README, "Fault tolerance").


# Note [spawn inside an allocation]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Inside a Slurm allocation PRRTE takes the slots Slurm gave as fixed and
# counts a dead rank's slot as taken: with every slot of the allocation in
# use (salloc -N 2 -n 4 and 4 ranks), the spawn of a replacement failed ("All
# nodes which are allocated for this job are already filled") and so did
# every repair after it. A spawn maps by slot and may oversubscribe
# (``map_by slot:OVERSUBSCRIBE``): a node with a free slot still takes the
# replacement first (a spare slot of the allocation, or another host of a
# hostfile), and only when there is none does it share one, as the dead rank
# did. Bits do not depend on where it runs (Note [fixed groups] in _shm.py).


def spawn_info() -> Any:
    """The MPI info (``MPI.Info``) of a spawn: our working folder and
    environment, and Note [spawn inside an allocation]."""
    from mpi4py import MPI

    info = MPI.Info.Create()
    info.Set("wdir", os.getcwd())
    info.Set("map_by", "slot:OVERSUBSCRIBE")
    # The replacement is started by the MPI daemon, whose environment is not
    # ours: pass the import path and the settings explicitly (the rest of the
    # settings follow in the join state: a worker's JoinState.settings, a
    # server's handover).
    passed = spawn_environment(dict(os.environ), MPI.MAX_INFO_VAL - 1)
    if passed:
        info.Set("PMIX_ENVAR", passed)
    return info
