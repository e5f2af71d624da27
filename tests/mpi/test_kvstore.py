"""KVStore on every rank: push/pull/pushpull sums against NumPy, priority order
of the launched buckets, optimizers and updaters against a single-process
reference (and bitwise equal on every rank), optimizer states saved and
loaded, checkpoints, and bad use raising the same clear error everywhere."""

import os
import pickle
import zlib

import numpy as np
import pytest

from rabit_py.errors import CheckpointError, KVStoreError
from rabit_py.kvstore import KVStore, create
from rabit_py.kvstore.optimizer import SGD, Adam

from .._planted import Planted
from ._fakes import FakeDeviceArray
from .conftest import WORLD, same_on_all_ranks

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()
SHAPES = {"w0": (3, 4), 1: (5,), "w2": (64, 32), 3: (7, 3)}


def grad(rank, step, key, dtype=np.float64):
    """Integer-valued gradients: their sums are exact in any order."""
    seed = [rank, step, zlib.crc32(str(key).encode())]   # hash() differs between processes
    return np.random.default_rng(seed).integers(-20, 20, size=SHAPES[key]).astype(dtype)


def summed(step, key, dtype=np.float64):
    return sum(grad(r, step, key, dtype) for r in range(SIZE))


def initial(key, rank=0):
    return np.random.default_rng([rank, 99]).normal(size=SHAPES[key])


@pytest.fixture
def kv(session):
    store = KVStore("dist_sync")
    yield store
    store.close()


def test_push_pull_and_pushpull_sum_like_numpy(kv):
    keys = list(SHAPES)
    kv.init(keys, [initial(k, RANK) for k in keys])       # rank 0's values win
    for k in keys:
        assert kv.pull(k).tobytes() == initial(k).tobytes()
    assert kv.rank == RANK and kv.num_workers == SIZE and kv.type == "dist_sync"
    for step in range(3):
        kv.push(keys, [grad(RANK, step, k) for k in keys])
        outs = [np.empty(SHAPES[k]) for k in keys]
        assert kv.pull(keys, out=outs) is not None
        for k, o in zip(keys, outs):
            assert o.tobytes() == summed(step, k).tobytes()
    # A list of values for one key (one per device) is summed locally first.
    devices = [grad(RANK, 7, "w0"), grad(RANK, 8, "w0")]
    kv.push("w0", devices)
    assert kv.pull("w0").tobytes() == (summed(7, "w0") + summed(8, "w0")).tobytes()
    # pushpull writes into the value by default, or into every array of out.
    value = grad(RANK, 9, 1)
    kv.pushpull(1, value)
    assert value.tobytes() == summed(9, 1).tobytes()
    copies = [np.empty(5), np.empty(5)]
    kv.pushpull(1, grad(RANK, 10, 1), out=copies)
    assert copies[0].tobytes() == copies[1].tobytes() == summed(10, 1).tobytes()
    assert same_on_all_ranks(kv.pull("w2"))


