"""The torch adapter on every rank (skipped where torch is not installed):
gradients reduced during backward equal the average of every rank's
gradients, unused parameters get zeros, no_sync accumulates, and a few
optimizer steps match one process training on all ranks' data. The CUDA
path (DLPack views, CuPy buckets, NCCL) runs here on CPU tensors that the
adapter is told are CUDA ones, with the CuPy/NCCL stand-in; tests/gpu runs it
on a real GPU."""

from types import SimpleNamespace

import numpy as np
import pytest

import rabit_py as rabit

from .conftest import WORLD, same_on_all_ranks

if WORLD.Get_size() > 2:
    # The adapter's logic is the same at any world size; importing torch
    # costs each of 4 oversubscribed ranks seconds (CI time).
    pytest.skip("the torch adapter's tests run at 1 and 2 ranks", allow_module_level=True)
torch = pytest.importorskip("torch")
rt = pytest.importorskip("rabit_py.torch")

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 16)
        self.b = torch.nn.Linear(16, 3)
        self.unused = torch.nn.Linear(4, 4)     # never called in forward

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)


def local_grads(net, rank, step):
    net.zero_grad(set_to_none=True)
    x, y = batch(rank, step)
    torch.nn.functional.cross_entropy(net(x), y).backward()
    return [None if p.grad is None else p.grad.clone() for p in net.parameters()]


def reduced_step(net, model):
    """Every rank's gradients of step 0, computed here on a copy with the same
    weights; then this rank's step 0 through ``model``, synchronized."""
    reference = Net()
    reference.load_state_dict(net.state_dict())
    per_rank = [local_grads(reference, r, 0) for r in range(SIZE)]
    net.zero_grad(set_to_none=True)
    x, y = batch(RANK, 0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model.synchronize()
    return per_rank


@pytest.fixture
def session_torch():
    torch.manual_seed(RANK)                # different initial weights on every rank
    rabit.init(engine="mpi", timeout=60)
    yield
    rabit.finalize()


def test_gradients_are_the_average_over_ranks(session_torch):
    net = Net()
    model = rt.DistributedModule(net, bucket_cap_mb=2e-4, first_bucket_mb=1e-4)
    try:
        assert len(model.bucketer.buckets) >= 3
        state = [p.detach().numpy().copy() for p in net.parameters()]
        assert same_on_all_ranks(np.concatenate([s.ravel() for s in state]))   # rank 0's
        per_rank = reduced_step(net, model)
        for i, p in enumerate(net.parameters()):
            if per_rank[0][i] is None:             # the unused layer
                assert not p.grad.any()
                continue
            want = sum(g[i] for g in per_rank) / SIZE
            torch.testing.assert_close(p.grad, want, rtol=1e-6, atol=1e-7)
            assert same_on_all_ranks(p.grad.numpy())
    finally:
        model.close()


def test_no_sync_accumulates_then_reduces(session_torch):
    net = Net()
    model = rt.DistributedModule(net, average=False)
    try:
        reference = Net()
        reference.load_state_dict(net.state_dict())
        want = [sum(local_grads(reference, r, s)[0] for r in range(SIZE) for s in (1, 2))]
        net.zero_grad(set_to_none=True)
        with model.no_sync():
            x, y = batch(RANK, 1)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            model.synchronize()                     # local only
        x, y = batch(RANK, 2)
        torch.nn.functional.cross_entropy(model(x), y).backward()   # accumulates on top
        model.synchronize()
        torch.testing.assert_close(net.a.weight.grad, want[0], rtol=1e-5, atol=1e-6)
    finally:
        model.close()


def test_training_matches_one_process_on_all_the_data(session_torch):
    net = Net()
    model = rt.DistributedModule(net)
    single = Net()
    single.load_state_dict(net.state_dict())
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  model)
    ref_opt = torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9)
    try:
        for step in range(4):
            opt.zero_grad()
            x, y = batch(RANK, step)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            # One process, the same global batch (mean over ranks' means).
            ref_opt.zero_grad()
            loss = sum(torch.nn.functional.cross_entropy(single(batch(r, step)[0]),
                                                         batch(r, step)[1])
                       for r in range(SIZE)) / SIZE
            loss.backward()
            ref_opt.step()
        for p, q in zip(net.parameters(), single.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert same_on_all_ranks(torch.cat([p.detach().ravel() for p in net.parameters()])
                                 .numpy())
    finally:
        model.close()


def test_bad_use(session_torch):
    with pytest.raises(TypeError, match="DistributedModule"):
        rt.DistributedOptimizer(torch.optim.SGD(Net().parameters(), lr=0.1), Net())


def test_the_cuda_path_reduces_through_dlpack_views_and_nccl(session_torch, fake_cupy,
                                                               monkeypatch):
    # CPU tensors taken for CUDA ones: the adapter's CUDA branch (DLPack views
    # both ways, torch's stream made CuPy's) on the stand-in's "device" arrays.
    monkeypatch.setattr(rt, "_device_type", lambda tensor: "cuda")
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(cuda_stream=1234))
    entered = fake_cupy.ExternalStream.entered
    net = Net()
    model = rt.DistributedModule(net, bucket_cap_mb=2e-4, first_bucket_mb=1e-4)
    try:
        assert all(isinstance(f, fake_cupy.ndarray) for f in model.bucketer._flat)
        # the parameters were broadcast in place through their DLPack views
        assert same_on_all_ranks(torch.cat([p.detach().ravel() for p in net.parameters()])
                                 .numpy())
        per_rank = reduced_step(net, model)
        buckets = [f.ctypes.data for f in model.bucketer._flat]
        spans = [(b, b + f.nbytes) for b, f in zip(buckets, model.bucketer._flat)]
        for i, p in enumerate(net.parameters()):
            # the gradient is a view of its bucket (no copy back)
            assert any(lo <= p.grad.data_ptr() < hi for lo, hi in spans)
            if per_rank[0][i] is None:
                assert not p.grad.any()
                continue
            want = sum(g[i] for g in per_rank) / SIZE
            torch.testing.assert_close(p.grad, want, rtol=1e-6, atol=1e-7)
        # the broadcast, each used parameter's hook and the synchronize ran on
        # torch's stream
        used = sum(g is not None for g in per_rank[0])
        assert fake_cupy.ExternalStream.entered - entered == 1 + used + 1
        if SIZE > 1:
            nccl = rabit.api._engine.resources.nccl
            assert nccl._comm.calls >= len(model.bucketer.buckets)
    finally:
        model.close()


def test_parameters_on_several_devices_are_refused(session_torch, monkeypatch):
    net = Net()
    monkeypatch.setattr(rt, "_device_type",
                        lambda tensor: "cuda" if tensor.shape == (16, 5) else "cpu")
    with pytest.raises(TypeError, match="several devices.*cpu.*cuda"):
        rt.DistributedModule(net)
    monkeypatch.setattr(rt, "_device_type", lambda tensor: "meta")
    with pytest.raises(TypeError, match="dense CPU or CUDA"):
        rt.DistributedModule(net)
