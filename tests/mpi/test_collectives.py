"""Collectives on every rank, checked against NumPy on all ranks' inputs.

Runs at 1, 2 and 4 ranks (see tests/jobs/test_multirank.py).
"""

import logging

import numpy as np
import pytest

import rabit_py as rabit
from rabit_py import Op

from .conftest import MPI, WORLD, needs_ranks, same_on_all_ranks

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
COMPLEX_DTYPES = ["complex64", "complex128"]

NUMPY_OF = {Op.MAX: np.maximum, Op.MIN: np.minimum, Op.SUM: np.add, Op.PROD: np.multiply,
            Op.BITOR: np.bitwise_or, Op.BITAND: np.bitwise_and, Op.BITXOR: np.bitwise_xor}


def rank_input(rank: int, dtype: str, op: int, shape=(3, 5)) -> np.ndarray:
    """Deterministic input of ``rank``; every rank can make everyone's."""
    rng = np.random.default_rng([rank, op, sum(map(ord, dtype))])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if op == Op.PROD:
        # small factors so that 4 ranks' product fits in int8
        values = rng.integers(1, 3, size=shape)
        if dt.kind in "iu":
            return values.astype(dt)
        return (values * rng.choice([-1, 1], size=shape)).astype(dt)
    if dt.kind == "u":
        return rng.integers(0, 30, size=shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(-30, 30, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dt)
    return rng.normal(size=shape).astype(dt)


def expected(dtype: str, op: int, shape=(3, 5)) -> np.ndarray:
    parts = [rank_input(r, dtype, op, shape) for r in range(SIZE)]
    result = parts[0].copy()
    for part in parts[1:]:
        if np.dtype(dtype).kind == "b":
            result = {Op.MAX: np.logical_or, Op.MIN: np.logical_and, Op.BITOR: np.logical_or,
                      Op.BITAND: np.logical_and, Op.BITXOR: np.logical_xor}[op](result, part)
        else:
            result = NUMPY_OF[op](result, part).astype(dtype)
    return result


CASES = (
    [(op, dt) for op in (Op.MAX, Op.MIN, Op.SUM, Op.PROD, Op.BITOR, Op.BITAND, Op.BITXOR)
     for dt in INT_DTYPES]
    + [(op, dt) for op in (Op.MAX, Op.MIN, Op.SUM, Op.PROD) for dt in FLOAT_DTYPES]
    + [(op, dt) for op in (Op.SUM, Op.PROD) for dt in COMPLEX_DTYPES]
    + [(op, "bool") for op in (Op.MAX, Op.MIN, Op.BITOR, Op.BITAND, Op.BITXOR)]
)


def test_rank_and_size(session):
    assert rabit.get_rank() == RANK
    assert rabit.get_world_size() == SIZE
    assert rabit.is_distributed() == (SIZE > 1)
    assert isinstance(rabit.get_processor_name(), str) and rabit.get_processor_name()


def test_engine_info_tells_the_engine_and_follows_the_job(session):
    info = rabit.engine_info()
    assert (info.engine, info.rank, info.world_size) == (session, RANK, SIZE)
    assert (info.version, info.trial, info.joined_as, info.recoveries, info.replaced) == \
        (0, 0, "start", 0, 0)
    assert info.transports == ("host",) and not info.nccl
    rabit.allreduce(np.ones(1 << 22), Op.SUM)      # 32 MiB: the shared-memory threshold
    rabit.checkpoint({"w": 1})
    after = rabit.engine_info()
    assert after.version == 1 and after.shared_memory == (SIZE > 1)
    if session == "robust":
        assert after.cache_budget > 0 and after.cache_refused == 0
        rabit.allreduce(np.ones(4), Op.SUM)         # its result is kept for replay
        assert rabit.engine_info().cache_bytes == after.cache_bytes + 4 * 8
    else:
        assert (after.cache_bytes, after.cache_budget, after.cache_refused) == (0, 0, 0)


def test_engine_info_before_init_raises():
    rabit.finalize()
    with pytest.raises(rabit.NotInitializedError):
        rabit.engine_info()


def test_allreduce_every_op_and_dtype(session):
    # One session for the whole matrix: it is one mpirun start, many checks.
    for op, dtype in CASES:
        data = rank_input(RANK, dtype, op)
        out = rabit.allreduce(data, op)
        assert out is data, "allreduce must work in place and return its argument"
        want = expected(dtype, op)
        exact = np.dtype(dtype).kind in "biu" or op in (Op.MAX, Op.MIN) or SIZE <= 2
        if exact:
            assert np.array_equal(data, want), (op, dtype, data, want)
        else:
            # MPI may add in another order than NumPy: equal up to rounding.
            tol = 1e-2 if dtype == "float16" else 1e-5
            np.testing.assert_allclose(data, want, rtol=tol, atol=tol, err_msg=f"{op} {dtype}")
        assert same_on_all_ranks(data), f"ranks got different bits for {op} {dtype}"


def test_a_small_allreduce_gives_mpis_bits_and_keeps_each_result(session):
    # Note [small allreduce]: the direct path (built-in op, small writeable
    # C-contiguous array) reduces as MPI does and keeps every result for
    # replay, as the general path; a strided view, a read-only array or a
    # custom op take the general path and are refused or reduced as before.
    rng = np.random.default_rng([RANK, 7])
    for dtype in ("float32", "float64", "int64", "uint8", "complex128", "bool"):
        mine = (rng.normal(size=5) > 0 if dtype == "bool"
                else (rng.normal(size=5) * 100).astype(dtype))
        op = Op.BITOR if dtype == "bool" else Op.SUM
        raw = mine.copy()
        WORLD.Allreduce(MPI.IN_PLACE, raw, op=MPI.LOR if dtype == "bool" else MPI.SUM)
        before = rabit.engine_info().cache_bytes
        data = mine.copy()
        assert rabit.allreduce(data, op) is data
        assert data.tobytes() == raw.tobytes(), dtype
        if session == "robust" and SIZE > 1:
            assert rabit.engine_info().cache_bytes == before + mine.nbytes, dtype
    with pytest.raises(ValueError, match="strided view"):
        rabit.allreduce(np.zeros((4, 4))[:, 0], Op.SUM)
    readonly = np.zeros(3)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        rabit.allreduce(readonly, Op.SUM)


@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (2, 3, 4), ()])
def test_allreduce_shapes(session, shape):
    data = np.full(shape, RANK + 1, dtype=np.int32)
    rabit.allreduce(data, Op.SUM)
    assert data.shape == shape
    assert np.all(data == SIZE * (SIZE + 1) // 2)


def test_allreduce_large_float32(session):
    n = 1 << 20
    data = np.full(n, RANK + 1.0, dtype=np.float32)
    rabit.allreduce(data, Op.SUM)
    assert np.all(data == SIZE * (SIZE + 1) / 2)


def test_prepare_fun_fills_buffer_once(session):
    calls = []

    def prepare(buf):
        calls.append(buf.shape)
        buf[:] = RANK + 1

    data = np.zeros(4, dtype=np.int64)
    rabit.allreduce(data, Op.SUM, prepare_fun=prepare)
    assert calls == [(4,)]
    assert np.all(data == SIZE * (SIZE + 1) // 2)


@pytest.mark.parametrize("count", [3, 1 << 14, 1 << 17, 1 << 18, 1 << 20])
def test_every_allreduce_path_gives_the_same_bits(session, count, caplog):
    # Note [in-place robust allreduce]: out of place into the cache, in place
    # with prepare_fun, in place past the cache budget; raw MPI in place as
    # the reference. Random float32, whose sums depend on the order.
    # From shm_keep_min_bytes the robust engine reduces through shared memory
    # (Note [kept results]): the ranks' values summed in rank order, which
    # are MPI's bits on 2 ranks, not on 4.
    mine = np.random.default_rng([RANK, count]).normal(size=count).astype(np.float32)
    raw = mine.copy()
    WORLD.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM)
    mpi_bits = raw.copy()
    if session == "robust" and SIZE > 1 and mine.nbytes >= rabit.api._engine._reduce.kept_from:
        everyone = WORLD.allgather(mine)
        raw = everyone[0].copy()
        for other in everyone[1:]:
            raw += other
    plain = rabit.allreduce(mine.copy(), Op.SUM)
    prepared = rabit.allreduce(np.zeros_like(mine), Op.SUM,
                               prepare_fun=lambda buf: np.copyto(buf, mine))
    assert plain.tobytes() == raw.tobytes() and prepared.tobytes() == raw.tobytes()
    # ranks that differ: rank 0 with prepare_fun (in place), the others without
    mixed = (rabit.allreduce(np.zeros_like(mine), Op.SUM,
                             prepare_fun=lambda buf: np.copyto(buf, mine))
             if RANK == 0 else rabit.allreduce(mine.copy(), Op.SUM))
    assert mixed.tobytes() == raw.tobytes()
    if session == "robust":
        rabit.finalize()
        rabit.init(engine="robust", timeout=60, cache_budget=mine.nbytes + 1)
        rabit.checkpoint(None)      # calls of a version (start-up calls stay for good)
        first = rabit.allreduce(mine.copy(), Op.SUM)        # kept: within the budget
        past = [rabit.allreduce(mine.copy(), Op.SUM) for _ in range(3)]   # not kept
        info = rabit.engine_info()
        assert (info.cache_bytes, info.cache_refused) == (mine.nbytes, 3)
        # The call that passes the budget runs as before it; every rank
        # reduces the calls after it as the plain engine does: MPI's
        # in-place allreduce, its bits (Note [in-place robust allreduce]).
        assert first.tobytes() == past[0].tobytes() == raw.tobytes()
        assert {p.tobytes() for p in past[1:]} == {mpi_bits.tobytes()}
        rabit.checkpoint(None)                  # a new version: kept again
        again = rabit.allreduce(mine.copy(), Op.SUM)
        info = rabit.engine_info()
        assert (info.cache_bytes, info.cache_refused) == (mine.nbytes, 0)
        assert again.tobytes() == raw.tobytes()
        if count == 3:
            # A program that never checkpoints is told, once, what passing
            # the budget means and what a checkpoint would buy.
            # Start-up calls may use 1/8 of the budget (Note [cache budget]).
            rabit.finalize()
            budget = 8 * (mine.nbytes + 1)
            rabit.init(engine="robust", timeout=60, cache_budget=budget)
            with caplog.at_level(logging.WARNING, logger="rabit_py"):
                for _ in range(4):
                    rabit.allreduce(mine.copy(), Op.SUM)
            told = [r.getMessage() for r in caplog.records
                    if "has not checkpointed since it started" in r.getMessage()]
            assert len(told) == 1 and "at call #1 " in told[0] and \
                f"({mine.nbytes + 1} bytes: 1/8 of RABIT_CACHE_BUDGET={budget})" in told[0] \
                and "A checkpoint each iteration" in told[0], told
            info = rabit.engine_info()
            assert (info.cache_bytes, info.cache_refused) == (mine.nbytes, 3)


def test_custom_reducer_commutative(session):
    seen_shapes = []

    def absmax(a, b):
        seen_shapes.append((a.shape, b.shape))
        return np.where(np.abs(a) >= np.abs(b), a, b)

    def part(r):   # magnitudes differ between ranks: no ties, so absmax commutes
        return (np.arange(12, dtype=np.float64).reshape(3, 4) - 5) * (1 if r % 2 else -1) * (r + 1)

    op = Op.create(absmax)
    data = part(RANK)
    rabit.allreduce(data, op)
    parts = [part(r) for r in range(SIZE)]
    want = parts[0]
    for p in parts[1:]:
        want = np.where(np.abs(want) >= np.abs(p), want, p)
    assert np.array_equal(data, want)
    # fn always sees whole arrays of the caller's shape, never pieces
    assert all(s == ((3, 4), (3, 4)) for s in seen_shapes)


def test_custom_reducer_non_commutative_in_rank_order(session):
    # 2x2 integer matrix product: associative, not commutative
    def matmul(a, b):
        return a @ b

    op = Op.create(matmul, commute=False)

    def mat(r):
        return np.array([[1, r + 1], [0, 1]], dtype=np.int64) + np.array([[0, 0], [r, 0]])

    data = mat(RANK)
    rabit.allreduce(data, op)
    want = mat(0)
    for r in range(1, SIZE):
        want = want @ mat(r)
    assert np.array_equal(data, want), (data, want)


@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool", "complex128"])
def test_broadcast_array_from_every_root(session, dtype):
    for root in range(SIZE):
        source = (np.arange(24).reshape(2, 3, 4) * (root + 1)).astype(dtype)
        buf = source.copy() if RANK == root else np.zeros((2, 3, 4), dtype=dtype)
        out = rabit.broadcast(buf, root)
        assert out is buf
        assert np.array_equal(buf, source)
        # a rank that passes None gets a new array
        fresh = rabit.broadcast(source.copy() if RANK == root else None, root)
        assert isinstance(fresh, np.ndarray) and fresh.dtype == source.dtype
        assert np.array_equal(fresh, source)


def test_broadcast_array_of_many_dimensions(session):
    shape = (2, 1, 3, 1, 2, 1)                # more dimensions than the header carries
    source = np.arange(12, dtype=np.int32).reshape(shape)
    got = rabit.broadcast(source.copy() if RANK == 0 else None, 0)
    assert got.shape == shape and np.array_equal(got, source)
    buf = source.copy() if RANK == 0 else np.zeros(shape, dtype=np.int32)
    assert rabit.broadcast(buf, 0) is buf and np.array_equal(buf, source)


def test_broadcast_object_from_every_root(session):
    for root in range(SIZE):
        obj = {"root": root, "list": [1, 2.5, "x"], "arr": np.arange(3) * root, "none": None}
        got = rabit.broadcast(obj if RANK == root else None, root)
        assert got["root"] == root and got["list"] == [1, 2.5, "x"] and got["none"] is None
        assert np.array_equal(got["arr"], np.arange(3) * root)
        if RANK == root:
            assert got is obj


def test_broadcast_large_object(session):
    payload = b"x" * (3 << 20) if RANK == 0 else None
    got = rabit.broadcast(payload, 0)
    assert got == b"x" * (3 << 20)


def test_allgather_unequal_sizes(session):
    rows = RANK + 1 if RANK != 1 else 0      # rank 1 contributes no rows
    data = np.full((rows, 3), RANK, dtype=np.float32)
    out = rabit.allgather(data)
    want = np.concatenate([np.full((r + 1 if r != 1 else 0, 3), r, dtype=np.float32)
                           for r in range(SIZE)])
    assert out.shape == want.shape and np.array_equal(out, want)


def test_allgather_1d_and_readonly_input(session):
    data = np.arange(RANK + 2, dtype=np.int16)
    data.flags.writeable = False            # input is only read: allowed
    out = rabit.allgather(data)
    assert np.array_equal(out, np.concatenate([np.arange(r + 2, dtype=np.int16)
                                               for r in range(SIZE)]))


def test_allgather_strided_view(session):
    block = np.arange(12, dtype=np.float64).reshape(3, 4) + 100 * RANK
    out = rabit.allgather(block[:, ::2])    # a strided view is copied, not refused
    want = np.concatenate([(np.arange(12.0).reshape(3, 4) + 100 * r)[:, ::2]
                           for r in range(SIZE)])
    assert np.array_equal(out, want)


def test_init_refuses_a_non_communicator():
    with pytest.raises(TypeError, match="comm must be an mpi4py intra-communicator"):
        rabit.init(engine="mpi", comm="COMM_WORLD")
    assert not rabit.is_distributed()


def test_checkpoint_roundtrip(session):
    assert rabit.load_checkpoint() == (0, None)
    assert rabit.load_checkpoint(with_local=True) == (0, None, None)
    assert rabit.version_number() == 0
    model = {"w": np.arange(4.0), "round": 1}
    rabit.checkpoint(model, local_model=[RANK])
    model["w"][:] = -1                       # the checkpoint holds a copy
    version, g, local = rabit.load_checkpoint(with_local=True)
    assert version == 1 and rabit.version_number() == 1
    assert np.array_equal(g["w"], np.arange(4.0)) and g["round"] == 1 and local == [RANK]
    lazy = {"w": np.ones(2)}
    rabit.lazy_checkpoint(lazy)
    version, g = rabit.load_checkpoint()
    assert version == 2 and np.array_equal(g["w"], np.ones(2))


def test_checkpoint_unpicklable_raises_on_every_rank(session):
    with pytest.raises(rabit.CheckpointError, match="cannot be pickled"):
        rabit.checkpoint({"f": lambda: 0})
    assert rabit.version_number() == 0
    rabit.checkpoint({"ok": 1})
    assert rabit.version_number() == 1


def test_bsp_loop_resumes_from_checkpoint(session):
    version, model = rabit.load_checkpoint()
    assert version == 0
    model = np.zeros(3)
    for it in range(version, 5):
        grad = np.full(3, RANK + it, dtype=np.float64)
        rabit.allreduce(grad, Op.SUM)
        model = model + grad
        rabit.checkpoint(model)
    want = sum(np.full(3, sum(r + it for r in range(SIZE)), dtype=np.float64) for it in range(5))
    assert np.array_equal(model, want)
    assert rabit.load_checkpoint()[0] == 5


def test_unchecked_collectives_still_correct(unchecked_session):
    data = np.full(5, RANK + 1, dtype=np.int32)
    rabit.allreduce(data, Op.SUM)
    assert np.all(data == SIZE * (SIZE + 1) // 2)
    assert rabit.broadcast({"a": 1} if RANK == 0 else None) == {"a": 1}
    arr = rabit.broadcast(np.arange(3) if RANK == 0 else None)
    assert np.array_equal(arr, np.arange(3))
    assert rabit.allgather(np.array([RANK])).tolist() == list(range(SIZE))


def test_tracker_print_once(session, capsys):
    rabit.tracker_print("hello from the job")
    printed = capsys.readouterr().out
    assert printed.count("hello from the job") == (1 if RANK == 0 else 0)


@needs_ranks(2)
def test_init_with_split_communicator():
    color = RANK % 2
    sub = WORLD.Split(color, key=RANK)
    rabit.init(engine="mpi", comm=sub, timeout=60)
    try:
        assert rabit.get_world_size() == sub.Get_size()
        assert rabit.get_rank() == sub.Get_rank()
        data = np.array([RANK], dtype=np.int64)
        rabit.allreduce(data, Op.SUM)
        assert data[0] == sum(r for r in range(SIZE) if r % 2 == color)
    finally:
        rabit.finalize()
        sub.Free()
