"""The transports an engine chooses from, in order (Note [transports]).

# Note [transports]
Every collective of the facade goes to ``engine.transport(data, op)``, which
asks an ordered list of candidates, as Horovod orders its backends, and the
first whose ``enabled(data, op)`` says yes carries the call:

1. ``nccl`` (``rabit_py.gpu``): device arrays, on the NCCL backend once the
   ranks chose it (Note [device arrays] in ``gpu/__init__.py``);
2. ``staged`` (``rabit_py.gpu``): the other device arrays, copied through
   (page-locked) host memory and carried by the host transport;
3. ``host``: NumPy arrays and objects, the engine's own collectives: the
   engine is its own host transport.

The host transport picks shared memory or MPI inside the call (Note [fixed
groups] in ``_shm.py``, ``_reduce.HostReduce``), not as candidates of their
own: that choice depends on the message size and op and must be made inside
the call frame (numbered, checked, watched, and replayed by the robust
engine from the same cache either way), which only the engine's own
collective has.

The device candidates are made at the first call on something else than a
NumPy array, and only if it is a device array, by the factory that the
engine's maker gave (``engine.create(..., device_transports=)``; the facade
gives ``rabit_py.gpu``'s, which this package cannot import: ``gpu`` builds
on ``engine.base``). ``rabit_py.gpu`` (and CuPy) is never imported by a
program that passes only host data; without a factory a device array is
refused as any unknown type is. A NumPy array
takes the host transport without asking the list (one type check: this is
every call's path).
"""

from __future__ import annotations

from typing import Any, List, Optional

from .._arrays import is_device_array
from .base import DeviceTransports, Engine, Transport

__all__ = ["Transports"]


class Transports:
    """An engine's ordered candidates (Note [transports])."""

    def __init__(self, engine: Engine, host: Transport,
                 device_transports: Optional[DeviceTransports]) -> None:
        self._engine = engine
        self._device_transports = device_transports
        self.host = host
        self._candidates: Optional[List[Transport]] = None

    def for_call(self, data: Any, op: Any) -> Transport:
        """The first candidate enabled for a call on ``data`` (the engine
        itself answers a NumPy array before asking: every call's path)."""
        if self._candidates is None:
            if self._device_transports is None or not is_device_array(data):
                return self.host
            self._candidates = self._device_transports(self._engine) + [self.host]
        for candidate in self._candidates:
            if candidate.enabled(data, op):
                return candidate
        return self.host        # not reached: the host transport is always enabled

    @property
    def candidates(self) -> List[str]:
        """The candidates' names, in order (the device ones once made)."""
        return [c.name for c in (self._candidates or [self.host])]
