"""The NCCL backend's logic on every rank, with NumPy-backed stand-ins for
CuPy and cupy.cuda.nccl (tests/_fakecupy.py): which calls take NCCL, that
they are framed by the engine (numbering, signature check), the results
against MPI on host arrays, and the refusals. The real library is exercised
by tests/gpu where a GPU is lent (scripts/gpu_check.sh)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from mpi4py import MPI

import rabit_py as rabit
from rabit_py.gpu._nccl import NcclBackend

from .conftest import WORLD

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()


def start(engine="mpi", **config):
    rabit.init(engine=engine, timeout=60, **config)
    return rabit.api._engine


MPI_OPS = {rabit.Op.SUM: MPI.SUM, rabit.Op.PROD: MPI.PROD, rabit.Op.MAX: MPI.MAX,
           rabit.Op.MIN: MPI.MIN}


def host_allreduce(host, op):
    """The reference: MPI on the host arrays."""
    out = np.empty_like(host)
    WORLD.Allreduce(host, out, op=MPI_OPS[op])
    return out


@pytest.mark.parametrize("backend", ["auto", "nccl"])
def test_allreduce_takes_nccl_and_matches_mpi(fake_cupy, backend):
    engine = start(gpu_backend=backend)
    try:
        for dtype in (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int32,
                      np.int64, np.uint64):
            for op in (rabit.Op.SUM, rabit.Op.MAX, rabit.Op.MIN, rabit.Op.PROD):
                host = ((np.arange(12) * (RANK + 2)) % 5 + 1).astype(dtype).reshape(3, 4)
                data = fake_cupy.ndarray(host)
                assert rabit.allreduce(data, op) is data
                np.testing.assert_array_equal(data.get(), host_allreduce(host, op))
        backend_obj = engine.resources.nccl
        assert isinstance(backend_obj, NcclBackend)
        assert backend_obj._comm.calls == 8 * 4
        assert backend_obj.device == RANK
        # prepare_fun fills the device array, after the signature check
        filled = fake_cupy.ndarray(np.zeros(5, dtype=np.float32))
        rabit.allreduce(filled, rabit.Op.SUM, prepare_fun=lambda d: d.fill(RANK))
        assert (filled.get() == SIZE * (SIZE - 1) / 2).all()
        # the calls are numbered like any other: a checkpoint after them agrees
        rabit.checkpoint({"step": 1})
    finally:
        rabit.finalize()
    assert backend_obj._comm.destroyed          # finalize released the communicator


def test_what_nccl_lacks_is_staged(fake_cupy):
    engine = start()
    try:
        flags = fake_cupy.ndarray(np.array([RANK == 0, False, True]))
        rabit.allreduce(flags, rabit.Op.BITOR)
        assert flags.get().tolist() == [True, False, True]
        bits = fake_cupy.ndarray(np.full(3, 1 << RANK, dtype=np.int32))
        rabit.allreduce(bits, rabit.Op.BITOR)
        assert (bits.get() == (1 << SIZE) - 1).all()
        custom = fake_cupy.ndarray(np.full(2, RANK + 1.0))
        rabit.allreduce(custom, rabit.Op.create(np.maximum))
        assert (custom.get() == SIZE).all()
        # none of these reached NCCL (nor made a communicator)
        assert engine.resources.nccl is None
        # a broadcast before the backend is chosen (by a device allreduce or
        # allgather) is staged
        mine = fake_cupy.ndarray(np.full(4, RANK, dtype=np.int64))
        rabit.broadcast(mine, 0)
        assert (mine.get() == 0).all()
        assert engine.resources.nccl is None
    finally:
        rabit.finalize()


def host_allgather(host):
    """The reference: MPI's allgather of host rows."""
    return np.concatenate(WORLD.allgather(host))


# bool and complex have no NCCL arithmetic type; broadcast and allgather move bytes
MOVED_DTYPES = (np.float32, np.float64, np.int8, np.uint64, np.bool_, np.complex128, np.float16)