def test_other_dtypes(kv):
    kv.init([10, 11], [np.zeros(6, np.int64), np.zeros(6, np.float32)])
    kv.pushpull([10, 11], [np.full(6, RANK + 1, np.int64), np.full(6, 0.5, np.float32)])
    np.testing.assert_array_equal(kv.pull(10), np.full(6, SIZE * (SIZE + 1) // 2))
    assert kv.pull(11).dtype == np.float32
    np.testing.assert_array_equal(kv.pull(11), np.full(6, 0.5 * SIZE, np.float32))


def test_higher_priority_is_launched_first_in_buckets(session):
    keys = list(SHAPES)
    priorities = {"w0": 0, 1: 5, "w2": -3, 3: 5}
    kv = KVStore(bucket_cap_mb=1024 / 2 ** 20)      # 1 KiB buckets
    try:
        kv.init(keys, [np.zeros(SHAPES[k]) for k in keys])
        # w0 (96 B), 1 (40 B), 3 (168 B) wait in the queue; w2 (16 KiB) fills
        # it: the queue is launched, higher priority first, ties in push order.
        for k in ("w0", 1, 3):
            kv.push(k, grad(RANK, 0, k), priority=priorities[k])
        assert list(kv.launched) == []
        kv.push("w2", grad(RANK, 0, "w2"), priority=priorities["w2"])
        assert list(kv.launched) == [(1, 3, "w0"), ("w2",)]
        for k, o in zip(keys, kv.pull(keys)):
            assert o.tobytes() == summed(0, k).tobytes()
        # A key pushed again launches the queue first, so its pushes stay in order.
        kv.launched.clear()
        kv.push(1, grad(RANK, 1, 1), priority=5)
        kv.push("w0", grad(RANK, 1, "w0"), priority=0)
        kv.push(1, grad(RANK, 2, 1), priority=5)
        assert list(kv.launched) == [(1, "w0")]
        assert kv.pull(1).tobytes() == summed(2, 1).tobytes()     # no updater: the last sum
        assert list(kv.launched) == [(1, "w0"), (1,)]
        assert same_on_all_ranks(kv.pull("w0"))
    finally:
        kv.close()


def sgd_reference(weight, grads, lr, momentum, wd, rescale):
    mom = np.zeros_like(weight)
    for g in grads:
        g = g * rescale + wd * weight
        mom = momentum * mom - lr * g
        weight = weight + mom
    return weight


def adam_reference(weight, grads, lr, b1, b2, eps):
    m = np.zeros_like(weight)
    v = np.zeros_like(weight)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        weight = weight - lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
    return weight


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_optimizer_matches_a_single_process_reference(kv, name):
    keys = list(SHAPES)
    if name == "sgd":
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, wd=1e-3, rescale_grad=0.25))
    else:
        kv.set_optimizer(Adam(learning_rate=0.05))
    kv.init(keys, [initial(k) for k in keys])
    steps = 5
    for step in range(steps):
        outs = [np.empty(SHAPES[k]) for k in keys]
        kv.pushpull(keys, [grad(RANK, step, k) for k in keys], out=outs)
    for k, got in zip(keys, outs):
        grads = [summed(s, k) for s in range(steps)]
        if name == "sgd":
            expected = sgd_reference(initial(k), grads, 0.1, 0.9, 1e-3, 0.25)
        else:
            expected = adam_reference(initial(k), grads, 0.05, 0.9, 0.999, 1e-8)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
        assert same_on_all_ranks(got)


def test_custom_updater_sees_the_sum_on_every_rank(kv):
    seen = []

    def updater(key, g, weight):
        seen.append(key)
        weight -= 0.5 * g

    kv.set_updater(updater)
    kv.init([1, 3], [initial(1), initial(3)])
    kv.push([3, 1], [grad(RANK, 0, 3), grad(RANK, 0, 1)], priority=0)
    kv.push(1, grad(RANK, 1, 1))          # again: the first push of 1 is launched first
    got = kv.pull([1, 3])
    np.testing.assert_array_equal(got[0], initial(1) - 0.5 * summed(0, 1) - 0.5 * summed(1, 1))
    np.testing.assert_array_equal(got[1], initial(3) - 0.5 * summed(0, 3))
    assert seen == [3, 1, 1]
    with pytest.raises(TypeError, match="callable"):
        kv.set_updater(42)


def test_optimizer_states_saved_and_loaded(kv, tmp_path):
    path = WORLD.bcast(str(tmp_path / "states.pkl"), root=0)
    keys = [1, "w0"]
    kv.set_optimizer(Adam(learning_rate=0.01))
    kv.init(keys, [initial(k) for k in keys])
    for step in range(2):
        kv.pushpull(keys, [grad(RANK, step, k) for k in keys])
    kv.save_optimizer_states(path)
    weights = kv.pull(keys)
    for step in (2, 3):
        kv.pushpull(keys, [grad(RANK, step, k) for k in keys])
    expected = kv.pull(keys)
    again = KVStore()
    try:
        again.set_optimizer(Adam(learning_rate=0.01))
        again.init(keys, weights)
        again.load_optimizer_states(path)
        for step in (2, 3):
            again.pushpull(keys, [grad(RANK, step, k) for k in keys])
        for a, b in zip(again.pull(keys), expected):
            assert a.tobytes() == b.tobytes()
        other = KVStore()
        try:
            other.set_optimizer(SGD())
            with pytest.raises(ValueError, match="saved by 'adam'"):
                other.load_optimizer_states(path)
            with pytest.raises(CheckpointError, match="read on rank 0"):
                other.load_optimizer_states(path + ".missing")
        finally:
            other.close()
    finally:
        again.close()


def test_a_planted_optimizer_states_file_runs_nothing(kv, tmp_path):
    # Note [checkpoints are data] in rabit_py/_unpickle.py: the file is read
    # on rank 0 as data; every rank raises, naming what it would have run.
    path = WORLD.bcast(str(tmp_path / "states.pkl"), root=0)
    marker = path + ".ran"
    if RANK == 0:
        with open(path, "wb") as f:
            pickle.dump({"format": "rabit_py-optimizer-states/1", "states": Planted(marker)}, f)
    WORLD.Barrier()
    kv.set_optimizer(Adam(learning_rate=0.01))
    with pytest.raises(CheckpointError, match=f"names {os.system.__module__}.system, which is "
                                              f"not data.*RABIT_CHECKPOINT_CLASSES"):
        kv.load_optimizer_states(path)
    assert not os.path.exists(marker)


