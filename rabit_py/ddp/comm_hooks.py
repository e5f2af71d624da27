"""Communication hooks for the GradientBucketer and the torch adapter, as in
PyTorch DDP (``torch.distributed.algorithms.ddp_comm_hooks``).

A hook decides how one bucket of gradients is reduced. It is registered with
:meth:`rabit_py.ddp.bucket.GradientBucketer.register_comm_hook` (or
:meth:`rabit_py.torch.DistributedModule.register_comm_hook`) as
``hook(state, bucket)``; it runs on the engine's communication thread, makes
rabit_py collectives (the same ones, in the same order, on every rank), and
returns when the bucket's reduction is done, leaving the final gradients
(averaged, if that is what the step needs) in ``bucket.buffer()`` or
returning an array of the buffer's shape to be copied there. ``state`` is
whatever was registered with the hook (None for the hooks here).

Because a hook's collectives are ordinary rabit_py calls, they are numbered,
checked and recovered like any other: a rank killed in the middle of a
compressed allreduce is replaced and the result is bitwise what it would have
been.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from .. import api
from ..ops import Op

__all__ = ["GradBucket", "CommHook", "allreduce_hook", "sum_hook", "fp16_compress_hook"]


class GradBucket:
    """One bucket of gradients, as a hook sees it.

    Args:
        index: the bucket's number (bucket 0 is reduced first).
        buffer: the bucket's flat gradients (NumPy or CuPy), summed over the
            steps accumulated under ``no_sync``; the hook reduces it.
        parameters: the indices of the parameters in the bucket.
    """

    def __init__(self, index: int, buffer: Any, parameters: Tuple[int, ...]) -> None:
        self._index = index
        self._buffer = buffer
        self._parameters = parameters

    def index(self) -> int:
        """The bucket's number."""
        return self._index

    def buffer(self) -> Any:
        """The bucket's flat gradient array (reduce it in place, or return the result)."""
        return self._buffer

    def parameters(self) -> Tuple[int, ...]:
        """The indices of the parameters whose gradients the bucket holds."""
        return self._parameters


CommHook = Callable[[Any, GradBucket], Optional[Any]]


def _average(flat: Any, size: int) -> None:
    if flat.dtype.kind in "fc":
        flat /= size
    else:
        flat //= size


def allreduce_hook(state: Any, bucket: GradBucket) -> Any:
    """The default: an allreduce (sum) of the bucket, divided by the world
    size (integer buckets: floor division)."""
    flat = sum_hook(state, bucket)
    size = api.get_world_size()
    if size > 1:
        _average(flat, size)
    return flat


def sum_hook(state: Any, bucket: GradBucket) -> Any:
    """An allreduce (sum) of the bucket, not averaged: the bucketer's default
    with ``average=False`` (the KVStore's, whose optimizer rescales)."""
    flat = bucket.buffer()
    api.allreduce(flat, Op.SUM)
    return flat


def fp16_compress_hook(state: Any, bucket: GradBucket) -> Any:
    """Send half the bytes: the bucket is cast to float16, divided by the
    world size (so that the sum stays in float16's range), summed across
    ranks in float16, and cast back. As DDP's hook of the same name, it
    trades precision (float16 keeps ~3 decimal digits; values below ~6e-8
    become 0) for bandwidth; every rank gets the same bits.

    Raises:
        TypeError: the bucket is not floating point.
    """
    flat = bucket.buffer()
    if flat.dtype.kind != "f":
        raise TypeError(f"fp16_compress_hook compresses floating-point gradients, got a "
                        f"bucket of {flat.dtype}")
    size = api.get_world_size()
    xp = _array_module(flat)
    half = flat.astype(xp.float16)
    if size > 1:
        half /= xp.float16(size)
    api.allreduce(half, Op.SUM)
    flat[...] = half
    return flat


def _array_module(array: Any) -> Any:
    if isinstance(array, np.ndarray):
        return np
    import cupy  # noqa: PLC0415 - a CuPy bucket: CuPy is there

    return cupy
