"""The ``Engine`` interface every engine implements.

The facade (:mod:`rabit_py.api`) talks only to this interface. ``MpiEngine``
implements it on mpi4py; ``RobustEngine`` adds recovery; ``MockEngine`` adds
fault injection. Each subclass overrides a method, does its one extra job, and
calls ``super()``.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np

from ..ops import OpLike

__all__ = ["Engine", "EngineInfo", "PrepareFn", "CheckpointResult", "Transport", "DeviceTransports",
           "Resources", "BROADCAST"]

PrepareFn = Callable[[np.ndarray], Any]
CheckpointResult = Union[Tuple[int, Any], Tuple[int, Any, Any]]
#: The ``op`` that :meth:`Transport.enabled` gets for a broadcast (an
#: allreduce passes its op, an allgather None: it only moves bytes).
BROADCAST = "broadcast"

log = logging.getLogger("rabit_py")


class Transport(abc.ABC):
    """One path that carries collectives (Note [transports] in
    ``_transports.py``): the engine asks its candidates in order and the
    first one :meth:`enabled` for the call carries it."""

    #: a short name, for logs and tests
    name = "transport"

    @abc.abstractmethod
    def enabled(self, data: Any, op: Any) -> bool:
        """Whether this transport carries a call on ``data`` (``op``: the
        allreduce's op, None for an allgather, :data:`BROADCAST`). It must
        answer the same on every rank that makes the same call; it may decide
        collectively the first time (the call is collective anyway)."""

    @abc.abstractmethod
    def allreduce(self, data: Any, op: OpLike, prepare_fun: Optional[PrepareFn]) -> Any:
        """As :func:`rabit_py.allreduce`."""

    @abc.abstractmethod
    def broadcast(self, data: Any, root: int) -> Any:
        """As :func:`rabit_py.broadcast`."""

    @abc.abstractmethod
    def allgather(self, data: Any) -> Any:
        """As :func:`rabit_py.allgather`."""


#: Makes an engine's device transports, asked before its host transport
#: (Note [transports] in ``_transports.py``); called at the engine's first
#: call on a device array. ``rabit_py.gpu.device_transports`` is one.
DeviceTransports = Callable[["Engine"], List[Transport]]


@dataclasses.dataclass
class Resources:
    """What the device transports and the helper thread keep with an engine;
    each one's ``close()`` runs at finalize."""

    #: the NCCL backend (``rabit_py.gpu``), once the ranks chose it; it also
    #: carries device arrays in broadcast and allgather
    nccl: Any = None
    #: the ranks decided together to stage device arrays through host memory
    staged: bool = False
    #: page-locked host buffers by shape and dtype, for staged allreduces
    pinned: Any = None
    #: the one communication thread of the bucketer, torch adapter and KVStore
    comm_thread: Any = None
    #: the progress thread of the link to the server processes (the
    #: server-backed KVStore's), once a store made it
    server_client: Any = None

    def close(self, rank: int) -> None:
        """Close every resource (failures are logged: finalize goes on)."""
        for field in ("nccl", "pinned", "comm_thread", "server_client"):
            resource = getattr(self, field)
            if resource is None:
                continue
            try:
                resource.close()
            except Exception as exc:  # noqa: BLE001 - finalize goes on
                log.warning("rank %d: closing %r at finalize failed: %s", rank, resource, exc)
            setattr(self, field, None)
        self.staged = False


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What :func:`rabit_py.engine_info` tells about the engine of this
    process: for programs, tests and benchmarks that want to know how the job
    runs without reaching into private fields."""

    #: ``"mpi"``, ``"robust"`` or ``"mock"``
    engine: str
    rank: int
    world_size: int
    #: checkpoints taken (``version_number()``)
    version: int
    #: times this rank's process was replaced in this job (0: the process the
    #: job started with; always 0 with the plain engine)
    trial: int
    #: how this process joined: ``"start"``, ``"spare"`` or ``"spawned"``
    joined_as: str
    #: rabit-run's restart of the whole job this attempt is (0: the first)
    restart: int
    #: in-job recoveries so far and processes replaced in them
    recoveries: int
    replaced: int
    #: the transports a call may take, in the order they are asked
    #: (Note [transports]); the device ones appear at the first device call
    transports: Tuple[str, ...]
    #: whether the ranks chose NCCL for device arrays
    nccl: bool
    #: whether allreduce uses shared memory between the ranks of a host
    #: (Note [shm allreduce]; decided at the first allreduce that could)
    shared_memory: bool
    #: bytes of results kept for replay since the last checkpoint, the cache
    #: budget, and results not kept because of it (robust engine; else 0)
    cache_bytes: int
    cache_budget: int
    cache_refused: int
    #: what a checkpoint file may hold beyond data (``checkpoint_classes``),
    #: and whether any pickle is loaded (``trust_checkpoints``): Note
    #: [checkpoints are data] in ``rabit_py/_unpickle.py``
    checkpoint_classes: Tuple[str, ...] = ()
    trust_checkpoints: bool = False
    #: the job's parameter-server processes (``RABIT_SERVERS``), and their
    #: MPI port ("" where unknown: a replacement learns it from rank 0)
    servers: int = 0
    server_port: str = ""


class Engine(abc.ABC):
    """What a rabit_py engine provides. All collectives are blocking.

    Collective methods must be called by every rank in the same order.
    """

    #: the communicator that reaches the job's server processes (Note
    #: [server processes] in ``rabit_py/_servers.py``); None without servers
    #: (and in a replacement worker, whose store connects to ``server_port``)
    server_link: Optional[Any] = None
    #: the servers' MPI port ("" without servers, or unknown here)
    server_port: str = ""

    @property
    @abc.abstractmethod
    def config(self) -> Any:
        """The job's settings (a :class:`rabit_py.config.Config`)."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the job."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """Number of ranks in the job."""

    @abc.abstractmethod
    def processor_name(self) -> str:
        """Name of the host this rank runs on."""

    @abc.abstractmethod
    def allreduce(self, data: np.ndarray, op: OpLike,
                  prepare_fun: Optional[PrepareFn] = None) -> np.ndarray:
        """Reduce ``data`` across ranks in place and return it. Collective."""

    @abc.abstractmethod
    def broadcast(self, data: Any, root: int) -> Any:
        """Broadcast an array in place, or return the root's object. Collective."""

    @abc.abstractmethod
    def allgather(self, data: np.ndarray) -> np.ndarray:
        """Concatenate every rank's array along axis 0 in rank order. Collective."""

    @abc.abstractmethod
    def checkpoint(self, global_model: Any, local_model: Any = None) -> None:
        """End a version, storing the models for recovery. Collective."""

    @abc.abstractmethod
    def lazy_checkpoint(self, global_model: Any) -> None:
        """As ``checkpoint``, serializing the model only if needed. Collective."""

    @abc.abstractmethod
    def load_checkpoint(self, with_local: bool = False) -> CheckpointResult:
        """Return ``(version, global[, local])`` of the latest checkpoint. Collective."""

    @abc.abstractmethod
    def version_number(self) -> int:
        """Number of checkpoints taken so far."""

    @abc.abstractmethod
    def tracker_print(self, msg: str) -> None:
        """Print ``msg`` once for the job (from rank 0)."""

    @abc.abstractmethod
    def finalize(self) -> None:
        """Leave the job. Collective. The engine is unusable afterwards."""

    @abc.abstractmethod
    def info(self) -> EngineInfo:
        """What this engine is and how the job runs (:class:`EngineInfo`)."""

    @abc.abstractmethod
    def abort(self, reason: str) -> None:
        """End the whole job now, as a failure that a restart would repeat;
        does not return."""

    # ------------------------------------------------------------------
    # What the GPU path (rabit_py.gpu) and the communication helpers call.

    @property
    def replays_results(self) -> bool:
        """Whether a replacement's calls may be answered from a cache (the
        robust engine): then a device transport must not make collective
        decisions at every call, only inside executed ones."""
        return False

    @property
    @abc.abstractmethod
    def membership(self) -> int:
        """Changes whenever the ranks behind the rank numbers change (a
        recovery): transports made for the old ones must be made again."""

    @abc.abstractmethod
    def check_peers(self) -> None:
        """Raise the engine's failure if it knows a peer is gone (for
        transports that would wait for it forever, such as NCCL)."""

    @abc.abstractmethod
    def device_allreduce(self, data: Any, op: OpLike, prepare_fun: Optional[PrepareFn],
                         reduce: Callable[[], None]) -> Any:
        """An allreduce of a device array run by ``reduce()`` on another
        transport (NCCL) as one of this engine's numbered calls (signature
        check, watchdog, and with the robust engine replay); ``prepare_fun``
        fills ``data`` first. Returns ``data``. Collective."""

    @abc.abstractmethod
    def device_transport(self) -> Any:
        """The transport that carries device arrays in :meth:`broadcast` and
        :meth:`device_allgather` (``resources.nccl``), or None: then they are
        staged through host memory."""

    @abc.abstractmethod
    def device_allgather(self, data: Any) -> Any:
        """:meth:`allgather` of a device array on :meth:`device_transport`, as
        one of this engine's numbered calls. Returns a new device array.
        Collective."""

    @abc.abstractmethod
    def side_allgather(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, outside the numbered calls (to set up a
        transport: not part of the program's call sequence). Collective."""

    @property
    @abc.abstractmethod
    def resources(self) -> Resources:
        """What the device transports and the communication thread keep with
        this engine."""

    @abc.abstractmethod
    def transport(self, data: Any, op: Any) -> Transport:
        """The transport that carries a call on ``data`` (Note [transports]):
        ``op`` as for :meth:`Transport.enabled`."""
