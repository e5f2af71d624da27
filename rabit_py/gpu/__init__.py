"""CuPy arrays in the public API.

# Note [device arrays]
``allreduce``, ``broadcast`` and ``allgather`` accept CuPy arrays. The backend
is chosen by ``RABIT_GPU_BACKEND`` (``Config.gpu_backend``):

- ``staged``: the array is copied to host memory (a page-locked buffer
  reused per shape and dtype where ``cupyx`` is there), reduced by the engine
  exactly as a NumPy array (so the signature check, the timeout and the
  robust engine's cache and recovery apply unchanged), and copied back into
  the device array. For machines where ranks share a GPU or NCCL is missing,
  and for the robust engine.
- ``nccl``: allreduce, broadcast and allgather through ``cupy.cuda.nccl`` on
  the devices (Note [nccl backend] in ``_nccl.py``), one GPU per rank; with
  the robust engine too (results kept as host copies for replay, the
  communicator made again after a recovery).
- ``auto``: with the plain engine, ``nccl`` where every rank can use it
  (NCCL importable everywhere, no two ranks of a node on one device; decided
  once, together, at the first device allreduce or allgather), else
  ``staged``; with the robust engine ``staged`` (a decision made together
  cannot be made while a replacement replays).

Nothing here imports CuPy unless a device array is passed: an array is a
device array when its type comes from the ``cupy`` package.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import numpy as np

from ..config import GPU_BACKENDS
from ..errors import RabitError

__all__ = ["is_device_array", "to_host", "allreduce", "broadcast", "allgather", "BACKENDS",
           "select_device"]

BACKENDS = GPU_BACKENDS


def is_device_array(data: Any) -> bool:
    """Whether ``data`` is a CuPy array (checked without importing CuPy; on
    every collective call, so kept cheap)."""
    module = type(data).__module__
    return module.startswith("cupy") and (len(module) == 4 or module[4] == ".")


def select_device() -> int:
    """Make GPU ``rank % device_count`` CuPy's current device, and return its
    index: one rank per GPU where ranks fill each node in blocks of its GPU
    count (a node's first G ranks on its G GPUs: Open MPI's default by-slot
    placement with as many slots as GPUs, or ``--map-by ppr:G:node``). A
    replacement that takes a dead rank's number takes its GPU. Not
    collective. For torch: ``torch.cuda.set_device(rabit_py.gpu.select_device())``.

    Raises:
        ImportError: CuPy is not installed.
        RabitError: no CUDA device is visible to this process.
        NotInitializedError: before ``rabit_py.init()``.
    """
    import cupy  # noqa: PLC0415 - only for GPU programs

    from .. import api  # noqa: PLC0415 - the facade imports this module

    rank = api.get_rank()
    count = cupy.cuda.runtime.getDeviceCount()
    if count < 1:
        raise RabitError(f"rank {rank}: no CUDA device is visible to this process "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                         f"use NumPy arrays, or run where a GPU is")
    device = rank % count
    cupy.cuda.Device(device).use()
    return device


def to_host(data: Any) -> Any:
    """A device array's host copy (``.get()``); anything else as it is."""
    return data.get() if is_device_array(data) else data


def _nccl_backend(engine: Any, backend: str, data: Any, op: Any) -> Any:
    """The engine's NCCL backend for this allreduce (``op`` None: for an
    allgather, which only moves bytes), or None for staging (see Note [device
    arrays]). Collective the first time it decides."""
    if backend == "staged":
        return None
    from ._nccl import ATTACHMENT, NcclBackend, nccl_reason, takes_nccl

    if not takes_nccl(data, op):
        return None
    if getattr(engine, "replays_results", False):
        # The robust engine: a replacement's calls may be served from the
        # cache while the others wait in recovery rounds, so no collective
        # decision here; NCCL only when asked for (one GPU per rank assumed).
        if backend != "nccl":
            return None
        return engine.attachment(ATTACHMENT, lambda: NcclBackend(engine, int(data.device.id)))
    chosen = engine.attachment(ATTACHMENT)
    if chosen is not None:
        return None if isinstance(chosen, _Staged) else chosen
    # Every rank must take the same path: decide together.
    device = int(data.device.id)
    mine = (nccl_reason(), engine.processor_name(), device)
    everyone = engine.side_allgather(mine)
    problems = [f"rank {r}: {why}" for r, (why, _, _) in enumerate(everyone) if why]
    places = [(host, dev) for _, host, dev in everyone]
    if len(set(places)) != len(places):
        problems.append("two ranks use the same GPU of a node (NCCL needs one rank per GPU; "
                        "pick a device per rank: rabit_py.gpu.select_device())")
    if problems:
        if backend == "nccl":
            raise RabitError(f"rank {engine.rank}: RABIT_GPU_BACKEND=nccl cannot be used: "
                             + "; ".join(problems))
        engine.attach(ATTACHMENT, _Staged())
        return None
    return engine.attach(ATTACHMENT, NcclBackend(engine, device))


