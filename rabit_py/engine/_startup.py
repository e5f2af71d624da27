"""Starting an engine on a communicator: duplicates of it, the agreement on
settings, and whether MPI fault tolerance (ULFM) is on."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Tuple

from ._mpistart import MPI

from .._status import SETUP, Reporter
from ..config import Config
from ..errors import RabitError
from ._lifecycle import mark_every_rank
from . import _control as control

__all__ = ["check_same_settings", "duplicates", "ulfm_enabled"]

# Settings that may differ from rank to rank (everything else must agree).
_PER_RANK_SETTINGS = frozenset({"log_level"})


def check_same_settings(comm: Any, config: Config) -> List[str]:
    """At start-up, collectively: every rank must run with the same settings
    (on several hosts a ``RABIT_*`` variable that was not forwarded leaves
    some ranks without it: ranks without the checkpoint folder, say, and the
    others waiting for them in ``load_checkpoint`` until the timeout).
    Returns each rank's host (for Note [fixed groups] in ``_shm.py``).

    Raises:
        RabitError: on every rank, naming each setting that differs and which
            ranks have which value.
    """
    mine = {k: v for k, v in dataclasses.asdict(config).items() if k not in _PER_RANK_SETTINGS}
    gathered = control.allgather(comm, (mine, MPI.Get_processor_name()), "startup.settings")
    everyone = [g[0] for g in gathered]
    differ = []
    for name in mine:
        holders: Dict[str, List[int]] = {}
        for rank, settings in enumerate(everyone):
            holders.setdefault(repr(settings.get(name)), []).append(rank)
        if len(holders) > 1:
            values = "; ".join(f"{value} on rank(s) {_ranks(ranks)}"
                               for value, ranks in holders.items())
            differ.append(f"{name} (RABIT_{name.upper()}): {values}")
    if differ:
        message = (f"rank {comm.Get_rank()}: the ranks were started with different rabit_py "
                   f"settings: {' | '.join(differ)}. Settings come from RABIT_* variables and "
                   f"init() arguments and must be the same on every rank: across hosts, "
                   f"forward the variables (rabit-run does; with mpirun add -x RABIT_NAME for "
                   f"each)")
        # A restart would start the job the same way.
        Reporter.for_rank(config.run_status_dir, comm.Get_rank()).fatal(SETUP, message)
        raise mark_every_rank(RabitError(message))
    return [g[1] for g in gathered]


def _ranks(ranks: List[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else \
        f"{', '.join(map(str, ranks[:8]))} and {len(ranks) - 8} more"


def ulfm_enabled() -> bool:
    """Whether this process runs with MPI fault tolerance (ULFM).

    Open MPI sets ``OMPI_MCA_mpi_ft_enable`` in the ranks it starts with
    ``mpirun --with-ft ulfm`` (``rabit-run`` adds the flag).
    """
    flag = os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower()
    return flag in ("1", "true", "yes", "on", "enabled") and hasattr(MPI.Comm, "Revoke")


def duplicates(base: Any) -> Tuple[Any, Any]:
    """Two duplicates of ``base`` that return errors (collective)."""
    comm = base.Dup()
    try:
        ctrl = base.Dup()
    except BaseException:
        comm.Free()
        raise
    for c in (comm, ctrl):
        c.Set_errhandler(MPI.ERRORS_RETURN)
    return comm, ctrl
