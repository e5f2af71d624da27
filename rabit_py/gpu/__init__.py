"""CuPy arrays in the public API: the device transports (tier T1 of DESIGN.md;
this package imports ``engine.base`` and tier T0 only, and the facade hands
:func:`device_transports` to ``engine.create``). One GPU per rank:
:func:`rabit_py.select_device`.

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

from .._arrays import is_device_array, to_host
from ..config import GPU_BACKENDS
from ._transports import device_transports

__all__ = ["is_device_array", "to_host", "BACKENDS", "device_transports"]

BACKENDS = GPU_BACKENDS
