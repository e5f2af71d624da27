"""The ``Engine`` interface every engine implements.

The facade (:mod:`rabit_py.api`) talks only to this interface. ``MpiEngine``
implements it on mpi4py; ``RobustEngine`` adds recovery; ``MockEngine`` adds
fault injection. Each subclass overrides a method, does its one extra job, and
calls ``super()``.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np

from ..ops import OpLike

__all__ = ["Engine", "PrepareFn", "CheckpointResult", "DEVICE_TRANSPORT"]

PrepareFn = Callable[[np.ndarray], Any]
CheckpointResult = Union[Tuple[int, Any], Tuple[int, Any, Any]]
#: The engine attachment that carries device arrays in broadcast and allgather
#: (the NCCL backend of ``rabit_py.gpu``: ``carries``, ``to_host``,
#: ``upload``, ``broadcast``, ``allgather``).
DEVICE_TRANSPORT = "nccl"


class Engine(abc.ABC):
    """What a rabit_py engine provides. All collectives are blocking.

    Collective methods must be called by every rank in the same order.
    """

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
