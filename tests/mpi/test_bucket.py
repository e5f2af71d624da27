"""GradientBucketer on every rank: the same sums as one allreduce of all
gradients (bitwise, on integer-valued inputs), any arrival order, unused
parameters, no_sync accumulation, errors."""

import numpy as np
import pytest

import rabit_py as rabit
from rabit_py.ddp.bucket import GradientBucketer

from .conftest import WORLD, same_on_all_ranks

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()

# Forward order; sizes chosen so that the tiny caps below make several buckets.
SHAPES = [(3, 4), (5,), (64, 32), (7, 3), (1000,), (2, 2)]


def params(dtype=np.float64):
    return [np.zeros(s, dtype=dtype) for s in SHAPES]


def grads(rank, step, dtype=np.float64):
    rng = np.random.default_rng([rank, step])
    return [rng.integers(-50, 50, size=s).astype(dtype) for s in SHAPES]


def reference(step, dtype=np.float64):
    """Every rank's gradients, summed in one allreduce (flattened together)."""
    mine = grads(RANK, step, dtype)
    flat = np.concatenate([g.ravel() for g in mine])
    rabit.allreduce(flat, rabit.Op.SUM)
    out, start = [], 0
    for s in SHAPES:
        n = int(np.prod(s))
        out.append(flat[start:start + n].reshape(s))
        start += n
    return out


@pytest.mark.parametrize("order", ["backward", "shuffled"])
def test_bucketed_sums_equal_one_allreduce(session, order):
    bucketer = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001,
                                average=False)
    assert len(bucketer.buckets) >= 3
    try:
        for step in range(3):
            expected = reference(step)
            indices = list(reversed(range(len(SHAPES))))
            if order == "shuffled":        # a different arrival order on every rank
                np.random.default_rng([RANK, step]).shuffle(indices)
            mine = grads(RANK, step)
            for i in indices:
                bucketer.mark_ready(i, mine[i])
            got = bucketer.wait()
            for g, e in zip(got, expected):
                assert g.shape == e.shape
                assert g.tobytes() == e.tobytes()
            assert same_on_all_ranks(np.concatenate([g.ravel() for g in got]))
    finally:
        bucketer.close()


def test_average_and_unused_parameters(session):
    bucketer = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001)
    try:
        mine = grads(RANK, 7)
        for i in (5, 4, 2, 0):             # parameters 1 and 3 get no gradient
            bucketer.mark_ready(i, mine[i])
        got = bucketer.wait()
        expected = reference(7)
        for i in (1, 3):
            assert not got[i].any()
        for i in (0, 2, 4, 5):
            np.testing.assert_array_equal(got[i], expected[i] / SIZE)
        # The next step starts from zero again.
        for i in range(len(SHAPES)):
            bucketer.mark_ready(i, mine[i])
        np.testing.assert_array_equal(bucketer.wait()[1], reference(7)[1] / SIZE)
    finally:
        bucketer.close()


@pytest.mark.parametrize("average", [True, False])
def test_the_default_hook_reduces_each_bucket_as_asked(session, average):
    # The default hook (allreduce_hook, or sum_hook without averaging) runs
    # per bucket on the communication thread: on_reduced and wait_for see the
    # bucket's final values, the ones wait() returns.
    from rabit_py.ddp.comm_hooks import allreduce_hook, sum_hook

    seen = {}
    holder = {}

    def on_reduced(bucket):
        b = holder["bucketer"]
        seen[bucket] = [b.view(i).copy() for i in b.buckets[bucket]]

    bucketer = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001,
                                average=average, on_reduced=on_reduced)
    holder["bucketer"] = bucketer
    assert bucketer._hook[1] is (allreduce_hook if average else sum_hook)
    try:
        expected = [e / SIZE if average else e for e in reference(9)]
        mine = grads(RANK, 9)
        for i in reversed(range(len(SHAPES))):
            bucketer.mark_ready(i, mine[i])
        early = bucketer.wait_for(len(SHAPES) - 1).copy()
        assert early.tobytes() == expected[-1].tobytes()
        got = bucketer.wait()
        for g, e in zip(got, expected):
            assert g.tobytes() == e.tobytes()
        for b, members in enumerate(bucketer.buckets):
            for value, i in zip(seen[b], members):
                assert value.tobytes() == expected[i].tobytes()
    finally:
        bucketer.close()


def test_no_sync_accumulates_then_reduces_the_sum(session):
    bucketer = GradientBucketer(params(np.int64), bucket_cap_mb=0.01, first_bucket_mb=0.001,
                                average=False)
    try:
        with bucketer.no_sync():
            for i, g in enumerate(grads(RANK, 1, np.int64)):
                bucketer.mark_ready(i, g)
            local = bucketer.wait()
            np.testing.assert_array_equal(local[2], grads(RANK, 1, np.int64)[2])
        for i, g in enumerate(grads(RANK, 2, np.int64)):
            bucketer.mark_ready(i, g)
        got = bucketer.wait()
        both = [a + b for a, b in zip(reference(1, np.int64), reference(2, np.int64))]
        for g, e in zip(got, both):
            np.testing.assert_array_equal(g, e)
    finally:
        bucketer.close()


