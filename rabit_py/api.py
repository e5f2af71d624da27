"""The public functions of rabit_py: a thin facade over the one current engine.

Names follow Rabit's Python wrapper. Nothing here talks to MPI; the engine
modules are imported by :func:`init`, so ``import rabit_py`` starts nothing.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, List, Optional

import numpy as np

from .config import Config
from .engine import create as create_engine
from .engine.base import (BROADCAST, CheckpointResult, Engine, EngineInfo, PrepareFn, Resources,
                          Transport)
from .errors import NotInitializedError, RabitError
from ._servers import say_goodbye
from .ops import OpLike

__all__ = ["init", "finalize", "get_rank", "get_world_size", "is_distributed",
           "get_processor_name", "allreduce", "broadcast", "allgather", "checkpoint",
           "lazy_checkpoint", "load_checkpoint", "version_number", "tracker_print",
           "session", "abort", "is_initialized", "select_device", "engine_info",
           "resources", "server_comm"]

log = logging.getLogger("rabit_py")

# The one piece of module state: the engine between init() and finalize().
_engine: Optional[Engine] = None


def _current() -> Engine:
    if _engine is None:
        raise NotInitializedError(
            "rabit_py is not initialized: call rabit.init() (or use `with rabit.session():`) "
            "before any other rabit_py call")
    return _engine


def init(engine: Any = "auto", comm: Optional[Any] = None, **config: Any) -> None:
    """Join the job.

    Args:
        engine: ``"mpi"`` (plain), ``"robust"`` (fault tolerant), ``"mock"``
            (robust plus fault injection) or ``"auto"`` (the ``RABIT_ENGINE``
            variable if set, else the best engine available). Rabit's call
            forms are accepted too: ``init(sys.argv)``, ``init(args,
            lib='mock')`` (Note [Rabit arguments] in ``config.py``).
        comm: an mpi4py intra-communicator to run on instead of
            ``MPI.COMM_WORLD`` (e.g. a ``Split`` of it). It is duplicated.
        **config: settings of :class:`rabit_py.config.Config` (``timeout``,
            ``check``, ...); they win over ``RABIT_*`` variables. Rabit's
            ``args``, ``lib`` and ``lib_dll`` are accepted.

    Raises:
        RabitError: already initialized, or the engine is not available.
        TypeError: an unknown setting, or ``comm`` is not a communicator.
        ValueError: an invalid setting value.
    """
    global _engine
    if _engine is not None:
        raise RabitError("rabit_py is already initialized in this process; "
                         "call rabit.finalize() before init() again")
    try:
        engine, comm, config = _rabit_call_form(engine, comm, config)
        cfg = Config.from_env(engine=None if engine == "auto" else engine, **config)
    except (TypeError, ValueError) as exc:
        _read_once(exc, every_rank=True)    # the same program and settings everywhere
        raise
    cfg.apply_logging()
    try:
        _engine = create_engine(cfg, comm, device_transports=_device_transports)
    except Exception as exc:
        _read_once(exc)
        raise
    log.debug("rank %d/%d: %s started", _engine.rank, _engine.world_size,
              type(_engine).__name__)


def _rabit_call_form(engine: Any, comm: Any, config: dict) -> tuple:
    """Rabit's ``init(args=None, lib='standard', lib_dll=None)`` in rabit_py's
    terms: ``(engine, comm, settings)``; rabit_py's own form unchanged."""
    positional = not isinstance(engine, str)        # init(args[, lib]), Rabit's order
    if not positional and not {"args", "lib", "lib_dll"} & set(config):
        return engine, comm, config
    from .config import from_rabit_args

    config = dict(config)
    args = engine if positional else config.pop("args", None)
    lib_given = positional and isinstance(comm, str)
    lib = comm if lib_given else config.pop("lib", "standard")
    name, settings = from_rabit_args(args, lib, config.pop("lib_dll", None))
    if not positional and engine != "auto" and name == "auto":
        name = engine
    return name, (None if lib_given else comm), {**settings, **config}


def _read_once(exc: BaseException, every_rank: bool = False) -> None:
    """An error of ``init`` that every rank raises (a bad setting, ranks with
    different settings, an unusable checkpoint folder) is printed once if
    left uncaught (Note [one failure, read once] in ``engine/_lifecycle.py``)."""
    from .config import launched_rank
    from .engine import report_init_error

    report_init_error(exc, launched_rank(), every_rank)


def _device_transports(engine: Engine) -> List[Transport]:
    """The transports of device arrays (``rabit_py.gpu``), made at an
    engine's first call on one (Note [transports] in ``engine/_transports.py``)."""
    from .gpu import device_transports

    return device_transports(engine)