@pytest.mark.parametrize("check", [True, False])
def test_broadcast_and_allgather_take_nccl_once_chosen(fake_cupy, check):
    engine = start(gpu_backend="nccl", check=check)
    try:
        rng = np.random.default_rng(7)           # the same values on every rank
        # rows that differ from rank to rank (padded on the wire), then equal rows
        for dtype in MOVED_DTYPES:
            for rows in (RANK + 1, 2):
                host = (rng.standard_normal((SIZE * 3, 5)) * 9)[RANK::SIZE][:rows]
                host = host.astype(dtype)
                gathered = rabit.allgather(fake_cupy.ndarray(host))
                assert isinstance(gathered, fake_cupy.ndarray)
                reference = host_allgather(host)
                assert gathered.shape == reference.shape
                assert gathered.get().tobytes() == reference.tobytes()
        nccl = engine.resources.nccl
        assert isinstance(nccl, NcclBackend)     # chosen by the first allgather
        # (one rank alone moves nothing: no communicator is made)
        assert SIZE == 1 or nccl._comm.allgathers == 2 * len(MOVED_DTYPES)
        # no rank has rows: nothing moves, an empty array of the right shape
        empty = rabit.allgather(fake_cupy.ndarray(np.zeros((0, 3), dtype=np.int32)))
        assert empty.shape == (0, 3) and empty.dtype == np.int32

        root = SIZE - 1
        for dtype in MOVED_DTYPES:
            for shape in ((6,), (2, 3, 1, 2, 2)):     # 5 dims: the shape takes a 2nd message
                sent = (rng.standard_normal(shape) * 9).astype(dtype)
                receiver = RANK % 4
                if RANK == root:
                    data = fake_cupy.ndarray(sent)
                elif receiver == 0:                   # a matching device array: in place
                    data = fake_cupy.ndarray(np.zeros(shape, dtype))
                elif receiver == 1:                   # None: a new device array
                    data = None
                elif receiver == 2:                   # a matching NumPy array: in place
                    data = np.zeros(shape, dtype)
                else:                                 # a strided device view: in place
                    data = fake_cupy.ndarray(np.zeros(shape[::-1], dtype)).T
                result = rabit.broadcast(data, root)
                if data is not None:
                    assert result is data
                else:
                    assert isinstance(result, fake_cupy.ndarray)
                host_result = result if isinstance(result, np.ndarray) and \
                    not isinstance(result, fake_cupy.ndarray) else result.get()
                assert host_result.shape == shape
                assert np.ascontiguousarray(host_result).tobytes() == sent.tobytes()
        assert SIZE == 1 or nccl._comm.broadcasts == 2 * len(MOVED_DTYPES)
        # a host array from the root reaches device receive buffers as before
        target = fake_cupy.ndarray(np.zeros(3)) if RANK else np.arange(3.0)
        assert rabit.broadcast(target, 0) is target
        assert (np.asarray(target.get() if RANK else target) == np.arange(3.0)).all()
        # the calls were numbered like any other: a checkpoint after them agrees
        rabit.checkpoint({"step": 1})
    finally:
        rabit.finalize()


def test_a_device_broadcast_into_a_wrong_buffer_is_reported(fake_cupy):
    if SIZE == 1:
        pytest.skip("needs two ranks")
    for check in (True, False):
        engine = start(gpu_backend="nccl", check=check)
        try:
            rabit.allgather(fake_cupy.ndarray(np.ones(1)))            # NCCL chosen
            shape = (3,) if RANK != 1 else (4,)
            data = fake_cupy.ndarray(np.full(shape, RANK, dtype=np.float32))
            if RANK == 1 or check:
                # checked: every rank hears of it before anything moves;
                # unchecked: the rank that passed the wrong buffer still
                # took part (nobody waits), and raises
                with pytest.raises(rabit.CollectiveMismatchError, match=r"\[4\]|shape"):
                    rabit.broadcast(data, 0)
            else:
                assert (rabit.broadcast(data, 0).get() == 0).all()
            assert engine.resources.nccl._comm.broadcasts == (0 if check else 1)
        finally:
            rabit.finalize()


def test_select_device_takes_rank_modulo_the_gpu_count(fake_cupy, monkeypatch):
    rabit.init(engine="mpi")
    try:
        for count in (1, 2, 3):
            monkeypatch.setattr(fake_cupy.runtime, "device_count", count)
            assert rabit.select_device() == RANK % count
            assert fake_cupy.Device.current == RANK % count
        monkeypatch.setattr(fake_cupy.runtime, "device_count", 0)
        with pytest.raises(rabit.RabitError, match=f"rank {RANK}: no CUDA device"):
            rabit.select_device()
    finally:
        rabit.finalize()
    with pytest.raises(rabit.NotInitializedError):
        rabit.select_device()


