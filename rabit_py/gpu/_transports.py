"""The device transports: NCCL where chosen, else staged through pinned host
memory (Note [device arrays] in ``__init__.py``). The engine asks them in
order, before its host transport (Note [transports] in
``engine/_transports.py``)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np

from ..engine.base import BROADCAST, Engine, PrepareFn, Transport
from ..errors import RabitError
from .._arrays import is_device_array, to_host

__all__ = ["NcclTransport", "StagedTransport", "device_transports"]


def device_transports(engine: Engine) -> List[Transport]:
    """The device candidates of ``engine``, in the order they are asked."""
    return [NcclTransport(engine), StagedTransport(engine)]


class NcclTransport(Transport):
    """Device arrays on the engine's NCCL backend (``resources.nccl``),
    chosen as Note [device arrays] says; the engine frames each call."""

    name = "nccl"

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def enabled(self, data: Any, op: Any) -> bool:
        if op == BROADCAST:
            # A broadcast cannot choose (receivers may pass None): it takes
            # NCCL once an allreduce or allgather chose it (Note [nccl backend]).
            nccl = self._engine.resources.nccl
            return nccl is not None and nccl.carries(data)
        if op is None and getattr(data, "ndim", 0) < 1:
            return False                # the engine refuses it with its message
        return self._backend(data, op) is not None

    def _backend(self, data: Any, op: Any) -> Any:
        """The engine's NCCL backend for this call (``op`` None: an allgather,
        which only moves bytes), or None for staging. Collective the first
        time it decides."""
        engine, resources = self._engine, self._engine.resources
        backend = engine.config.gpu_backend
        if backend == "staged":
            return None
        from ._nccl import NcclBackend, nccl_reason, takes_nccl  # noqa: PLC0415 - CuPy

        if not takes_nccl(data, op):
            return None
        if engine.replays_results:
            # The robust engine: a replacement's calls may be served from the
            # cache while the others wait in recovery rounds, so no collective
            # decision here; NCCL only when asked for (one GPU per rank assumed).
            if backend != "nccl":
                return None
            if resources.nccl is None:
                resources.nccl = NcclBackend(engine, int(data.device.id))
            return resources.nccl
        if resources.nccl is not None or resources.staged:
            return resources.nccl
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
            resources.staged = True
            return None
        resources.nccl = NcclBackend(engine, device)
        return resources.nccl

    def allreduce(self, data: Any, op: Any, prepare_fun: Optional[PrepareFn]) -> Any:
        return self._engine.resources.nccl.allreduce(data, op, prepare_fun)

    def broadcast(self, data: Any, root: int) -> Any:
        # The engine sends it on the backend (receivers may pass another
        # array or None, Note [nccl backend]).
        result = self._engine.broadcast(data, root)
        if result is data or is_device_array(result) or not isinstance(result, np.ndarray):
            return result
        return _into(data, result)      # the root sent a host array

    def allgather(self, data: Any) -> Any:
        return self._engine.device_allgather(data)


class StagedTransport(Transport):
    """Device arrays copied to host memory and carried by the engine's host
    collectives (so the signature check, the timeout and the robust engine's
    cache apply unchanged), then copied back."""

    name = "staged"

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def enabled(self, data: Any, op: Any) -> bool:
        return is_device_array(data)

    def allreduce(self, data: Any, op: Any, prepare_fun: Optional[PrepareFn]) -> Any:
        """Reduce the device array ``data`` in place through host memory,
        where ``prepare_fun`` (if any) fills the device array and is skipped
        exactly when the engine skips it (a result served from the robust
        engine's cache)."""
        host = _download(data, self._pinned_buffer(data))
        def prepare_host(buffer: np.ndarray) -> None:
            prepare_fun(data)
            _download(data, buffer)

        self._engine.allreduce(host, op, prepare_host if prepare_fun is not None else None)
        data.set(host)
        return data

    def _pinned_buffer(self, data: Any) -> Optional[np.ndarray]:
        """A reused pinned host buffer for ``data``, or None where pinned
        memory is not available (no ``cupyx``, a stand-in array)."""
        if not getattr(getattr(data, "flags", None), "c_contiguous", False):
            return None
        try:
            import cupyx  # noqa: PLC0415 - comes with CuPy
        except ImportError:
            return None
        resources = self._engine.resources
        if resources.pinned is None:
            resources.pinned = PinnedBuffers(cupyx.empty_pinned)
        return resources.pinned.get(tuple(data.shape), np.dtype(data.dtype))

    def broadcast(self, data: Any, root: int) -> Any:
        """The root's device array, sent as a host array: a rank that passes
        a device array of the same shape and dtype receives in place, others
        get what the engine returns."""
        return _into(data, self._engine.broadcast(to_host(data), root))

    def allgather(self, data: Any) -> Any:
        import cupy  # noqa: PLC0415 - only device arrays get here

        return cupy.asarray(self._engine.allgather(np.ascontiguousarray(data.get())))


def _into(data: Any, host: Any) -> Any:
    """``host`` copied into the device array ``data`` where it fits (same
    shape and dtype, returning ``data``), else ``host`` itself."""
    if isinstance(host, np.ndarray) and host.shape == tuple(data.shape) \
            and host.dtype == data.dtype:
        data.set(host)
        return data
    return host


def _download(data: Any, out: Optional[np.ndarray]) -> np.ndarray:
    """``data``'s contents in host memory: into ``out`` if given (a buffer of
    its shape and dtype), else a new array."""
    if out is None:
        return np.ascontiguousarray(data.get())
    data.get(out=out)
    return out


_MAX_PINNED = 16


class PinnedBuffers:
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
