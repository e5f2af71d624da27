"""Fixtures for tests that run on every rank (under pytest-mpi)."""

import sys
from typing import Any, List

import numpy as np
import pytest

import rabit_py as rabit
# MPI started the way rabit_py starts it: a one-process run (no mpirun) then
# skips the shared-memory BTL, whose file a plain `from mpi4py import MPI`
# left in /dev/shm at every such run (one per CI run).
from rabit_py.engine._mpistart import MPI

WORLD = MPI.COMM_WORLD


def pytest_collection_modifyitems(items: List[Any]) -> None:
    for item in items:
        item.add_marker(pytest.mark.mpi)


def _engines():
    from rabit_py.engine._startup import ulfm_enabled
    return ["mpi", "robust"] if ulfm_enabled() else ["mpi"]


@pytest.fixture(params=_engines())
def session(request):
    """A rabit_py job on COMM_WORLD for one test, on the plain and (where MPI
    fault tolerance is on) the robust engine, with a timeout so that a test
    that breaks the lockstep fails instead of waiting."""
    rabit.init(engine=request.param, timeout=60)
    yield request.param
    rabit.finalize()


@pytest.fixture
def unchecked_session():
    rabit.init(engine="mpi", timeout=60, check=False)
    yield
    rabit.finalize()


def gather_bytes(arr: np.ndarray) -> List[bytes]:
    """Every rank's bytes of ``arr`` (over our own COMM_WORLD, not the engine)."""
    return WORLD.allgather(np.ascontiguousarray(arr).tobytes())


def same_on_all_ranks(arr: np.ndarray) -> bool:
    return len(set(gather_bytes(arr))) == 1


def needs_ranks(n: int):
    return pytest.mark.skipif(WORLD.Get_size() < n, reason=f"needs at least {n} ranks")


@pytest.fixture
def fake_cupy(monkeypatch):
    """The NumPy-backed CuPy/NCCL stand-in (tests/_fakecupy.py) as ``cupy``,
    one "GPU" per rank."""
    from .. import _fakecupy

    if getattr(sys.modules.get("cupy"), "__file__", None):
        pytest.skip("real CuPy is imported: tests/gpu covers it")
    modules = {}
    _fakecupy.install(modules)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(_fakecupy.ndarray, "device_of_rank", staticmethod(lambda rank: rank))
    yield _fakecupy
