"""The shared-memory allreduce (rabit_py/engine/_shm.py) on every rank: every
op and dtype against NumPy over all ranks' inputs, arrays spanning several
chunks, custom reducers on whole arrays, and the hierarchical
path (pseudo-nodes of RABIT_NODE_SIZE ranks), on both engines."""

import numpy as np
import pytest

import rabit_py as rabit
from rabit_py import Op
from rabit_py.engine._mpistart import MPI

from rabit_py.engine._startup import ulfm_enabled as rabit_ulfm

from .conftest import WORLD, _engines, same_on_all_ranks
from .test_collectives import CASES, expected, rank_input

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()
SHAPE = (3, 100_001)          # float64: 2.4 MB, three 1 MiB chunks, uneven parts


def _layouts():
    """(node_size, whether ranks share a node and shm is on): the real node;
    at 4 ranks also pseudo-nodes of 2 (two nodes) and 3 (uneven nodes)."""
    layouts = [0]
    if SIZE >= 4:
        layouts += [2, 3]
    return layouts


@pytest.fixture(params=[(e, n) for e in _engines() for n in _layouts()],
                ids=lambda p: f"{p[0]}-node{p[1]}")
def shm_session(request):
    engine, node_size = request.param
    rabit.init(engine=engine, timeout=60, shm=True, shm_min_bytes=1, node_size=node_size)
    yield node_size
    rabit.finalize()


def hierarchical(node_size):
    return 0 < node_size < SIZE


