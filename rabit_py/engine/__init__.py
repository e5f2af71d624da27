"""The engines behind the public API (tier T1 of DESIGN.md, "Tiers").

``base`` is the interface every engine implements; ``mpi`` the plain engine;
``robust`` the fault-tolerant one, with what only it uses in the
``recovery`` subpackage; ``mock`` the robust engine with injected faults.
The other modules are the call path that every engine shares (the call frame,
transports, reduction, shared memory, checkpoints and the durable store).

Rules (checked by ``tests/unit/test_layout.py``): modules here import only
this package and tier T0 (``errors``, ``config``, ``ops``, ``_status``,
``_arrays``...), never the facade or a feature; the call path never imports
``robust``, ``mock`` or ``recovery``; device transports (``rabit_py.gpu``)
are given to :func:`create` by its caller, so that this package never imports
them. Importing this package does not import MPI: :func:`create` imports the
engine it makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ..config import Config
    from .base import DeviceTransports, Engine

__all__ = ["create", "checkpoint_folder_problem", "report_init_error"]


def create(config: "Config", comm: Optional[Any] = None,
           device_transports: Optional[DeviceTransports] = None) -> "Engine":
    """Make the engine that ``config.engine`` names, on ``comm`` (default
    ``MPI.COMM_WORLD``); ``"auto"`` is the robust engine where MPI can recover
    from failures (or in a replacement process), else the plain engine.

    Args:
        config: the job's settings.
        comm: an mpi4py intra-communicator to run on (duplicated).
        device_transports: makes the transports for device arrays; without
            it device arrays are refused as any unknown type is.

    Raises:
        RabitError: the settings need an engine that this job cannot run.
        TypeError: ``comm`` is not an intra-communicator.
    """
    import logging

    from ..errors import RabitError
    from ._startup import ulfm_enabled
    from .base import Engine
    from .mpi import MpiEngine

    name = config.engine
    if name == "auto":
        from .recovery import is_replacement

        # A replacement process is robust by definition; otherwise recovery
        # needs the job to have been started with fault tolerance.
        name = "robust" if (ulfm_enabled() or is_replacement()) else "mpi"
        logging.getLogger("rabit_py").debug(
            "engine='auto' chose %r (MPI fault tolerance %s)", name,
            "on" if ulfm_enabled() else "off")
    if config.spares and name == "mpi":
        raise RabitError(
            f"RABIT_SPARES={config.spares}: spares replace failed ranks, which only the robust "
            f"engine does; launch the job with fault tolerance (`rabit-run --spares "
            f"{config.spares} -n N python ...`) or set RABIT_SPARES=0")
    link, port = None, ""
    if config.servers:
        comm, link, port = _split_off_servers(config, comm, name)
    if name == "mock":
        from .mock import MockEngine
        engine: Engine = MockEngine(config, comm, device_transports=device_transports)
    elif name == "robust":
        from .robust import RobustEngine
        engine = RobustEngine(config, comm, device_transports=device_transports)
    else:
        engine = MpiEngine(config, comm, device_transports=device_transports)
    engine.server_link, engine.server_port = link, port
    return engine


def _split_off_servers(config: "Config", comm: Optional[Any], name: str) -> tuple:
    """The workers' communicator and the link to the servers (Note [server
    processes] in ``rabit_py/_servers.py``)."""
    from .._servers import WORKER, split_world
    from .._status import Reporter
    from ..errors import RabitError
    from ._lifecycle import abort_init
    from ._mpistart import MPI
    from ._watchdog import deadline

    if comm is not None:
        raise ValueError(f"RABIT_SERVERS={config.servers}: the servers are the last processes "
                         f"of MPI.COMM_WORLD; they cannot be used with init(comm=...)")
    if config.spares:
        raise RabitError(f"RABIT_SERVERS={config.servers} with RABIT_SPARES={config.spares}: "
                         f"spares and server processes are not combined yet; drop one")
    if name != "mpi":
        from .recovery import is_replacement

        if is_replacement():
            # Outside COMM_WORLD: its store connects to the servers itself
            # (connect_replacement in rabit_py/_servers.py).
            return None, None, ""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    with deadline(config.timeout, lambda _: abort_init(
            world, Reporter.for_rank(config.run_status_dir, rank), rank, config.timeout),
            "init"):
        return split_world(world, config.servers, WORKER)


def report_init_error(exc: BaseException, rank: int, every_rank: bool = False) -> None:
    """Print an error of ``init`` once for the whole job if it is left
    uncaught and every rank raises it (a bad setting, ranks with different
    settings, an unusable checkpoint folder: Note [one failure, read once]
    in ``_lifecycle.py``). ``every_rank`` marks ``exc`` as raised everywhere."""
    from ._lifecycle import is_every_rank, mark_every_rank, print_once

    if every_rank:
        mark_every_rank(exc)
    if is_every_rank(exc):
        print_once(exc, rank)


def checkpoint_folder_problem(folder: str, trust: bool = False) -> Optional[str]:
    """Why durable checkpoints cannot be kept in ``folder`` (it is a file,
    it cannot be made, it is not writable, or, unless ``trust``, other users
    can write it), or None if they can. No MPI."""
    from ._store import folder_problem

    return folder_problem(folder, trust)
