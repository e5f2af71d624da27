"""Device arrays on a real GPU (skipped without CuPy and a device): the staged
backend in one process and on 2 ranks sharing the GPU, the NCCL backend on
one rank per GPU (with a GradientBucketer of CuPy parameters), and the torch
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


NCCL_PROGRAM = r"""
import cupy, numpy as np, rabit_py as rabit
from rabit_py.bucket import GradientBucketer
from rabit_py.gpu._nccl import NcclBackend
rabit.init(engine="mpi", gpu_backend="nccl")
rank, size = rabit.get_rank(), rabit.get_world_size()
cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
for dtype in (cupy.float16, cupy.float32, cupy.float64, cupy.int32, cupy.int64):
    x = cupy.full((1 << 20,), rank + 1, dtype=dtype)
    assert rabit.allreduce(x, rabit.Op.SUM) is x
    assert int(x[-1]) == size * (size + 1) // 2, (dtype, x[-1])
assert isinstance(rabit.api._engine.attachment("nccl"), NcclBackend)
params = [cupy.zeros((512, 256), cupy.float32), cupy.zeros(256, cupy.float32)]
bucketer = GradientBucketer(params, bucket_cap_mb=0.25, first_bucket_mb=0.001)
for index in reversed(range(len(params))):
    bucketer.mark_ready(index, cupy.full(params[index].shape, rank + 1.0, cupy.float32))
grads = bucketer.wait()
assert all(float(g.min()) == float(g.max()) == (size + 1) / 2 for g in grads)
bucketer.close()
from trainers.mlp import MLPClassifier
rng = np.random.default_rng(rank)
X = rng.normal(size=(512, 10)); y = (X[:, 0] > 0).astype(np.int64)
gpu = MLPClassifier([32], 2, steps=20, device="cuda").fit(X, y)
cpu = MLPClassifier([32], 2, steps=20, device="cpu").fit(X, y)
assert all(np.allclose(a, b, rtol=1e-6, atol=1e-9) for a, b in zip(gpu.params_, cpu.params_))
print("NCCL OK", rank, flush=True)
rabit.finalize()
"""


def test_nccl_backend_on_one_rank_per_gpu():
    ranks = min(DEVICES, 2)
    cmd = ([sys.executable, "-c", NCCL_PROGRAM] if ranks == 1
           else rabit_run(ranks, sys.executable, "-c", NCCL_PROGRAM))
    code, out = run(cmd, timeout=180)
    assert code == 0 and all(f"NCCL OK {r}" in out for r in range(ranks)), out


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
