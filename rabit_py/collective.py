"""XGBoost's ``xgboost.collective`` on rabit_py: change the import, keep the program::

    import rabit_py.collective as collective     # was: from xgboost import collective

    with collective.CommunicatorContext(**args):          # args may hold dmlc_* keys
        total = collective.allreduce(np.array([1.0]), collective.Op.SUM)
        model = collective.broadcast(model, 0)
        collective.communicator_print(f"rank {collective.get_rank()} done")

Started with ``rabit-run -n N python prog.py`` (or ``mpirun``, or plain
``python`` for one process) instead of XGBoost's ``RabitTracker``, the program
gets the same values, return types and exceptions as from XGBoost 3.2's
module, and under rabit-run a rank that dies is replaced in the job.

# Note [xgboost collective semantics]
What this module keeps from XGBoost 3.2 (``xgboost/collective.py``), where
``rabit_py``'s own API differs:

- ``allreduce(data, op)`` never writes into ``data``: it reduces a copy and
  returns it *flattened to 1-D* (XGBoost before 3.4 does; 3.4 keeps the
  input's shape: programs that want the shape reshape the result, which works
  with both). It takes NumPy arrays of any layout and of XGBoost's dtypes
  (float16/32/64, int8-64, uint8-64), and raises ``TypeError`` for anything
  else (a list, bool, complex), as XGBoost does; also for float128, which
  XGBoost reduces where the platform has it and rabit_py does not.
- ``Op`` is XGBoost's: ``BITWISE_AND`` is 3, ``BITWISE_OR`` 4,
  ``BITWISE_XOR`` 5 (``rabit_py.Op.BITOR`` is 3: the two enums are not
  interchangeable, so a raw 3 means what it means in XGBoost here).
- ``broadcast(data, root)`` sends the root's object (pickled) and returns it;
  the non-root argument is ignored and never written, and the root gets its
  own object back.
- Before ``init`` and after ``finalize``, ``get_rank()`` is 0,
  ``get_world_size()`` 1, and the collectives are identities, as XGBoost's
  (its callbacks rely on it); rabit_py's own API raises
  ``NotInitializedError`` there instead.
- ``communicator_print`` prints each calling rank's message once (XGBoost's
  tracker prints what every worker sends it).
- ``init(**args)`` accepts XGBoost's keys (``dmlc_tracker_uri``,
  ``dmlc_task_id``, ``dmlc_retry``, ...: the tracker's, meaningless under
  MPI, and ignored); ``dmlc_timeout`` becomes rabit_py's collective timeout.
  ``CommunicatorContext()`` works at world size 1 without a tracker.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
import sys
from typing import Any, Callable, Dict, Optional, TypeVar, Union

import numpy as np

from . import api
from .ops import Op as _RabitOp

__all__ = ["init", "finalize", "get_rank", "get_world_size", "is_distributed",
           "communicator_print", "get_processor_name", "broadcast", "allreduce", "Op",
           "signal_error", "CommunicatorContext", "Config"]

T = TypeVar("T")
ArgValue = Optional[Union[int, str]]

# XGBoost's dtypes (collective._map_dtype), less float128 (Note [xgboost
# collective semantics]).
_DTYPES = frozenset(np.dtype(t) for t in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64"))


@enum.unique
class Op(enum.IntEnum):
    """XGBoost's reduction operators (its values, not ``rabit_py.Op``'s)."""

    MAX = 0
    MIN = 1
    SUM = 2
    BITWISE_AND = 3
    BITWISE_OR = 4
    BITWISE_XOR = 5


_TO_RABIT = {Op.MAX: _RabitOp.MAX, Op.MIN: _RabitOp.MIN, Op.SUM: _RabitOp.SUM,
             Op.BITWISE_AND: _RabitOp.BITAND, Op.BITWISE_OR: _RabitOp.BITOR,
             Op.BITWISE_XOR: _RabitOp.BITXOR}


@dataclasses.dataclass
class Config:
    """XGBoost's communicator configuration (``xgboost.collective.Config``).

    ``timeout`` becomes rabit_py's collective timeout; ``retry``,
    ``worker_port`` and the tracker's fields are accepted and have no use
    under MPI (rabit-run or mpirun starts and connects the ranks).
    """

    retry: Optional[int] = None
    timeout: Optional[int] = None
    tracker_host_ip: Optional[str] = None
    tracker_port: Optional[int] = None
    tracker_timeout: Optional[int] = None
    worker_port: Optional[Union[int, Callable[[], int]]] = None

    def get_comm_config(self, args: Dict[str, Any]) -> Dict[str, Any]:
        """Set ``dmlc_retry`` and ``dmlc_timeout`` in ``args`` from this
        config (those that are set), as XGBoost's does; returns ``args``."""
        if self.retry is not None:
            args["dmlc_retry"] = self.retry
        if self.timeout is not None:
            args["dmlc_timeout"] = self.timeout
        return args

    def update_worker_args(self, args: Dict[str, Any]) -> Dict[str, Any]:
        """As :meth:`get_comm_config`, and ``dmlc_worker_port`` from
        ``worker_port`` (called if it is a function); returns ``args``."""
        self.get_comm_config(args)
        if self.worker_port is not None:
            port = self.worker_port
            args["dmlc_worker_port"] = port() if callable(port) else port
        return args