def test_shared_gpus_are_staged_or_refused(fake_cupy):
    fake_cupy.ndarray.device_of_rank = staticmethod(lambda rank: 0)
    engine = start()
    try:
        data = fake_cupy.ndarray(np.ones(3))
        rabit.allreduce(data, rabit.Op.SUM)
        assert (data.get() == SIZE).all()
        # one rank alone may use NCCL; several on one GPU stage through the host
        if SIZE == 1:
            assert isinstance(engine.resources.nccl, NcclBackend)
        else:
            assert engine.resources.nccl is None and engine.resources.staged
        assert engine.transport(data, rabit.Op.SUM).name == ("nccl" if SIZE == 1 else "staged")
    finally:
        rabit.finalize()
    if SIZE == 1:
        return
    start(gpu_backend="nccl")
    try:
        with pytest.raises(rabit.RabitError, match="two ranks use the same GPU"):
            rabit.allreduce(fake_cupy.ndarray(np.ones(3)), rabit.Op.SUM)
    finally:
        rabit.finalize()


def test_the_robust_engine_stages_unless_nccl_is_asked_for(fake_cupy, session):
    if session != "robust":
        pytest.skip("the plain engine: tested above")
    engine = rabit.api._engine
    data = fake_cupy.ndarray(np.full(3, 2.0))
    rabit.allreduce(data, rabit.Op.SUM)
    assert (data.get() == 2.0 * SIZE).all() and engine.resources.nccl is None
    rabit.finalize()
    engine = start("robust", gpu_backend="nccl")
    for step in range(3):
        data = fake_cupy.ndarray(np.full(3, step + RANK + 1.0))
        rabit.allreduce(data, rabit.Op.SUM)
        assert (data.get() == SIZE * (step + 1) + SIZE * (SIZE - 1) / 2).all()
    nccl = engine.resources.nccl
    assert isinstance(nccl, NcclBackend) and nccl._comm.calls == 3
    # broadcast and allgather go through NCCL too
    mine = fake_cupy.ndarray(np.full(2, RANK, dtype=np.int64))
    assert rabit.broadcast(mine, 0) is mine and (mine.get() == 0).all()
    got = rabit.broadcast(None if RANK else fake_cupy.ndarray(np.arange(3.0)), 0)
    assert isinstance(got, fake_cupy.ndarray) and got.get().tolist() == [0.0, 1.0, 2.0]
    rows = rabit.allgather(fake_cupy.ndarray(np.full((RANK + 1, 2), RANK)))
    assert isinstance(rows, fake_cupy.ndarray)
    assert rows.get()[:, 0].tolist() == [r for r in range(SIZE) for _ in range(r + 1)]
    assert SIZE == 1 or (nccl._comm.broadcasts, nccl._comm.allgathers) == (2, 1)
    # kept for replay: a host copy of each result, marked as a device one
    entries = list(engine._cache._entries.values())
    assert all(type(e.payload) is np.ndarray and e.device for e in entries)
    assert len(entries) >= 1


def test_a_mismatch_on_the_nccl_path_is_reported(fake_cupy):
    if SIZE == 1:
        pytest.skip("needs two ranks")
    start()
    try:
        rabit.allreduce(fake_cupy.ndarray(np.ones(2)), rabit.Op.SUM)       # NCCL set up
        shape = (3,) if RANK == 0 else (4,)
        with pytest.raises(rabit.CollectiveMismatchError, match="shape"):
            rabit.allreduce(fake_cupy.ndarray(np.ones(shape)), rabit.Op.SUM)
    finally:
        rabit.finalize()


