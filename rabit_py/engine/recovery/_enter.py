"""How a process enters a robust job: as one of the ranks the job started
with, as a spare waiting in the pool, or as a replacement spawned by the
survivors' repair (Note [repair] in ``_repair.py``, Note [spare refill] in
``_spares.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .._mpistart import MPI

from ..._status import Reporter
from ...config import Config
from ...errors import RabitError
from ._join import JoinState, is_replacement
from .._lifecycle import abort_init
from ._repair import join_as_replacement
from ._spares import SparePool, serve_as_spare, spare_reporter
from .._startup import ulfm_enabled
from .._watchdog import deadline

__all__ = ["Joined", "enter_job"]


@dataclasses.dataclass
class Joined:
    """Where a process stands once it is one of the job's ranks."""

    #: "start" (a rank the job started with), "spare" or "spawned"
    joined_as: str
    #: the communicator of the job's ranks (None: the caller's or COMM_WORLD)
    comm: Optional[Any]
    #: the job's settings (a replacement's come from the survivors)
    config: Config
    #: what the survivors told a replacement (None at the job's start)
    state: Optional[JoinState] = None
    #: the spare pool, when the job keeps spares
    pool: Optional[SparePool] = None

    @property
    def replacement(self) -> bool:
        return self.joined_as != "start"

    @property
    def owns_comm(self) -> bool:
        """Whether ``comm`` was made here (the engine runs on a Dup of it and
        frees it), not passed in by the caller."""
        return self.replacement or self.pool is not None


def enter_job(config: Config, comm: Optional[Any]) -> Joined:
    """Become one of the job's ranks. A spare returns only once it has taken
    a dead rank's place; a spawned replacement joins the survivors.

    Raises:
        RabitError: MPI fault tolerance is not enabled; the message says how
            to launch the job.
        ValueError: spares asked for with ``init(comm=...)``.
    """
    state: Optional[JoinState] = None
    pool: Optional[SparePool] = None
    joined_as = "spawned" if comm is None and is_replacement() else "start"
    if joined_as == "spawned":
        comm, _, state, pool = join_as_replacement(config.recovery_timeout)
        if pool is not None:
            pool.target = config.spares
        if comm is None:
            # Spawned as a new spare (Note [spare refill] in _spares.py).
            comm, state = serve_as_spare(pool, config)
            joined_as = "spare"
    elif not ulfm_enabled():
        raise RabitError(
            "engine='robust' needs MPI fault tolerance, which this job was started "
            "without: launch it with `rabit-run -n N python ...` or `mpirun --with-ft "
            "ulfm --prtemca state_base_recoverable 1 --mca pml ob1 ...`, or use engine='mpi' (no "
            "recovery)")
    elif config.spares:
        if comm is not None:
            raise ValueError("spares (RABIT_SPARES) are taken from MPI.COMM_WORLD: they "
                             "cannot be used with init(comm=...)")
        # Collective over every process: a rank that never calls init()
        # must not hang the others (as in MpiEngine's own start).
        world_rank = MPI.COMM_WORLD.Get_rank()
        reporter = spare_reporter(config) if world_rank >= MPI.COMM_WORLD.Get_size() - \
            config.spares else Reporter.for_rank(config.run_status_dir, world_rank)
        with deadline(config.timeout,
                      lambda _: abort_init(MPI.COMM_WORLD, reporter, world_rank,
                                           config.timeout), "init"):
            pool, comm = SparePool.start(config.spares)
        if comm is None:
            comm, state = serve_as_spare(pool, config)
            joined_as = "spare"
    if state is not None and state.settings:
        # The job's settings, whatever reached this process's environment.
        config = dataclasses.replace(Config(**state.settings), log_level=config.log_level)
    return Joined(joined_as, comm, config, state, pool)
