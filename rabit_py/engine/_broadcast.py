"""The broadcast header: what the root tells the receivers before the payload.

The root decides the mode: an array is sent raw, in place where receivers pass a
matching array, into a new array where they pass anything else; any other object
is pickled. An array on a device is sent by the device transport (NCCL) in
mode ``DEVICE`` with the same header, where the engine has one (Note [nccl
backend] in ``rabit_py/gpu/_nccl.py``). The header is 8 int64s:
``mode, payload bytes, dtype code, ndim`` and up to 4 dimensions (arrays of
more dimensions send their shape in a second, rare, message). A root whose
object cannot be pickled sends the error text as the payload with mode
``ERROR``, so that every rank raises, not only the root.
"""

from __future__ import annotations

import pickle
from typing import Any, List, Optional, Tuple

import numpy as np

from ..ops import DTYPES, dtype_code

__all__ = ["HEADER_LEN", "ARRAY", "OBJECT", "ERROR", "DEVICE", "root_header", "array_header",
           "header_dtype", "inline_shape"]

HEADER_LEN = 8
INLINE_DIMS = HEADER_LEN - 4
ARRAY, OBJECT, ERROR, DEVICE = 1, 2, 3, 4


def root_header(data: Any) -> Tuple[List[int], Optional[bytes], Optional[BaseException]]:
    """The root's header, its payload (None for arrays: the array itself is
    sent), and the pickling error if the object could not be pickled."""
    if isinstance(data, np.ndarray):
        return array_header(ARRAY, data.shape, data.dtype), None, None
    try:
        payload = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # pickling raises many types
        text = f"{type(data).__name__}: {type(exc).__name__}: {exc}".encode()
        return [ERROR, len(text)] + [0] * (HEADER_LEN - 2), text, exc
    return [OBJECT, len(payload)] + [0] * (HEADER_LEN - 2), payload, None


def array_header(mode: int, shape: Tuple[int, ...], dtype: np.dtype) -> List[int]:
    """The header of an array (``ARRAY`` or ``DEVICE``) of this shape and dtype."""
    inline = list(shape) if len(shape) <= INLINE_DIMS else []
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return ([mode, nbytes, dtype_code(np.dtype(dtype)), len(shape)]
            + inline + [0] * (INLINE_DIMS - len(inline)))


def header_dtype(header: List[int]) -> np.dtype:
    """The dtype of an ARRAY or DEVICE header."""
    return DTYPES[header[2] - 1]


def inline_shape(header: List[int]) -> Optional[Tuple[int, ...]]:
    """The shape carried by an ARRAY or DEVICE header, or None if it needs the
    second message."""
    ndim = header[3]
    return tuple(header[4:4 + ndim]) if ndim <= INLINE_DIMS else None
