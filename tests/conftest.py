"""Shared pytest set-up.

``tests/mpi/`` holds tests that run on every rank of a real MPI job (pytest-mpi);
they are collected only under ``--with-mpi``, which ``tests/jobs/test_multirank.py``
passes when it starts them with mpirun at 1, 2 and 4 ranks.
"""

from pathlib import Path


def pytest_ignore_collect(collection_path: Path, config) -> bool:
    if collection_path.name == "mpi" and collection_path.is_dir():
        return not config.getoption("--with-mpi", default=False)
    return False