def test_checkpoint_keeps_weights_and_optimizer_state(kv):
    keys = ["w0", 3]
    kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.5))
    kv.init(keys, [initial(k) for k in keys])
    assert kv.load_checkpoint() == 0                   # fresh start: nothing changes
    kv.pushpull(keys, [grad(RANK, 0, k) for k in keys])
    kv.checkpoint()
    saved = kv.pull(keys)
    kv.pushpull(keys, [grad(RANK, 1, k) for k in keys])
    after_one = kv.pull(keys)
    assert kv.load_checkpoint() >= 1                   # back to the checkpoint
    for a, b in zip(kv.pull(keys), saved):
        assert a.tobytes() == b.tobytes()
    kv.pushpull(keys, [grad(RANK, 1, k) for k in keys])
    for a, b in zip(kv.pull(keys), after_one):         # momentum came back too
        assert a.tobytes() == b.tobytes()
    kv.barrier()


def test_bad_use_is_a_clear_error_on_every_rank(kv, tmp_path):
    kv.init("a", np.zeros(4))
    with pytest.raises(KVStoreError, match=r"pull of key 'nope', which was never initialized"):
        kv.pull("nope")
    with pytest.raises(KVStoreError, match="push of key 5, which was never initialized"):
        kv.push(5, np.zeros(4))
    with pytest.raises(KVStoreError, match="initialized twice"):
        kv.init("a", np.zeros(4))
    with pytest.raises(KVStoreError, match=r"shape \(5,\).*holds \(4,\)"):
        kv.push("a", np.zeros(5))
    with pytest.raises(KVStoreError, match="dtype float32"):
        kv.push("a", np.zeros(4, np.float32))
    with pytest.raises(KVStoreError, match=r"into an array of shape \(3,\)"):
        kv.pull("a", out=np.zeros(3))
    with pytest.raises(TypeError, match="ints or strings"):
        kv.push(1.5, np.zeros(4))
    with pytest.raises(ValueError, match="2 keys need a list of 2 values"):
        kv.push(["a", "b"], np.zeros(4))
    with pytest.raises(KVStoreError, match="needs an optimizer"):
        kv.save_optimizer_states(str(tmp_path / "x"))
    with pytest.raises(ValueError, match="runs on server processes"):
        KVStore("dist_async")
    with pytest.raises(KVStoreError, match="this job has none: start it with rabit-run"):
        create("dist_async")
    assert kv.pull("a").tobytes() == np.zeros(4).tobytes()   # nothing was pushed

    def broken(key, g, weight):
        raise ZeroDivisionError("updater bug")

    kv.set_updater(broken)
    kv.push("a", np.ones(4))
    with pytest.raises(KVStoreError, match="updater bug") as info:
        kv.pull("a")
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(KVStoreError, match="unusable after an earlier failure"):
        kv.push("a", np.ones(4))


def test_pull_waits_only_for_its_own_key(session):
    import threading

    released = threading.Event()
    seen = {}

    def updater(key, g, weight):
        if key == "slow":        # holds its bucket until the main thread pulled "fast"
            seen["released in time"] = released.wait(timeout=20)
        weight += g

    kv = KVStore(bucket_cap_mb=64 / 2 ** 20)        # one key per bucket
    try:
        kv.set_updater(updater)
        kv.init(["fast", "slow"], [np.zeros(8), np.zeros(8)])
        kv.push("fast", np.ones(8), priority=1)
        kv.push("slow", np.ones(8))
        np.testing.assert_array_equal(kv.pull("fast"), np.full(8, SIZE))
        released.set()
        np.testing.assert_array_equal(kv.pull("slow"), np.full(8, SIZE))
        assert seen == {"released in time": True}
    finally:
        kv.close()


def test_device_arrays_are_staged_through_the_host(kv):
    kv.init("g", FakeDeviceArray(np.zeros(6)))
    device = [FakeDeviceArray(np.full(6, RANK + 1.0)), FakeDeviceArray(np.ones(6))]
    out = FakeDeviceArray(np.empty(6))
    kv.pushpull("g", device, out=out)
    np.testing.assert_array_equal(out.get(), np.full(6, SIZE * (SIZE + 1) / 2 + SIZE))
