"""Where rabit_py starts MPI: every engine module imports ``MPI`` from here,
so the choice below applies whichever module is imported first."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

__all__ = ["MPI", "singleton_without_libfabric"]

_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


@contextlib.contextmanager
def singleton_without_libfabric() -> Iterator[None]:
    """Around the import that starts MPI: a process started without mpirun
    (a one-rank job) skips Open MPI's libfabric BTL, which spends about a
    second in MPI_Init where there is no libfabric network, and its
    shared-memory BTL, whose backing file a one-process job leaves behind in
    ``/dev/shm`` at every start (seen: 36 after one test run); one process
    needs neither. The variable is set only for that moment, and never
    over the user's own ``OMPI_MCA_btl`` or in a launched rank (rabit-run
    passes the same choice to mpirun on one node)."""
    here = (not any(name in os.environ for name in _LAUNCHER_VARIABLES)
            and "mpi4py.MPI" not in sys.modules and "OMPI_MCA_btl" not in os.environ)
    if here:
        os.environ["OMPI_MCA_btl"] = "^ofi,sm"
    try:
        yield
    finally:
        if here:
            os.environ.pop("OMPI_MCA_btl", None)


with singleton_without_libfabric():
    from mpi4py import MPI  # noqa: E402 - MPI starts here (mpi4py initializes it on import)