def test_bad_calls(session):
    bucketer = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001)
    try:
        with pytest.raises(ValueError, match="has shape"):
            bucketer.mark_ready(0, np.zeros(3))
        with pytest.raises(IndexError, match="does not exist"):
            bucketer.mark_ready(9, np.zeros(3))
        with bucketer.no_sync():
            bucketer.mark_ready(1, np.ones(5))
            with pytest.raises(ValueError, match="marked ready twice"):
                bucketer.mark_ready(1, np.ones(5))
            bucketer.wait()
    finally:
        bucketer.close()
    with pytest.raises(TypeError, match="takes NumPy or CuPy arrays"):
        GradientBucketer([[1.0, 2.0]])


def test_two_bucketers_share_the_engine_thread(session):
    # Two models' gradients marked in turn: without a shared communication
    # thread their allreduces would reach the engine from two threads in an
    # order that differs between ranks.
    first = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001,
                             average=False)
    second = GradientBucketer(params(np.int64), bucket_cap_mb=0.01, first_bucket_mb=0.001,
                              average=False)
    try:
        for step in range(3):
            floats, ints = grads(RANK, step), grads(RANK, step, np.int64)
            for index in reversed(range(len(SHAPES))):
                first.mark_ready(index, floats[index])
                second.mark_ready(index, ints[index])
            got_floats, got_ints = first.wait(), second.wait()
            want = reference(step)
            for a, b, w in zip(got_floats, got_ints, want):
                assert np.array_equal(a, w) and np.array_equal(b, w.astype(np.int64))
        assert first._executor is second._executor
    finally:
        first.close()
        second.close()


def test_comm_hooks(session):
    from rabit_py.ddp.comm_hooks import allreduce_hook, fp16_compress_hook

    # The default hook is what average=True does without a hook.
    plain = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001)
    hooked = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001,
                              average=False)
    hooked.register_comm_hook(None, allreduce_hook)
    # fp16: each rank's gradient, cast to float16 and divided by the world size,
    # summed in float16 (an exact expectation: integer-valued inputs in range).
    half = GradientBucketer(params(np.float32), bucket_cap_mb=0.01, first_bucket_mb=0.001)
    half.register_comm_hook(None, fp16_compress_hook)
    seen = []
    spy = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001)

    def record(state, bucket):
        seen.append((state, bucket.index(), bucket.parameters(), bucket.buffer().size))
        return bucket.buffer() * 0 + rabit.get_rank()    # a result to copy in, no collective

    spy.register_comm_hook("my-state", record)
    try:
        mine = grads(RANK, 3)
        for i in range(len(SHAPES)):
            plain.mark_ready(i, mine[i])
        want = [g.copy() for g in plain.wait()]
        for i in range(len(SHAPES)):
            hooked.mark_ready(i, mine[i])
        for g, w in zip(hooked.wait(), want):
            assert g.tobytes() == w.tobytes()

        mine32 = grads(RANK, 4, np.float32)
        for i in range(len(SHAPES)):
            half.mark_ready(i, mine32[i])
        got = half.wait()
        everyone = rabit.allgather(np.concatenate([g.ravel() for g in mine32])[None, :])
        scaled = (everyone.astype(np.float16) / np.float16(SIZE)) if SIZE > 1 else \
            everyone.astype(np.float16)
        expected = scaled[0].copy()
        for row in scaled[1:]:
            expected += row
        flat_got = np.concatenate([g.ravel() for g in got])
        assert flat_got.dtype == np.float32
        assert flat_got.tobytes() == expected.astype(np.float32).tobytes()
        assert same_on_all_ranks(flat_got)

        for i in range(len(SHAPES)):
            spy.mark_ready(i, mine[i])
        out = spy.wait()
        assert [s[1] for s in seen] == list(range(len(spy.buckets)))
        assert all(s[0] == "my-state" for s in seen)
        assert sorted(i for s in seen for i in s[2]) == list(range(len(SHAPES)))
        assert all((g == RANK).all() for g in out)     # no averaging on top of the hook

        with pytest.raises(RuntimeError, match="registered already"):
            hooked.register_comm_hook(None, allreduce_hook)
        with pytest.raises(TypeError, match="callable"):
            GradientBucketer(params()).register_comm_hook(None, "allreduce")
        ints = GradientBucketer(params(np.int64), bucket_cap_mb=0.01, first_bucket_mb=0.001)
        ints.register_comm_hook(None, fp16_compress_hook)
        for i in range(len(SHAPES)):
            ints.mark_ready(i, np.zeros(SHAPES[i], dtype=np.int64))
        with pytest.raises(TypeError, match="floating-point"):
            ints.wait()
    finally:
        for b in (plain, hooked, half, spy):
            b.close()


def test_kvstore_and_bucketers_share_one_communication_thread(session):
    from rabit_py.kvstore import KVStore

    bucketer = GradientBucketer(params(), bucket_cap_mb=0.01, first_bucket_mb=0.001)
    store = KVStore()
    try:
        assert store._executor is bucketer._executor
    finally:
        store.close()
        bucketer.close()
