"""The broadcast protocol: the header the root sends before the payload, and
how an array payload is sent and received.

The root decides the mode: an array is sent raw, in place where receivers pass a
matching array, into a new array where they pass anything else; any other object
is pickled. An array on a device is sent by the device transport (NCCL) in
mode ``DEVICE`` with the same header, where the engine has one (Note [nccl
backend] in ``rabit_py/gpu/_nccl.py``). The header is 10 int64s:
``mode, payload bytes, dtype code, ndim``, up to 4 dimensions (arrays of
more dimensions send their shape in a second, rare, message), the call's
stamp and the CRC-32C of the payload, an array's or a pickle's (Note [call stamps] in
``mpi.py``). A root whose object cannot be pickled sends the error text as
the payload with mode ``ERROR``, so that every rank raises, not only the root.

The header travels in a message of :data:`MESSAGE_LEN` int64s whose tail
holds a payload of up to :data:`INLINE_BYTES` (a host array of at most 4
dimensions, a pickle, an error text): a small broadcast is one MPI call, not
two (2 ranks on the development VM: the header's Bcast of 80 bytes and one of
256 cost the same, 0.5-0.6 us; the second call cost 2-4 us with the
engine's own work around it). Both sides tell from the header alone
(:func:`inlined`) whether the payload came with it.
"""

from __future__ import annotations

import functools
import math
import pickle
from typing import Any, List, Optional, Tuple

import numpy as np
from ._checksum import crc32c

from ..errors import CollectiveMismatchError, RabitError
from ..ops import DTYPES, dtype_code

__all__ = ["HEADER_LEN", "MESSAGE_LEN", "INLINE_BYTES", "inlined", "STAMP", "CHECK", "ARRAY", "OBJECT", "ERROR", "DEVICE", "root_header",
           "array_header", "header_dtype", "inline_shape", "broadcast_array", "received_shape",
           "receive_mismatch",
           "broadcast_device_array"]

HEADER_LEN = 10
INLINE_DIMS = 4
INLINE_BYTES = 176
MESSAGE_LEN = HEADER_LEN + INLINE_BYTES // 8
STAMP, CHECK = 8, 9             # the header's slots for Note [call stamps] in mpi.py
ARRAY, OBJECT, ERROR, DEVICE = 1, 2, 3, 4


def root_header(data: Any) -> Tuple[List[int], Optional[bytes], Optional[BaseException]]:
    """The root's header, its payload (None for arrays: the array itself is
    sent), and the pickling error if the object could not be pickled."""
    if isinstance(data, np.ndarray):
        header = array_header(ARRAY, data.shape, data.dtype)
        header[CHECK] = crc32c(data)
        return header, None, None
    try:
        payload = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # pickling raises many types
        text = f"{type(data).__name__}: {type(exc).__name__}: {exc}".encode()
        return [ERROR, len(text)] + [0] * (HEADER_LEN - 2), text, exc
    header = [OBJECT, len(payload)] + [0] * (HEADER_LEN - 2)
    header[CHECK] = crc32c(payload)
    return header, payload, None


def array_header(mode: int, shape: Tuple[int, ...], dtype: np.dtype) -> List[int]:
    """The header of an array (``ARRAY`` or ``DEVICE``) of this shape and dtype."""
    return list(_array_header(mode, tuple(shape), np.dtype(dtype)))


@functools.lru_cache(maxsize=256)
def _array_header(mode: int, shape: Tuple[int, ...], dtype: np.dtype) -> Tuple[int, ...]:
    # Remembered: a program broadcasts the same few shapes again and again,
    # and making the header took 1.9 us of a small broadcast's root.
    inline = list(shape) if len(shape) <= INLINE_DIMS else []
    nbytes = math.prod(shape) * dtype.itemsize
    return tuple([mode, nbytes, dtype_code(dtype), len(shape)]
                 + inline + [0] * (INLINE_DIMS - len(inline)) + [0, 0])