def init(**args: ArgValue) -> None:
    """Join the job (``xgboost.collective.init``).

    Args:
        **args: XGBoost's communicator arguments. ``dmlc_timeout`` (seconds)
            is the collective timeout; ``dmlc_communicator`` must be
            ``"rabit"`` (the default) or absent; the tracker's keys
            (``dmlc_tracker_uri``, ``dmlc_tracker_port``, ``dmlc_task_id``,
            ``dmlc_retry``, ``dmlc_nccl_path``) are accepted and ignored:
            rabit-run or mpirun has started the job. Keys are also read
            upper-case from the environment, as XGBoost reads them.

    Raises:
        ValueError: another communicator (``federated``) was asked for.
        RabitError: already initialized.
    """
    kind = args.get("dmlc_communicator") or os.environ.get("DMLC_COMMUNICATOR") or "rabit"
    if str(kind).lower() != "rabit":
        raise ValueError(f"dmlc_communicator={kind!r}: rabit_py.collective runs on MPI (the "
                         f"'rabit' communicator); the federated communicator is not supported")
    timeout = args.get("dmlc_timeout", os.environ.get("DMLC_TIMEOUT"))
    settings = {} if timeout in (None, "") else {"timeout": float(timeout)}
    api.init(**settings)


def finalize() -> None:
    """Leave the job (``xgboost.collective.finalize``); nothing before ``init``."""
    api.finalize()


def get_rank() -> int:
    """This process's rank; 0 outside a job."""
    return api.get_rank() if api.is_initialized() else 0


def get_world_size() -> int:
    """The number of ranks; 1 outside a job."""
    return api.get_world_size() if api.is_initialized() else 1


def is_distributed() -> bool:
    """Whether this process is in a job of more than one rank."""
    return get_world_size() > 1


def communicator_print(msg: Any) -> None:
    """Print ``msg`` (stripped), once for each rank that calls it, as
    XGBoost's tracker prints the messages its workers send."""
    text = msg if isinstance(msg, str) else str(msg)
    print(text.strip(), flush=True)


def get_processor_name() -> str:
    """This host's name (``socket.gethostname()``, as XGBoost's)."""
    return socket.gethostname()


def broadcast(data: T, root: int) -> T:
    """The root's ``data`` on every rank (any picklable object); the other
    ranks' argument is ignored and never written.

    Raises:
        AssertionError: the root passed None (as XGBoost's).
        TypeError: the root's object cannot be pickled.
    """
    rank = get_rank()
    if root == rank:
        assert data is not None, "need to pass in data when broadcasting"
    if not api.is_initialized():
        return data
    # The root sends its object; an array goes as an array, into a new one on
    # the others (they pass None, so nothing of theirs is written).
    payload = data if rank == root else None
    if isinstance(payload, np.ndarray) and not payload.flags.c_contiguous:
        payload = np.ascontiguousarray(payload)
    result = api.broadcast(payload, root)
    return data if rank == root else result


def allreduce(data: np.ndarray, op: Op) -> np.ndarray:
    """``data`` reduced over the ranks with ``op``, as a new 1-D array
    (``data`` itself is not written; Note [xgboost collective semantics]).

    Raises:
        TypeError: ``data`` is not a NumPy array, or of a dtype XGBoost does
            not reduce (bool, complex, object ...).
        ValueError: ``op`` is not one of :class:`Op`'s.
    """
    if not isinstance(data, np.ndarray):
        raise TypeError("allreduce only takes in numpy.ndarray")
    if data.dtype not in _DTYPES:
        raise TypeError(f"data type {data.dtype} is not supported on the current platform.")
    rabit_op = _TO_RABIT[Op(op)]
    buf = data.ravel().copy()
    if not api.is_initialized():
        return buf
    return api.allreduce(buf, rabit_op)


def signal_error() -> None:
    """End the job because this rank failed (``xgboost.collective.signal_error``:
    "Kill the process"): :func:`rabit_py.abort`, so that the peers stop
    instead of waiting for this rank, and rabit-run does not restart the job
    (a replacement would only call it again). Does not return.
    """
    sys.stdout.flush()
    api.abort("xgboost.collective.signal_error() was called")


class CommunicatorContext:
    """``init(**args)`` on entry, ``finalize()`` on exit; ``__enter__``
    returns ``args`` (``xgboost.collective.CommunicatorContext``). Works
    with no arguments (rabit-run or mpirun started the job; one process
    alone is a job of one rank)."""

    def __init__(self, **args: ArgValue) -> None:
        self.args = args

    def __enter__(self) -> Dict[str, ArgValue]:
        init(**self.args)
        return self.args

    def __exit__(self, *exc: Any) -> None:
        finalize()

