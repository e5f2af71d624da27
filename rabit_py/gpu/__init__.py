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

from ..config import GPU_BACKENDS
from ..errors import RabitError
from ._arrays import is_device_array, to_host

__all__ = ["is_device_array", "to_host", "BACKENDS", "select_device"]

BACKENDS = GPU_BACKENDS


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
