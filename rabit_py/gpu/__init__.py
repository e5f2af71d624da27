"""CuPy arrays in the public API.

# Note [device arrays]
``allreduce``, ``broadcast`` and ``allgather`` accept CuPy arrays. The backend
is chosen by ``RABIT_GPU_BACKEND`` (``Config.gpu_backend``):

- ``staged`` (what ``auto`` picks today): the array is copied to host memory,
  reduced by the engine exactly as a NumPy array (so the signature check, the
  timeout and the robust engine's cache and recovery apply unchanged), and
  copied back into the device array. For machines where ranks share a GPU or
  NCCL is missing, and the only backend built so far.
- ``nccl``: reduction through ``cupy.cuda.nccl`` on the devices; not built
  yet (it needs a machine with GPUs to be developed and tested on): asking
  for it raises a clear error.

Nothing here imports CuPy unless a device array is passed: an array is a
device array when its type comes from the ``cupy`` package.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ..errors import RabitError

__all__ = ["is_device_array", "to_host", "allreduce", "broadcast", "allgather", "BACKENDS"]

BACKENDS = ("auto", "staged", "nccl")


def is_device_array(data: Any) -> bool:
    """Whether ``data`` is a CuPy array (checked without importing CuPy; on
    every collective call, so kept cheap)."""
    module = type(data).__module__
    return module.startswith("cupy") and (len(module) == 4 or module[4] == ".")


def to_host(data: Any) -> Any:
    """A device array's host copy (``.get()``); anything else as it is."""
    return data.get() if is_device_array(data) else data


def _staged(backend: str, rank: int) -> None:
    if backend == "nccl":
        raise RabitError(f"rank {rank}: RABIT_GPU_BACKEND=nccl: the NCCL backend is not built "
                         f"yet; use RABIT_GPU_BACKEND=staged (or auto), which reduces device "
                         f"arrays through host memory")


def allreduce(engine: Any, backend: str, data: Any, op: Any,
              prepare_fun: Optional[Callable[[Any], None]]) -> Any:
    """``engine.allreduce`` of the device array ``data`` through host memory;
    ``prepare_fun`` (if any) fills the device array, and is skipped exactly
    when the engine skips it (a result served from the robust engine's cache).
    Returns ``data``, reduced in place."""
    _staged(backend, engine.rank)
    host = np.ascontiguousarray(data.get())
    prepare = None
    if prepare_fun is not None:
        def prepare(buffer: np.ndarray) -> None:
            prepare_fun(data)
            buffer[...] = data.get()
    engine.allreduce(host, op, prepare)
    data.set(host)
    return data


def broadcast(engine: Any, backend: str, data: Any, root: int) -> Any:
    """``engine.broadcast`` with device arrays staged through host memory: the
    root's device array is sent; a rank that passes a device array of the same
    shape and dtype receives in place, others get what the engine returns."""
    _staged(backend, engine.rank)
    host = to_host(data)
    result = engine.broadcast(host, root)
    if is_device_array(data) and isinstance(result, np.ndarray) \
            and result.shape == tuple(data.shape) and result.dtype == data.dtype:
        data.set(result)
        return data
    return result


def allgather(engine: Any, backend: str, data: Any) -> Any:
    """``engine.allgather`` of a device array; the result is a device array."""
    _staged(backend, engine.rank)
    import cupy  # noqa: PLC0415 - only device arrays get here

    return cupy.asarray(engine.allgather(np.ascontiguousarray(data.get())))
