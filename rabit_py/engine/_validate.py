"""Input checks made before any communication.

Each function returns the exception that refuses the input (or ``None``)
instead of raising it, so that the engine can still take part in the signature
check and make its peers raise too (see Note [signature check]).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..ops import DTYPES, OpLike, check_op_dtype, dtype_code

__all__ = ["check_allreduce", "check_array_broadcast", "check_allgather", "check_root",
           "valid_pairs"]


def _check_array(data: Any, call: str, in_place: bool) -> Optional[BaseException]:
    """``in_place``: the result is written into ``data``, which must then be a
    writeable C-contiguous buffer (a copy would silently not be updated)."""
    if not isinstance(data, np.ndarray):
        return TypeError(f"{call} needs a NumPy array, got {type(data).__name__}")
    flags = data.flags
    if (not in_place or (flags.c_contiguous and flags.writeable)) and data.dtype in _SUPPORTED:
        return None     # the common case, decided in a few hundred nanoseconds
    if in_place and not flags.c_contiguous:
        return ValueError(
            f"{call} works in place on C-contiguous arrays; this array is a strided view. "
            f"Reduce a copy and assign it back: tmp = np.ascontiguousarray(a); "
            f"rabit.{call}(tmp, ...); a[...] = tmp")
    if in_place and not flags.writeable:
        return ValueError(f"{call} writes its result into the array, which is read-only; "
                          f"pass a writeable copy (a.copy())")
    if dtype_code(data.dtype) == 0:
        return TypeError(f"{call} does not support dtype {data.dtype} "
                         f"(supported: bool, int8-64, uint8-64, float16/32/64, complex64/128, "
                         f"in native byte order)")
    return None


def check_allreduce(data: Any, op: OpLike) -> Optional[BaseException]:
    """Why ``allreduce(data, op)`` is refused, or None."""
    error = _check_array(data, "allreduce", in_place=True)
    if error is not None:
        return error
    if type(op) is int and (op, data.dtype) in _VALID_PAIRS:
        return None
    try:
        check_op_dtype(op, data.dtype)
    except (TypeError, ValueError) as exc:
        return exc
    return None


def _valid_pairs() -> frozenset:
    pairs = set()
    for op in range(7):
        for dtype in DTYPES:
            try:
                check_op_dtype(op, dtype)
                pairs.add((op, dtype))
            except TypeError:
                pass
    return frozenset(pairs)


_SUPPORTED = frozenset(DTYPES)
_VALID_PAIRS = _valid_pairs()


def valid_pairs() -> frozenset:
    """Every valid ``(op code, dtype)`` pair of a built-in operator."""
    return _VALID_PAIRS


def check_root(root: Any, world_size: int) -> Optional[BaseException]:
    """Why ``root`` is not a valid broadcast root, or None."""
    if type(root) is int and 0 <= root < world_size:
        return None
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        return TypeError(f"broadcast root must be an int rank, got {type(root).__name__}")
    if not 0 <= int(root) < world_size:
        return ValueError(f"broadcast root={root} is not a rank of this job "
                          f"(world size {world_size}: valid roots are 0..{world_size - 1})")
    return None


def check_array_broadcast(data: np.ndarray) -> Optional[BaseException]:
    """Why an array cannot be broadcast in place, or None."""
    return _check_array(data, "broadcast", in_place=True)


def check_allgather(data: Any) -> Optional[BaseException]:
    """Why ``allgather(data)`` is refused, or None. The input is only read:
    read-only arrays and strided views are fine (views are copied)."""
    error = _check_array(data, "allgather", in_place=False)
    if error is None and data.ndim == 0:
        error = ValueError("allgather concatenates along axis 0 and needs an array with "
                           "ndim >= 1; wrap a scalar as np.array([x])")
    return error