class _Staged:
    """The decision "staged", kept in the engine's attachments."""

    def close(self) -> None:
        pass


def allreduce(engine: Any, backend: str, data: Any, op: Any,
              prepare_fun: Optional[Callable[[Any], None]]) -> Any:
    """Reduce the device array ``data`` in place across ranks and return it:
    through NCCL where chosen (Note [device arrays]), else through host
    memory with ``engine.allreduce``, where ``prepare_fun`` (if any) fills
    the device array and is skipped exactly when the engine skips it (a
    result served from the robust engine's cache)."""
    nccl = _nccl_backend(engine, backend, data, op)
    if nccl is not None:
        return nccl.allreduce(data, op, prepare_fun)
    pinned = _pinned_buffer(engine, data)
    host = _download(data, pinned)
    prepare = None
    if prepare_fun is not None:
        def prepare(buffer: np.ndarray) -> None:
            prepare_fun(data)
            _download(data, buffer)
    engine.allreduce(host, op, prepare)
    data.set(host)
    return data


def _download(data: Any, out: Optional[np.ndarray]) -> np.ndarray:
    """``data``'s contents in host memory: into ``out`` if given (a buffer of
    its shape and dtype), else a new array."""
    if out is None:
        return np.ascontiguousarray(data.get())
    data.get(out=out)
    return out


_PINNED = "pinned-buffers"
_MAX_PINNED = 16


class _PinnedBuffers:
    """Page-locked host buffers by (shape, dtype), kept with the engine: a
    copy between the device and pinned memory runs at full PCIe speed, from
    pageable memory at a fraction of it. At most ``_MAX_PINNED`` shapes."""

    def __init__(self, make: Callable[..., np.ndarray]) -> None:
        self._make = make
        self._buffers: dict = {}

    def get(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        key = (shape, dtype.str)
        buffer = self._buffers.get(key)
        if buffer is None:
            if len(self._buffers) >= _MAX_PINNED:
                self._buffers.clear()
            buffer = self._buffers[key] = self._make(shape, dtype=dtype)
        return buffer

    def close(self) -> None:
        self._buffers.clear()


def _pinned_buffer(engine: Any, data: Any) -> Optional[np.ndarray]:
    """A reused pinned host buffer for ``data`` (staged allreduce), or None
    where pinned memory is not available (no ``cupyx``, a stand-in array)."""
    if not getattr(getattr(data, "flags", None), "c_contiguous", False):
        return None
    try:
        import cupyx  # noqa: PLC0415 - comes with CuPy
    except ImportError:
        return None
    buffers = engine.attachment(_PINNED, lambda: _PinnedBuffers(cupyx.empty_pinned))
    return buffers.get(tuple(data.shape), np.dtype(data.dtype))


def broadcast(engine: Any, backend: str, data: Any, root: int) -> Any:
    """``engine.broadcast`` of a device array: on the engine's NCCL backend
    once it was chosen (the engine sends it there: receivers may pass another
    array or None, Note [nccl backend]), else staged through host memory. The
    root's device array is sent; a rank that passes a device array of the same
    shape and dtype receives in place, others get what the engine returns."""
    transport = engine.device_transport()
    if transport is not None and transport.carries(data):
        result = engine.broadcast(data, root)
        if result is data or is_device_array(result) or not isinstance(result, np.ndarray):
            return result
        host = result                   # the root sent a host array (or an object)
    else:
        host = engine.broadcast(to_host(data), root)
    if isinstance(host, np.ndarray) and host.shape == tuple(data.shape) \
            and host.dtype == data.dtype:
        data.set(host)
        return data
    return host


def allgather(engine: Any, backend: str, data: Any) -> Any:
    """``engine.allgather`` of a device array; the result is a device array.
    On NCCL where the backend chooses it (as for allreduce: every rank of an
    allgather passes a device array, so the choice is made together here if
    not made yet), else staged through host memory."""
    if getattr(data, "ndim", 0) >= 1 and _nccl_backend(engine, backend, data, None) is not None:
        return engine.device_allgather(data)
    import cupy  # noqa: PLC0415 - only device arrays get here

    return cupy.asarray(engine.allgather(np.ascontiguousarray(data.get())))