def test_shm_path_is_taken(shm_session):
    rabit.allreduce(np.ones(16), Op.SUM)
    reducer = rabit.api._engine._reduce._shm
    if SIZE == 1:
        assert reducer is None                       # one rank: nothing to share
    else:
        assert reducer is not None and reducer.max_node_size > 1
        assert reducer.nodes == (1 if shm_session == 0 else -(-SIZE // shm_session))


# The pseudo-node layouts reduce with the same chunk code as one node; there
# one case per dtype kind, each with another op (CI time).
HIERARCHICAL_CASES = [(Op.SUM, "int32"), (Op.MAX, "uint8"), (Op.SUM, "float64"),
                      (Op.MIN, "float32"), (Op.PROD, "float16"), (Op.SUM, "complex128"),
                      (Op.BITXOR, "int64"), (Op.MAX, "bool")]


def test_every_op_and_dtype_over_several_chunks(shm_session):
    for op, dtype in (HIERARCHICAL_CASES if hierarchical(shm_session) else CASES):
        data = rank_input(RANK, dtype, op, SHAPE)
        assert rabit.allreduce(data, op) is data
        want = expected(dtype, op, SHAPE)
        inexact = np.dtype(dtype).kind in "fc" and op in (Op.SUM, Op.PROD)
        if inexact and hierarchical(shm_session):
            # Node sums, then MPI among the leaders: another order than NumPy's.
            tol = 1e-2 if dtype == "float16" else 1e-5
            np.testing.assert_allclose(data, want, rtol=tol, atol=tol, err_msg=f"{op} {dtype}")
        else:
            # One node: reduced in rank order, as NumPy above, bit for bit.
            assert data.tobytes() == want.tobytes(), (op, dtype)
        assert same_on_all_ranks(data), f"ranks got different bits for {op} {dtype}"


def test_prepare_fun(shm_session):
    def prepare(buf):
        buf[:] = RANK

    data = np.zeros(500_000, dtype=np.int64)
    rabit.allreduce(data, Op.MAX, prepare_fun=prepare)
    assert (data == SIZE - 1).all()


def test_custom_reducers_see_whole_arrays_in_rank_order(shm_session):
    shapes = []

    def first_nonzero(a, b):              # not commutative: the lower rank wins
        shapes.append((a.shape, b.shape))
        return np.where(a != 0, a, b)

    data = np.zeros((400, 700))
    data[RANK::SIZE] = RANK + 1
    data[-1] = RANK + 1                    # every rank sets the last row: rank 0 must win
    rabit.allreduce(data, Op.create(first_nonzero, commute=False))
    want = np.zeros((400, 700))
    for r in range(SIZE):
        want[r::SIZE] = r + 1
    want[-1] = 1
    assert np.array_equal(data, want)
    assert all(s == ((400, 700), (400, 700)) for s in shapes)

    def add(a, b):
        return a + b

    total = np.full(300_000, RANK + 1, dtype=np.int32)
    rabit.allreduce(total, Op.create(add))
    assert (total == SIZE * (SIZE + 1) // 2).all()
    assert same_on_all_ranks(data)


def test_growing_and_mixed_calls_keep_their_order(shm_session):
    # Small (MPI), custom (grows the segment), then large built-in calls,
    # interleaved: every result right, nothing stale.
    for step in range(3):
        small = np.full(3, RANK + step, dtype=np.int64)
        rabit.allreduce(small, Op.SUM)
        assert (small == sum(r + step for r in range(SIZE))).all()
        big = np.full(200_000 * (step + 1), RANK + step, dtype=np.int64)
        rabit.allreduce(big, Op.create(lambda a, b: a + b))
        assert (big == sum(r + step for r in range(SIZE))).all()
        large = np.full(300_000, RANK * step, dtype=np.float32)
        rabit.allreduce(large, Op.MAX)
        assert (large == (SIZE - 1) * step).all()


def test_shm_off_by_setting():
    rabit.init(engine="mpi", timeout=60, shm=False, shm_min_bytes=1)
    try:
        data = np.full(300_000, RANK + 1.0)
        rabit.allreduce(data, Op.SUM)
        assert (data == SIZE * (SIZE + 1) / 2).all()
        assert not rabit.engine_info().shared_memory
    finally:
        rabit.finalize()


@pytest.mark.skipif(SIZE < 2 or not rabit_ulfm(), reason="needs 2 ranks and rabit-run (ULFM)")
def test_a_late_rank_is_a_timeout_not_a_spin():
    import time

    late = SIZE - 1
    rabit.init(engine="mpi", timeout=1, shm=True, shm_min_bytes=1)
    try:
        rabit.allreduce(np.zeros(8), Op.SUM)
        if RANK == late:
            time.sleep(2.5)                    # its peers wait on its flag meanwhile
        with pytest.raises(rabit.CollectiveTimeoutError) as info:
            rabit.allreduce(np.zeros(8), Op.SUM)
        if RANK != late:
            assert f"Rank(s) {late} did not arrive" in str(info.value), str(info.value)
    finally:
        rabit.finalize()
    WORLD.Barrier()


def test_custom_reducers_take_shared_memory_from_256_kib_by_default(session):
    def add(a, b):
        return a + b

    small = np.full(10_000, RANK + 1.0)                # 80 KB: stays on MPI
    rabit.allreduce(small, Op.create(add))
    assert not rabit.engine_info().shared_memory
    large = np.full(100_000, RANK + 1.0)               # 800 KB: shared memory
    rabit.allreduce(large, Op.create(add))
    assert (small == SIZE * (SIZE + 1) / 2).all() and (large == SIZE * (SIZE + 1) / 2).all()
    assert rabit.engine_info().shared_memory == (SIZE > 1)


# ---------------------------------------------------------------- fixed groups
def _reducers(groups):
    """The shared-memory reducer of ``groups`` and one whose groups are taken
    for split across hosts (Note [fixed groups]: a replacement started on
    another host), which reduces over MPI instead."""
    from rabit_py.engine._shm import NodeReducer

    class SplitAcrossHosts(NodeReducer):
        def _shares_one_host(self):
            return self.node_size == 1

    comms = [WORLD.Dup(), WORLD.Dup()]
    return NodeReducer(comms[0], groups), SplitAcrossHosts(comms[1], groups), comms


def _group_layouts():
    layouts = [[0] * SIZE]
    if SIZE >= 4:
        layouts += [[0, 0, 2, 2] + [4] * (SIZE - 4), [0, 0, 0, 3] + [4] * (SIZE - 4)]
    return layouts


@pytest.mark.skipif(SIZE < 2, reason="needs 2 ranks")
@pytest.mark.parametrize("groups", _group_layouts(), ids=lambda g: "-".join(map(str, g)))
def test_a_group_split_across_hosts_gives_the_same_bits(groups):
    from mpi4py import MPI

    from rabit_py.engine._shm import SUPPORTED
    from rabit_py.ops import OPS
    from rabit_py.engine._reduce import _BOOL_OPS, _MPI_OPS

    if not SUPPORTED:
        pytest.skip("the shared-memory path is off on this architecture")
    local, split, comms = _reducers(groups)
    try:
        assert local.colocated and (split.colocated == (split.node_size == 1))
        assert local.keeps == (local.node_size > 1) and not split.keeps
        assert (local.nodes, local.max_node_size) == (split.nodes, split.max_node_size)
        shape = (3, 40_001)
        for op, dtype in CASES:
            results = []
            table = _BOOL_OPS if np.dtype(dtype).kind == "b" else _MPI_OPS

            def leaders_allreduce(leaders, flat):
                leaders.Allreduce(MPI.IN_PLACE, flat, op=table[op])

            for reducer in (local, split):
                data = rank_input(RANK, dtype, op, shape).reshape(-1)
                reducer.allreduce(data, OPS[op].ufunc, leaders_allreduce)
                results.append(data.tobytes())
            # Note [kept results]: the robust engine's protocol, input untouched
            # (a node of one rank runs the plain one: the leaders' step is one)
            data = rank_input(RANK, dtype, op, shape).reshape(-1)
            if local.keeps:
                kept = local.reduce_to_area(data, OPS[op].ufunc, leaders_allreduce)
                assert data.tobytes() == rank_input(RANK, dtype, op, shape).tobytes()
                results.append(kept.tobytes())
                del kept
            else:
                local.allreduce(data, OPS[op].ufunc, leaders_allreduce)
                results.append(data.tobytes())
            assert results[0] == results[1] == results[2], (op, dtype, groups)

        def first_nonzero(a, b):
            return np.where(a != 0, a, b)

        results = []
        for reducer in (local, split):
            data = np.zeros((40, 70))
            data[RANK::SIZE] = RANK + 1
            reducer.allreduce_custom(data, first_nonzero, lambda leaders, flat: None)
            results.append(data.copy())
        if local.nodes == 1:
            want = np.zeros((40, 70))
            for r in range(SIZE):
                want[r::SIZE] = r + 1
            assert np.array_equal(results[0], want)
        assert results[0].tobytes() == results[1].tobytes()
    finally:
        for reducer in (local, split):
            reducer.free()
        for comm in comms:
            comm.Free()


def test_the_check_on_the_node_gives_what_mpis_allreduce_gives(shm_session):
    # Note [check on the node] in rabit_py/engine/_shm.py: one host's job
    # checks through its memory from the call after the one that built the
    # reducer; pseudo-nodes (the hierarchical path) keep MPI's Allreduce.
    frame = rabit.api._engine.frame
    rabit.allreduce(np.ones(16), Op.SUM)
    reducer = rabit.api._engine._reduce._shm
    if SIZE == 1 or hierarchical(shm_session):
        assert not frame.checks_on_node
        return
    assert frame.checks_on_node and reducer.checks
    rng = np.random.default_rng(RANK)
    wildcard = np.iinfo(np.int64).min
    for round_ in range(7):                 # both halves of the alternating lines, again
        vec = rng.integers(-5, 5, size=16, dtype=np.int64)
        if round_ % 3 == 0:
            vec[:] = np.arange(16)          # every rank the same: the fast path
        if round_ == 4 and RANK == 0:
            vec[3] = wildcard               # a field one rank cannot describe
        wanted = vec.copy()
        WORLD.Allreduce(MPI.IN_PLACE, wanted, op=MPI.MAX)
        reducer.exchange_check(vec)
        assert vec.tolist() == wanted.tolist(), round_
    # and the engine's calls still agree and run through it
    data = np.full(4, RANK, dtype=np.int64)
    rabit.allreduce(data, Op.SUM)
    assert data.tolist() == [SIZE * (SIZE - 1) // 2] * 4
