"""Rabit's Python API on rabit_py, as Rabit's programs get it: change the import::

    import rabit_py.rabit as rabit        # was: import rabit (dmlc/rabit)
                                          # or:  from xgboost import rabit (1.x-2.0)
    rabit.init(sys.argv)                  # or rabit.init(lib='mock'), RabitContext(args)
    a = rabit.allreduce(a, rabit.MAX)
    s = rabit.broadcast(s, 0)
    rabit.finalize()

Started with ``rabit-run -n N python prog.py`` (or ``mpirun``, or plain
``python`` for one process) instead of Rabit's tracker, the program gets
Rabit's values, return types and side effects, and under rabit-run a rank
that dies is replaced in the job.

``import rabit_py as rabit`` runs most Rabit programs too (``rabit.MAX``,
``init(sys.argv)``, ``init(lib='mock')`` exist there); this module is for
where the two differ (Note [Rabit's semantics]).

# Note [Rabit's semantics]
What this module keeps from Rabit's ``python/rabit.py`` (and from
``xgboost.rabit``, which had the same names), where ``rabit_py``'s own API
differs:

- ``allreduce(data, op, prepare_fun=None)`` returns the result *flattened to
  1-D*. Like Rabit it reduces through ``data.ravel()``: an array that owns
  its memory and is contiguous is reduced in place (the result is a 1-D view
  of it); a view of another array, or a non-contiguous one, is copied and
  left as it was. Rabit's dtypes (int8, uint8, int32, uint32, int64, uint64,
  float32, float64) are reduced; anything else, or a non-array, raises
  ``Exception``'s subclass ``TypeError``. ``prepare_fun(data)`` is skipped
  when the result is recovered from a peer, as in Rabit (``xgboost.rabit``
  1.7-2.0 refused it; it is accepted here).
- ``get_processor_name()`` returns **bytes**.
- ``tracker_print(msg)`` prints each calling rank's message (Rabit's tracker
  prints every message it is sent); ``rabit_py.tracker_print`` prints rank
  0's only.
- ``broadcast(data, root)`` returns the root's object (pickled, so any
  picklable object); the non-root argument is ignored and never written.
- Before ``init`` and after ``finalize``: rank 0, world size 1, and the
  collectives are identities (as ``xgboost.rabit``; Rabit's own wrapper
  failed there). A second ``init`` warns and is ignored, as Rabit's.
- ``Op`` is ``xgboost.rabit``'s (``MAX, MIN, SUM, OR``), and ``MAX, MIN,
  SUM, BITOR`` Rabit's module constants: the same values as ``rabit_py.Op``.
"""

from __future__ import annotations

import enum
import pickle
import socket
import warnings
from typing import Any, Callable, List, Optional, Sequence, TypeVar, Union

import numpy as np

from . import api
from .config import from_rabit_args
from .ops import Op as _RabitOp

__all__ = ["init", "finalize", "get_rank", "get_world_size", "is_distributed",
           "tracker_print", "get_processor_name", "broadcast", "allreduce", "load_checkpoint",
           "checkpoint", "lazy_checkpoint", "version_number", "Op", "RabitContext",
           "MAX", "MIN", "SUM", "BITOR"]

T = TypeVar("T")
RabitArgs = Optional[Sequence[Union[str, bytes]]]

MAX, MIN, SUM, BITOR = int(_RabitOp.MAX), int(_RabitOp.MIN), int(_RabitOp.SUM), int(_RabitOp.BITOR)