def finalize() -> None:
    """Leave the job cleanly. Collective.

    Safe to call when not initialized (it does nothing then).

    Raises:
        CollectiveMismatchError: another rank was still making collective calls.
    """
    global _engine
    engine, _engine = _engine, None
    if engine is not None:
        try:
            engine.finalize()
        finally:
            if engine.server_link is not None:
                say_goodbye(engine.server_link, engine.config.servers)


@contextlib.contextmanager
def session(engine: str = "auto", comm: Optional[Any] = None,
            **config: Any) -> Iterator[None]:
    """``init(...)`` on entry and ``finalize()`` on exit, as a context manager::

        with rabit.session(timeout=60):
            rabit.allreduce(grad, rabit.Op.SUM)

    Args:
        engine: as :func:`init`: ``"mpi"``, ``"robust"``, ``"mock"`` or ``"auto"``.
        comm: as :func:`init`: an mpi4py intra-communicator to run on.
        **config: as :func:`init`: settings of :class:`rabit_py.config.Config`.

    Raises:
        RabitError, TypeError, ValueError: as :func:`init`.
    """
    init(engine, comm, **config)
    try:
        yield
    finally:
        finalize()


def get_rank() -> int:
    """This process's rank, 0..world_size-1.

    Raises:
        NotInitializedError: before ``init()``.
    """
    return _current().rank


def get_world_size() -> int:
    """Number of ranks in the job.

    Raises:
        NotInitializedError: before ``init()``.
    """
    return _current().world_size


def is_initialized() -> bool:
    """Whether this process is in a job (between ``init`` and ``finalize``).
    Never raises."""
    return _engine is not None


def is_distributed() -> bool:
    """Whether the job is initialized and has more than one rank. Never raises."""
    return _engine is not None and _engine.world_size > 1


def engine_info() -> EngineInfo:
    """What the engine of this process is and how the job runs: the engine's
    name, rank and size, the version, this rank's trial (times its process
    was replaced) and how it joined, rabit-run's restart, in-job recoveries,
    the transports a call may take, whether NCCL and shared memory are used,
    and the result cache's use (:class:`rabit_py.engine.base.EngineInfo`).
    Not collective; cheap.

    Raises:
        NotInitializedError: before ``rabit_py.init()``.
    """
    return _current().info()


def server_comm() -> Optional[Any]:
    """The mpi4py communicator that reaches the job's parameter-server
    processes, or None in a job without them (Note [server processes] in
    ``rabit_py/_servers.py``): all processes, the workers first (ranks 0 ..
    W-1, as in the job), then the servers; point-to-point use only, on the
    KVStore's protocol (``rabit_py.kvstore``). Not collective.

    Raises:
        NotInitializedError: before ``rabit_py.init()``.
    """
    return _current().server_link


def resources() -> Resources:
    """What the features keep with the current engine, closed at
    ``finalize()`` (the one communication thread of the bucketer, the torch
    adapter and the KVStore; the device transports' state). For the
    features built on this facade (``rabit_py.ddp``); programs do not need it.

    Raises:
        NotInitializedError: before ``rabit_py.init()``.
    """
    return _current().resources


def select_device() -> int:
    """Make GPU ``rank % device_count`` CuPy's current device, and return its
    index: one rank per GPU where ranks fill each node in blocks of its GPU
    count (a node's first G ranks on its G GPUs: Open MPI's default by-slot
    placement with as many slots as GPUs, or ``--map-by ppr:G:node``). A
    replacement that takes a dead rank's number takes its GPU. Not
    collective. For torch: ``torch.cuda.set_device(rabit.select_device())``.
    (It was ``rabit_py.gpu.select_device``: the README's "Moved" list.)

    Raises:
        ImportError: CuPy is not installed.
        RabitError: no CUDA device is visible to this process.
        NotInitializedError: before ``rabit_py.init()``.
    """
    import os

    import cupy  # noqa: PLC0415 - only for GPU programs

    rank = _current().rank
    count = cupy.cuda.runtime.getDeviceCount()
    if count < 1:
        raise RabitError(f"rank {rank}: no CUDA device is visible to this process "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                         f"use NumPy arrays, or run where a GPU is")
    device = rank % count
    cupy.cuda.Device(device).use()
    return device


def get_processor_name() -> str:
    """Name of the host this rank runs on.

    Raises:
        NotInitializedError: before ``init()``.
    """
    return _current().processor_name()