def test_the_bucketer_reduces_cupy_gradients_through_nccl(fake_cupy):
    from rabit_py.ddp.bucket import GradientBucketer

    shapes = [(300, 200), (200,), (200, 50), (50,), (7, 3)]
    start()
    try:
        host_params = [np.zeros(s, dtype=np.float32) for s in shapes]
        # One communication thread for both, so that every rank makes the
        # engine's calls in the same order.
        executor = ThreadPoolExecutor(max_workers=1)
        device = GradientBucketer([fake_cupy.ndarray(p) for p in host_params],
                                  bucket_cap_mb=0.2, first_bucket_mb=0.01, executor=executor)
        host = GradientBucketer(host_params, bucket_cap_mb=0.2, first_bucket_mb=0.01,
                                executor=executor)
        assert device.buckets == host.buckets and len(device.buckets) >= 3
        for step in range(2):
            # integer-valued gradients: any summation order gives the same bits
            grads = [((np.arange(np.prod(s)).reshape(s) + RANK + step) % 9).astype(np.float32)
                     for s in shapes]
            for index in reversed(range(len(shapes))):
                if index == 3 and step == 1:
                    continue                       # an unused parameter: zeros
                device.mark_ready(index, fake_cupy.ndarray(grads[index]))
                host.mark_ready(index, grads[index])
            got = device.wait()
            want = host.wait()
            assert all(type(g).__module__ == "cupy" for g in got)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g.get(), w)
        nccl = rabit.api._engine.resources.nccl
        assert nccl._comm.calls == 2 * len(device.buckets)
        executor.shutdown(wait=True)
    finally:
        rabit.finalize()


def test_the_bucketer_refuses_mixed_arrays(fake_cupy):
    from rabit_py.ddp.bucket import GradientBucketer

    with pytest.raises(TypeError, match="mix NumPy and CuPy"):
        GradientBucketer([np.zeros(3), fake_cupy.ndarray(np.zeros(3))])


def test_the_mlp_on_the_device_path_matches_the_cpu(fake_cupy):
    from rabit_py.ddp.bucket import plan_buckets
    from trainers.mlp import MLPClassifier

    rng = np.random.default_rng(7)
    X_all = rng.normal(size=(96 * SIZE, 5))
    y_all = (X_all[:, 0] + X_all[:, 1] ** 2 > 1).astype(np.int64)
    rows = slice(96 * RANK, 96 * (RANK + 1))
    fitted = {}
    for device in ("cpu", "cuda"):
        start()
        try:
            model = MLPClassifier([8], 2, steps=6, batch_size=64, learning_rate=0.05,
                                  checkpoint_every=3, bucket_cap_mb=0.001, device=device,
                                  first_bucket_mb=0.0002)
            fitted[device] = model.fit(X_all[rows], y_all[rows])
            if device == "cuda":
                shapes = [p.shape for p in model.params_]
                buckets = plan_buckets([8 * int(np.prod(s)) for s in shapes],
                                       [np.float64] * len(shapes), 0.001, 0.0002)
                assert len(buckets) >= 2
                # every bucket of every step went through NCCL
                assert rabit.api._engine.resources.nccl._comm.calls == 6 * len(buckets)
        finally:
            rabit.finalize()
    for a, b in zip(fitted["cpu"].params_, fitted["cuda"].params_):
        assert type(b) is np.ndarray                 # params_ are host arrays
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    assert abs(fitted["cpu"].loss_ - fitted["cuda"].loss_) < 1e-12


def test_the_staged_path_reuses_pinned_host_buffers(fake_cupy, session):
    rabit.finalize()                    # the session's engine, started again with staging
    engine = start(session, gpu_backend="staged")
    fake_cupy.PINNED_MADE.clear()
    for step in range(3):
        data = fake_cupy.ndarray(np.full((4, 5), RANK + step, dtype=np.float32))
        rabit.allreduce(data, rabit.Op.SUM,
                        prepare_fun=None if step else (lambda d: d.fill(RANK + 0.5)))
        want = SIZE * (SIZE - 1) / 2 + SIZE * (0.5 if step == 0 else step)
        np.testing.assert_array_equal(data.get(), np.full((4, 5), want, dtype=np.float32))
    rabit.allreduce(fake_cupy.ndarray(np.ones(7)), rabit.Op.MAX)
    # one page-locked buffer per shape and dtype, reused from call to call
    assert fake_cupy.PINNED_MADE == [((4, 5), "<f4"), ((7,), "<f8")]
    assert engine.resources.nccl is None