def inlined(header: List[int]) -> bool:
    """Whether the payload of this header came in the header's message."""
    return (header[1] <= INLINE_BYTES and header[0] != DEVICE
            and (header[0] != ARRAY or header[3] <= INLINE_DIMS))


def header_dtype(header: List[int]) -> np.dtype:
    """The dtype of an ARRAY or DEVICE header."""
    return DTYPES[header[2] - 1]


def inline_shape(header: List[int]) -> Optional[Tuple[int, ...]]:
    """The shape carried by an ARRAY or DEVICE header, or None if it needs the
    second message."""
    ndim = header[3]
    return tuple(header[4:4 + ndim]) if ndim <= INLINE_DIMS else None


def broadcast_array(comm: Any, rank: int, data: Any, header: List[int], root: int) -> np.ndarray:
    """The payload of an ARRAY header: the root sends ``data``; a receiver
    gets it in place in a matching array, else in a new one."""
    if rank == root:
        if header[3] > INLINE_DIMS:
            comm.Bcast(np.array(data.shape, dtype=np.int64), root=root)
        comm.Bcast(data, root=root)
        return data
    shape = received_shape(comm, header, root)
    dtype = header_dtype(header)
    if isinstance(data, np.ndarray) and data.shape == shape and data.dtype == dtype:
        comm.Bcast(data, root=root)
        return data
    out = np.empty(shape, dtype=dtype)
    comm.Bcast(out, root=root)
    if isinstance(data, np.ndarray):
        # We still took part in the Bcast above, so the other ranks are not
        # left waiting.
        raise receive_mismatch(rank, root, dtype, shape, data)
    return out


def receive_mismatch(rank: int, root: int, dtype: np.dtype, shape: Tuple[int, ...],
                     data: np.ndarray) -> CollectiveMismatchError:
    """A receiver passed an array that the root's does not fit (only
    reachable with the signature check off)."""
    return CollectiveMismatchError(
        f"rank {rank}: broadcast from root {root} sent {dtype}{list(shape)} "
        f"but this rank passed {data.dtype}{list(data.shape)} to receive it in place")

def received_shape(comm: Any, header: List[int], root: int) -> Tuple[int, ...]:
    """The shape an array header announces (a second message past INLINE_DIMS)."""
    shape = inline_shape(header)
    if shape is None:
        full = np.empty(header[3], dtype=np.int64)
        comm.Bcast(full, root=root)
        shape = tuple(full.tolist())
    return shape

def broadcast_device_array(comm: Any, rank: int, transport: Any, data: Any, header: List[int],
                           root: int) -> Any:
    """The root sent a device array (mode DEVICE): it travels on the
    device transport. A receiver gets it in place in a matching device
    array, copied into a matching NumPy array, else as a new device array."""
    if rank == root:
        if header[3] > INLINE_DIMS:
            comm.Bcast(np.array(data.shape, dtype=np.int64), root=root)
        transport.broadcast(data, tuple(data.shape), data.dtype, root)
        return data
    shape = received_shape(comm, header, root)
    dtype = header_dtype(header)
    if transport is None:
        # Every rank chose the device backend at the same call: only a
        # program whose ranks made different device calls gets here.
        raise RabitError(
            f"rank {rank}: broadcast from root {root} sends a device array on the "
            f"NCCL backend, which this rank has not set up (its earlier device calls "
            f"differ from the root's); the root may wait until its timeout")
    matches = (getattr(data, "shape", None) is not None and tuple(data.shape) == shape
               and data.dtype == dtype)
    in_place = matches and transport.carries(data)
    out = transport.broadcast(data if in_place else None, shape, dtype, root)
    if in_place:
        return data
    if matches and not transport.carries(data) and isinstance(data, np.ndarray):
        np.copyto(data, transport.to_host(out))
        return data
    if isinstance(data, np.ndarray) or transport.carries(data):
        raise receive_mismatch(rank, root, dtype, shape, data)
    return out