def allreduce(data: np.ndarray, op: OpLike,
              prepare_fun: Optional[PrepareFn] = None) -> np.ndarray:
    """Reduce ``data`` across all ranks **in place** and return it.

    Collective: every rank must call it in the same order.

    Args:
        data: a C-contiguous, writeable NumPy array (bool, int8-64, uint8-64,
            float16/32/64, complex64/128), of the same shape and dtype on every
            rank. Strided views are refused rather than silently copied.
        op: ``Op.MAX, MIN, SUM, PROD, BITOR, BITAND, BITXOR`` (bit ops on
            integer or bool arrays), or a reducer from ``Op.create(fn)``.
        prepare_fun: ``prepare_fun(data)`` fills the buffer just before the
            reduction; it is skipped when the result is recovered from a peer.

    Returns:
        ``data``, now holding the reduction.

    Raises:
        TypeError, ValueError: bad input (before any communication).
        CollectiveMismatchError: ranks disagree on the call (raised on every rank).
        CollectiveTimeoutError: the call did not complete within ``timeout``.
        NotInitializedError: before ``init()``.
    """
    engine = _engine if _engine is not None else _current()     # the hot path: no call
    return engine.transport(data, op).allreduce(data, op, prepare_fun)


def broadcast(data: Any, root: int = 0) -> Any:
    """Broadcast from ``root``.

    Collective: every rank must call it in the same order.

    If the root passes a NumPy array, ranks that pass an array of the same
    shape and dtype receive it in place; ranks that pass anything else (e.g.
    ``None``) get a new array. If the root passes any other picklable object,
    every rank gets a copy of it.

    Args:
        data: the value on the root; a receive buffer or ``None`` elsewhere.
        root: the rank that sends.

    Returns:
        The root's value (the root gets back its own object).

    Raises:
        TypeError: the root's object cannot be pickled (raised on every rank),
            or bad input.
        ValueError: ``root`` is not a rank of the job.
        CollectiveMismatchError, CollectiveTimeoutError, NotInitializedError:
            as for :func:`allreduce`.
    """
    return _current().transport(data, BROADCAST).broadcast(data, root)


def allgather(data: np.ndarray) -> np.ndarray:
    """Concatenate every rank's array along axis 0, in rank order.

    Collective: every rank must call it in the same order.

    Args:
        data: an array with ``ndim >= 1`` (only read: views and read-only
            arrays are fine); the first dimension may differ between ranks,
            the dtype and trailing shape may not.

    Returns:
        A new array holding all ranks' rows.

    Raises:
        TypeError, ValueError: bad input.
        CollectiveMismatchError, CollectiveTimeoutError, NotInitializedError:
            as for :func:`allreduce`.
    """
    return _current().transport(data, None).allgather(data)


def checkpoint(global_model: Any, local_model: Any = None) -> None:
    """End a version: store the models so that recovery can restart from here.

    Collective: every rank must call it in the same order. Increments
    :func:`version_number`. Idiom (as in Rabit)::

        version, model = rabit.load_checkpoint()
        if version == 0:
            model = init_model()
        for it in range(version, num_iter):
            model = train_one_round(model)
            rabit.checkpoint(model)

    Args:
        global_model: picklable, identical on all ranks.
        local_model: optional picklable per-rank state.

    Raises:
        CheckpointError: a model cannot be pickled.
        CollectiveMismatchError, CollectiveTimeoutError, NotInitializedError.
    """
    _current().checkpoint(global_model, local_model)


def lazy_checkpoint(global_model: Any) -> None:
    """As :func:`checkpoint` for a global model only, serialized only if a
    failure needs it; do not change ``global_model`` until the next checkpoint.

    Collective: every rank must call it in the same order.
    """
    _current().lazy_checkpoint(global_model)


def load_checkpoint(with_local: bool = False) -> CheckpointResult:
    """The latest checkpoint.

    Collective: every rank must call it in the same order.

    Args:
        with_local: also return this rank's local model.

    Returns:
        ``(version, global_model)``, or ``(version, global_model, local_model)``;
        ``(0, None[, None])`` on a fresh start.

    Raises:
        CheckpointError: the stored model cannot be read back.
        NotInitializedError: before ``init()``.
    """
    return _current().load_checkpoint(with_local)


def version_number() -> int:
    """Number of checkpoints taken so far (the version to resume from).

    Raises:
        NotInitializedError: before ``init()``.
    """
    return _current().version_number()


def tracker_print(msg: str) -> None:
    """Print ``msg`` once for the whole job (from rank 0), flushed.

    Not collective: ranks other than 0 print nothing.

    Raises:
        NotInitializedError: before ``init()``.
    """
    _current().tracker_print(str(msg))


def abort(reason: str = "the program called rabit.abort()") -> None:
    """End the whole job now, as a failure: every rank stops, and rabit-run
    does not restart the job (a restart would meet the same reason).

    Not collective: one rank calls it (as ``MPI_Abort``). For an error that
    a restart can get past, raise an exception instead. Outside a job (before
    ``init()``) it ends this process.

    Args:
        reason: said on stderr and in rabit-run's verdict.

    Does not return.
    """
    import os
    import sys

    if _engine is None:
        sys.stderr.write(f"rabit_py: {reason}; exiting\n")
        sys.stderr.flush()
        os._exit(1)
    _engine.abort(str(reason))
