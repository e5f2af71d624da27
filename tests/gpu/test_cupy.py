"""Device arrays on a real GPU (skipped without CuPy and a device): the staged
backend in one process and on 2 ranks sharing the GPU, and the torch
adapter's clear refusal of CUDA tensors. Run by scripts/gpu_check.sh on a GPU
machine."""

import sys

import pytest

from .._proc import rabit_run, run

cupy = pytest.importorskip("cupy")
try:
    DEVICES = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver, no device
    DEVICES = 0
pytestmark = pytest.mark.skipif(DEVICES == 0, reason="no CUDA device")

PROGRAM = r"""
import cupy, numpy as np, rabit_py as rabit
rabit.init()
rank, size = rabit.get_rank(), rabit.get_world_size()
x = cupy.full((1000, 3), rank + 1.0, dtype=cupy.float32)
assert rabit.allreduce(x, rabit.Op.SUM) is x
assert float(x.sum()) == 3000 * size * (size + 1) / 2
b = cupy.arange(5) * (rank + 1)
assert rabit.broadcast(b, 0) is b and (cupy.asnumpy(b) == np.arange(5)).all()
g = rabit.allgather(cupy.full((2, 2), rank, dtype=cupy.int32))
assert isinstance(g, cupy.ndarray) and g.shape == (2 * size, 2)
print("GPU OK", rank, flush=True)
rabit.finalize()
"""


def test_staged_backend_in_one_process():
    code, out = run([sys.executable, "-c", PROGRAM], timeout=120)
    assert code == 0 and "GPU OK 0" in out, out


def test_two_ranks_share_one_gpu_through_staged():
    code, out = run(rabit_run(2, sys.executable, "-c", PROGRAM), timeout=180)
    assert code == 0 and "GPU OK 0" in out and "GPU OK 1" in out, out


def test_torch_cuda_tensors_are_refused_clearly():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import rabit_py as rabit
    import rabit_py.torch as rt

    rabit.init(engine="mpi")
    try:
        with pytest.raises(TypeError, match="CUDA path"):
            rt.DistributedModule(torch.nn.Linear(2, 2).cuda())
    finally:
        rabit.finalize()
