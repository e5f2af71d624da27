"""What both stores do with the caller's keys and values: pairing keys with
values, summing a key's local values, and copying a key's value out
(``KVStore`` and ``ServerKVStore`` alike)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from .._arrays import is_device_array, to_host
from ..errors import KVStoreError
from ._plans import Key, check_key

__all__ = ["pairs", "local_sum", "copy_out"]


def pairs(key: Any, value: Any) -> Tuple[List[Key], List[Any]]:
    """``(keys, values)`` of one key and value, or of lists of them.

    Raises:
        ValueError: lists of different lengths; TypeError: a bad key.
    """
    if isinstance(key, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(key):
            raise ValueError(f"{len(key)} keys need a list of {len(key)} values")
        return [check_key(k) for k in key], list(value)
    return [check_key(key)], [value]


def local_sum(key: Key, value: Any, shape: Tuple[int, ...], dtype: np.dtype, rank: int,
              copy: bool = True) -> np.ndarray:
    """A push's value summed locally (a list: one array per device), as a
    C-contiguous host array; a copy unless ``copy`` is False and there is
    one array.

    Raises:
        KVStoreError: a value of another shape or dtype than the key's.
        ValueError: an empty list.
    """
    parts = list(value) if isinstance(value, (list, tuple)) else [value]
    if not parts:
        raise ValueError(f"push of key {key!r}: an empty list of values")
    total: Optional[np.ndarray] = None
    for part in parts:
        array = np.asarray(to_host(part))
        if array.shape != shape or array.dtype != dtype:
            raise KVStoreError(f"rank {rank}: push of key {key!r} with shape {array.shape} and "
                               f"dtype {array.dtype}, but the key holds {shape} {dtype}; a "
                               f"key's shape and dtype are fixed by init")
        if total is None:
            total = np.array(array, copy=copy or len(parts) > 1, order="C")
        else:
            total += array
    assert total is not None
    return total


def copy_out(key: Key, value: np.ndarray, out: Any, rank: int) -> Any:
    """``value`` copied into ``out`` (an array, or a list of arrays each
    given a copy; NumPy or device arrays), or ``value`` itself when ``out``
    is None.

    Raises:
        KVStoreError: an ``out`` of another shape than the key's.
    """
    if out is None:
        return value
    targets = out if isinstance(out, (list, tuple)) else [out]
    for target in targets:
        if tuple(target.shape) != value.shape:
            raise KVStoreError(f"rank {rank}: pull of key {key!r} into an array of shape "
                               f"{tuple(target.shape)}; the key holds {value.shape}")
        if is_device_array(target):
            target.set(value.astype(target.dtype, copy=False))
        else:
            np.copyto(target, value, casting="same_kind")
    return out
