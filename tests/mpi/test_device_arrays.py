"""Device (CuPy) arrays through the public API with the staged backend, on
every rank (the NCCL backend: test_nccl_backend.py). No GPU is needed: a
stand-in array type from a module named ``cupy...`` exposes what the staged
backend uses (``get``, ``set``, shape, dtype) and a stand-in
``cupy.asarray``; where real CuPy and a GPU exist, tests/gpu runs the same
calls on the device (scripts/gpu_check.sh)."""

import sys
import types

import numpy as np
import pytest

import rabit_py as rabit

from ._fakes import FakeDeviceArray
from .conftest import WORLD

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()


@pytest.fixture
def fake_cupy(monkeypatch):
    if "cupy" in sys.modules and not isinstance(sys.modules["cupy"], types.SimpleNamespace):
        pytest.skip("real CuPy is imported: tests/gpu covers it")
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(asarray=FakeDeviceArray))


@pytest.fixture(params=["auto", "staged"])
def device_session(request, session, fake_cupy):
    # `session` started the engine; the backend is a setting, read per call.
    rabit.finalize()
    rabit.init(engine=session, timeout=60, gpu_backend=request.param)
    yield


def test_allreduce_broadcast_allgather_of_device_arrays(device_session):
    data = FakeDeviceArray(np.full((3, 4), RANK + 1.0, dtype=np.float32))
    assert rabit.allreduce(data, rabit.Op.SUM) is data
    np.testing.assert_array_equal(data.get(), np.full((3, 4), SIZE * (SIZE + 1) / 2))

    def prepare(buf):
        assert isinstance(buf, FakeDeviceArray)          # the caller's device array
        buf.fill(RANK)

    filled = FakeDeviceArray(np.zeros(5, dtype=np.int64))
    rabit.allreduce(filled, rabit.Op.MAX, prepare_fun=prepare)
    assert (filled.get() == SIZE - 1).all()

    mine = FakeDeviceArray(np.full(6, RANK, dtype=np.int32))
    assert rabit.broadcast(mine, 0) is mine
    assert (mine.get() == 0).all()
    got = rabit.broadcast(FakeDeviceArray(np.arange(3.0)) if RANK == 0 else None, 0)
    np.testing.assert_array_equal(got if RANK else got.get(), np.arange(3.0))

    rows = rabit.allgather(FakeDeviceArray(np.full((2, 3), RANK, dtype=np.int16)))
    assert isinstance(rows, FakeDeviceArray)
    np.testing.assert_array_equal(rows.get(), np.repeat(np.arange(SIZE), 2)[:, None]
                                  * np.ones((1, 3), dtype=np.int16))


def test_bad_backend_setting():
    with pytest.raises(ValueError, match="gpu_backend='cuda' is not one of"):
        rabit.init(gpu_backend="cuda")
