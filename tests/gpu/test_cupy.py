"""Device arrays on a real GPU (skipped without CuPy and a device): the staged
backend in one process and on 2 ranks sharing the GPU, the NCCL backend on
one rank per GPU (allreduce, broadcast, allgather, and a GradientBucketer of
CuPy parameters), and the torch adapter on CUDA tensors (DLPack views,
gradients against the CPU). Run by scripts/gpu_check.sh on a GPU machine."""

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
from rabit_py.ddp.bucket import GradientBucketer
rabit.init(engine="mpi", gpu_backend="nccl")
rank, size = rabit.get_rank(), rabit.get_world_size()
assert rabit.select_device() == rank % cupy.cuda.runtime.getDeviceCount()
for dtype in (cupy.float16, cupy.float32, cupy.float64, cupy.int32, cupy.int64):
    x = cupy.full((1 << 20,), rank + 1, dtype=dtype)
    assert rabit.allreduce(x, rabit.Op.SUM) is x
    assert int(x[-1]) == size * (size + 1) // 2, (dtype, x[-1])
assert rabit.engine_info().nccl and "nccl" in rabit.engine_info().transports
b = cupy.arange(6, dtype=cupy.float64) * (rank + 1)
assert rabit.broadcast(b, 0) is b and (cupy.asnumpy(b) == np.arange(6)).all()
got = rabit.broadcast(None if rank else cupy.ones((2, 3), cupy.bool_), 0)
assert isinstance(got, cupy.ndarray) and got.shape == (2, 3) and bool(got.all())
g = rabit.allgather(cupy.full((rank + 1, 2), rank, dtype=cupy.complex64))
assert g.shape == (size * (size + 1) // 2, 2)
assert cupy.asnumpy(g[:, 0]).real.tolist() == [r for r in range(size) for _ in range(r + 1)]
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


TORCH_PROGRAM = r"""
import copy, cupy, torch, rabit_py as rabit, rabit_py.torch as rt
rabit.init(engine="mpi")
rank, size = rabit.get_rank(), rabit.get_world_size()
device = torch.device("cuda", rabit.select_device())
torch.cuda.set_device(device)
torch.manual_seed(rank)                 # rank 0's weights reach the others
net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
model = rt.DistributedModule(net.to(device), bucket_cap_mb=0.01, first_bucket_mb=0.001)
cpu = copy.deepcopy(net).cpu()


def batch(r):
    g = torch.Generator().manual_seed(r)
    return torch.randn(32, 20, generator=g), torch.randint(0, 3, (32,), generator=g)


x, y = batch(rank)
torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
model.synchronize()
per_rank = []
for r in range(size):
    cpu.zero_grad()
    xr, yr = batch(r)
    torch.nn.functional.cross_entropy(cpu(xr), yr).backward()
    per_rank.append([p.grad.clone() for p in cpu.parameters()])
for i, p in enumerate(net.parameters()):
    assert p.grad.is_cuda
    want = sum(g[i] for g in per_rank) / size
    assert torch.allclose(p.grad.cpu(), want, rtol=1e-4, atol=1e-5), (i, p.grad, want)
model.close()
print("TORCH CUDA OK", rank, flush=True)
rabit.finalize()
"""


def test_torch_cuda_tensors_are_reduced_through_dlpack():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    ranks = min(DEVICES, 2)
    cmd = ([sys.executable, "-c", TORCH_PROGRAM] if ranks == 1
           else rabit_run(ranks, sys.executable, "-c", TORCH_PROGRAM))
    code, out = run(cmd, timeout=180)
    assert code == 0 and all(f"TORCH CUDA OK {r}" in out for r in range(ranks)), out
