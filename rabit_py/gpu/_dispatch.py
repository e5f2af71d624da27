"""Device arrays in the collectives: NCCL where chosen, else staged through
pinned host memory (Note [device arrays] in ``__init__.py``). Called by the
facade with the current engine."""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ..errors import RabitError
from ._arrays import is_device_array, to_host

__all__ = ["allreduce", "broadcast", "allgather"]


def _nccl_backend(engine: Any, backend: str, data: Any, op: Any) -> Any:
    """The engine's NCCL backend for this allreduce (``op`` None: for an
    allgather, which only moves bytes), or None for staging (see Note [device
    arrays]). Collective the first time it decides."""
    if backend == "staged":
        return None
    from ._nccl import ATTACHMENT, NcclBackend, nccl_reason, takes_nccl

    if not takes_nccl(data, op):
        return None
    if engine.replays_results:
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