# Rabit's DTYPE_ENUM__: the dtypes its allreduce takes.
_DTYPES = frozenset(np.dtype(t) for t in (
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float32", "float64"))


@enum.unique
class Op(enum.IntEnum):
    """``xgboost.rabit.Op``: Rabit's operators (``OR`` is Rabit's ``BITOR``)."""

    MAX = 0
    MIN = 1
    SUM = 2
    OR = 3


def init(args: RabitArgs = None, lib: str = "standard", lib_dll: Any = None) -> None:
    """Join the job (Rabit's ``init``).

    Args:
        args: ``key=value`` strings or bytes, e.g. ``sys.argv`` (Note [Rabit
            arguments] in ``rabit_py/config.py``: ``mock=rank,version,seqno,
            trial`` entries, ``rabit_timeout_sec``...; the tracker's keys are
            ignored: rabit-run or mpirun started the job).
        lib: ``"standard"``, ``"base"``, ``"robust"`` or ``"mpi"`` (the
            engine rabit-run picks), or ``"mock"`` (fault injection).
        lib_dll: ignored (Rabit's own library; there is none to load).

    Raises:
        ValueError, TypeError: as :func:`rabit_py.config.from_rabit_args`.
    """
    if api.is_initialized():
        warnings.warn("rabit.init call was ignored because it has already been initialized",
                      stacklevel=2)
        return
    engine, settings = from_rabit_args(args, lib, lib_dll)
    api.init(engine, **settings)


def finalize() -> None:
    """Leave the job (Rabit's ``finalize``); nothing before ``init``."""
    api.finalize()


def get_rank() -> int:
    """This process's rank; 0 outside a job."""
    return api.get_rank() if api.is_initialized() else 0


def get_world_size() -> int:
    """The number of ranks; 1 outside a job."""
    return api.get_world_size() if api.is_initialized() else 1


def is_distributed() -> bool:
    """Whether this process is in a job of more than one rank."""
    return api.is_distributed()


def tracker_print(msg: Any) -> None:
    """Print ``msg``, once for each rank that calls it (as Rabit's tracker
    prints each message a worker sends it)."""
    text = msg if isinstance(msg, str) else str(msg)
    print(text.strip(), flush=True)


def get_processor_name() -> bytes:
    """This host's name (``gethostname``), as bytes (as Rabit's)."""
    return socket.gethostname().encode()


def broadcast(data: T, root: int) -> T:
    """The root's ``data`` on every rank (any picklable object); the other
    ranks' argument is ignored and never written.

    Raises:
        AssertionError: the root passed None (as Rabit's).
    """
    rank = get_rank()
    if root == rank:
        assert data is not None, "need to pass in data when broadcasting"
    if not api.is_initialized():
        return data
    # Rabit pickles: every non-root gets a new object, even of an array that
    # rabit_py would broadcast into an array of the same shape.
    payload = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL) if rank == root else None
    blob = api.broadcast(payload, root)
    return data if rank == root else pickle.loads(blob)


def allreduce(data: np.ndarray, op: int,
              prepare_fun: Optional[Callable[[np.ndarray], None]] = None) -> np.ndarray:
    """``data`` reduced over the ranks with ``op``, as a 1-D array; in place
    exactly where Rabit's is (Note [Rabit's semantics]).

    Args:
        data: a NumPy array of one of Rabit's dtypes.
        op: ``MAX``, ``MIN``, ``SUM`` or ``BITOR`` (``Op.OR``).
        prepare_fun: ``prepare_fun(data)`` fills ``data`` just before the
            reduction; skipped when the result is recovered from a peer.

    Raises:
        TypeError: not a NumPy array, or not one of Rabit's dtypes.
        ValueError: ``op`` is not one of Rabit's operators.
    """
    if not isinstance(data, np.ndarray):
        raise TypeError("allreduce only takes in numpy.ndarray")
    if int(op) not in (MAX, MIN, SUM, BITOR) or isinstance(op, bool):
        raise ValueError(f"op={op!r} is not one of Rabit's operators (MAX, MIN, SUM, BITOR)")
    buf = data.ravel()
    copied = buf.base is data.base
    if copied:
        buf = buf.copy()
    if buf.dtype not in _DTYPES:
        raise TypeError(f"data type {buf.dtype} not supported")
    if not api.is_initialized():
        if prepare_fun is not None:
            _prepare(prepare_fun, data, buf, copied)
        return buf
    fill = None if prepare_fun is None else (
        lambda _: _prepare(prepare_fun, data, buf, copied))
    return api.allreduce(buf, int(op), prepare_fun=fill)


def _prepare(prepare_fun: Callable[[np.ndarray], None], data: np.ndarray, buf: np.ndarray,
             copied: bool) -> None:
    """``prepare_fun`` writes ``data``; where ``buf`` is a copy of it, the
    prepared values are copied in too (Rabit reduced the stale copy)."""
    prepare_fun(data)
    if copied or not np.shares_memory(buf, data):
        np.copyto(buf, data.ravel())


def load_checkpoint(with_local: bool = False) -> tuple:
    """The latest checkpoint: ``(version, global_model)`` or with
    ``with_local`` ``(version, global_model, local_model)``; version 0 and
    None models on a fresh start or outside a job."""
    if not api.is_initialized():
        return (0, None, None) if with_local else (0, None)
    return tuple(api.load_checkpoint(with_local))


def checkpoint(global_model: Any, local_model: Any = None) -> None:
    """End a version (Rabit's ``checkpoint``; see :func:`rabit_py.checkpoint`).

    Raises:
        NotInitializedError: outside a job (there is nowhere to keep it).
    """
    api.checkpoint(global_model, local_model)


def lazy_checkpoint(global_model: Any) -> None:
    """As :func:`checkpoint`, serialized only if a failure needs it."""
    api.lazy_checkpoint(global_model)


def version_number() -> int:
    """Checkpoints taken so far; 0 outside a job."""
    return api.version_number() if api.is_initialized() else 0


class RabitContext:
    """``init(args)`` on entry, ``finalize()`` on exit
    (``xgboost.rabit.RabitContext``); works at world size 1 too."""

    def __init__(self, args: Optional[List[bytes]] = None) -> None:
        self.args = [] if args is None else args

    def __enter__(self) -> None:
        init(self.args)

    def __exit__(self, *exc: Any) -> None:
        finalize()

