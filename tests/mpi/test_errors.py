"""Errors instead of hangs or wrong answers, raised on every rank.

Each mismatch test makes the ranks disagree, checks the error type and message
on every rank, then checks that the engine still works.
"""

import time

import numpy as np
import pytest

import rabit_py as rabit
from rabit_py import CollectiveMismatchError, CollectiveTimeoutError, Op
from rabit_py.engine._startup import ulfm_enabled

from .conftest import WORLD, needs_ranks

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()
ODD = SIZE - 1           # the rank that misbehaves


def still_works():
    data = np.array([1], dtype=np.int64)
    rabit.allreduce(data, Op.SUM)
    assert data[0] == SIZE


def all_ranks_agree_that(flag: bool) -> bool:
    return all(WORLD.allgather(bool(flag)))


@pytest.fixture(params=["mpi", "node"])
def check_place(request, session):
    """Where the signature check runs: MPI's Allreduce, or the node's memory
    (Note [check on the node] in rabit_py/engine/_shm.py), which a large
    allreduce on one host switches to from the next call."""
    engine = rabit.api._engine
    frame = engine.frame
    if request.param == "node":
        # The smallest allreduce that builds the node's reducer.
        config = engine.config
        nbytes = config.shm_min_bytes if session == "mpi" else config.shm_keep_min_bytes
        rabit.allreduce(np.ones(nbytes // 4, dtype=np.float32), Op.SUM)
        if not all_ranks_agree_that(frame.checks_on_node):
            pytest.skip("the ranks do not share one host's memory")
    else:
        assert not frame.checks_on_node
    return request.param


@needs_ranks(2)
@pytest.mark.parametrize("case", ["shape", "dtype", "op", "kind", "root", "skip", "custom_op"])
def test_mismatch_raises_on_every_rank(check_place, case):
    odd = RANK == ODD
    with pytest.raises(CollectiveMismatchError) as info:
        if case == "shape":
            rabit.allreduce(np.zeros(5 if odd else 4), Op.SUM)
        elif case == "dtype":
            rabit.allreduce(np.zeros(4, np.float32 if odd else np.float64), Op.SUM)
        elif case == "op":
            rabit.allreduce(np.zeros(4), Op.MAX if odd else Op.SUM)
        elif case == "kind":
            if odd:
                rabit.broadcast(np.zeros(4), 0)
            else:
                rabit.allreduce(np.zeros(4), Op.SUM)
        elif case == "root":
            rabit.broadcast(np.zeros(4), 1 if odd else 0)
        elif case == "skip":
            if not odd:
                rabit.allreduce(np.zeros(4), Op.SUM)      # the odd rank skips this one
            rabit.allreduce(np.zeros(6), Op.SUM)
        elif case == "custom_op":
            rabit.allreduce(np.zeros(4), Op.create(np.maximum if odd else np.minimum))
    message = str(info.value)
    assert message.startswith(f"rank {RANK}: ranks disagree on collective")
    assert f"rank {ODD}" in message, message
    label = {"shape": "shape", "dtype": "dtype", "op": "op", "kind": "call", "root": "root",
             "skip": "shape", "custom_op": "op"}[case]
    assert f"  {label}:" in message, message
    still_works()


@needs_ranks(2)
def test_rank_skipping_last_call_is_caught_at_finalize():
    rabit.init(engine="mpi", timeout=60)
    if RANK != ODD:
        with pytest.raises(CollectiveMismatchError,
                           match="call: allreduce on ranks? .*finalize on rank"):
            rabit.allreduce(np.zeros(2), Op.SUM)
        rabit.finalize()
    else:
        with pytest.raises(CollectiveMismatchError, match="finalize"):
            rabit.finalize()
    assert not rabit.is_distributed()


@needs_ranks(2)
def test_extra_call_before_checkpoint_is_caught():
    rabit.init(engine="mpi", timeout=60)
    try:
        rabit.allreduce(np.zeros(3), Op.SUM)
        with pytest.raises(CollectiveMismatchError) as info:
            if RANK == ODD:
                rabit.allreduce(np.zeros(3), Op.SUM)     # one call too many
            else:
                rabit.checkpoint({"v": 1})
        message = str(info.value)
        assert "  call: checkpoint on rank" in message and f"allreduce on rank {ODD}" in message
        assert rabit.version_number() == 0
    finally:
        # The ranks are now one call apart: finalize says so on every rank.
        with pytest.raises(CollectiveMismatchError, match="call number"):
            rabit.finalize()


@needs_ranks(2)
def test_bad_input_on_one_rank_stops_every_rank(check_place):
    data = np.zeros(4)
    if RANK == ODD:
        data.flags.writeable = False
        with pytest.raises(ValueError, match=f"rank {ODD}: allreduce .*read-only"):
            rabit.allreduce(data, Op.SUM)
    else:
        with pytest.raises(CollectiveMismatchError, match="input: .*refused \\(ValueError"):
            rabit.allreduce(data, Op.SUM)
    still_works()


@pytest.mark.parametrize("case,error,pattern", [
    ("bitor_float", TypeError, "Op.BITOR needs an integer or bool array"),
    ("sum_bool", TypeError, "ambiguous"),
    ("max_complex", TypeError, "undefined for complex"),
    ("strided", ValueError, "C-contiguous"),
    ("readonly", ValueError, "read-only"),
    ("not_array", TypeError, "needs a NumPy array"),
    ("bad_op", ValueError, "not a reduction operator"),
    ("object_dtype", TypeError, "does not support dtype object"),
    ("byteswapped", TypeError, "does not support dtype"),
    ("root_range", ValueError, "not a rank of this job"),
    ("root_type", TypeError, "root must be an int"),
    ("allgather_scalar", ValueError, "ndim >= 1"),
])
def test_bad_input_everywhere_is_refused_and_engine_survives(session, case, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        if case == "bitor_float":
            rabit.allreduce(np.ones(3), Op.BITOR)
        elif case == "sum_bool":
            rabit.allreduce(np.ones(3, dtype=bool), Op.SUM)
        elif case == "max_complex":
            rabit.allreduce(np.ones(3, dtype=np.complex64), Op.MAX)
        elif case == "strided":
            rabit.allreduce(np.ones((4, 4))[:, 1], Op.SUM)
        elif case == "readonly":
            a = np.ones(3)
            a.flags.writeable = False
            rabit.allreduce(a, Op.SUM)
        elif case == "not_array":
            rabit.allreduce([1.0, 2.0], Op.SUM)
        elif case == "bad_op":
            rabit.allreduce(np.ones(3), 42)
        elif case == "object_dtype":
            rabit.allreduce(np.array([1, "a"], dtype=object), Op.SUM)
        elif case == "byteswapped":
            rabit.allreduce(np.ones(3, dtype=">f8"), Op.SUM)
        elif case == "root_range":
            rabit.broadcast(np.ones(3), SIZE)
        elif case == "root_type":
            rabit.broadcast(np.ones(3), "0")
        elif case == "allgather_scalar":
            rabit.allgather(np.array(1.0))
    assert str(info.value).startswith(f"rank {RANK}: ")
    still_works()


def test_unpicklable_broadcast_raises_on_every_rank(session):
    for root in range(SIZE):
        obj = (lambda x: x) if RANK == root else None
        with pytest.raises(TypeError, match=f"broadcast from root {root}: the root's object "
                                            f"cannot be pickled"):
            rabit.broadcast(obj, root)
    still_works()


def test_calls_before_init_raise_not_initialized():
    for call in (rabit.get_rank, rabit.get_world_size, rabit.version_number,
                 lambda: rabit.allreduce(np.zeros(1), Op.SUM), lambda: rabit.broadcast(1),
                 lambda: rabit.allgather(np.zeros(1)), lambda: rabit.checkpoint(1),
                 rabit.load_checkpoint, lambda: rabit.tracker_print("x")):
        with pytest.raises(rabit.NotInitializedError, match="call rabit.init"):
            call()
    assert rabit.is_distributed() is False
    rabit.finalize()                         # harmless when not initialized


def test_double_init_is_refused(session):
    with pytest.raises(rabit.RabitError, match="already initialized"):
        rabit.init()


@needs_ranks(2)
@pytest.mark.skipif(not ulfm_enabled(), reason="needs mpirun --with-ft ulfm (as rabit-run does)")
def test_timeout_names_the_rank_that_did_not_arrive():
    rabit.init(engine="mpi", timeout=1)
    try:
        rabit.allreduce(np.zeros(2), Op.SUM)
        start = time.monotonic()
        if RANK == ODD:
            time.sleep(2.5)                    # never arrives in time
            with pytest.raises(CollectiveTimeoutError) as info:
                rabit.allreduce(np.zeros(2), Op.SUM)
            assert f"rank {RANK}: allreduce #1 (version 0) was aborted" in str(info.value)
        else:
            with pytest.raises(CollectiveTimeoutError) as info:
                rabit.allreduce(np.zeros(2), Op.SUM)
            elapsed = time.monotonic() - start
            message = str(info.value)
            assert message.startswith(f"rank {RANK}: allreduce #1 (version 0)"), message
            assert f"Rank(s) {ODD} did not arrive" in message, message
            assert elapsed < 10, elapsed
        # the engine is unusable afterwards, and says so
        with pytest.raises(rabit.RabitError):
            rabit.allreduce(np.zeros(2), Op.SUM)
    finally:
        rabit.finalize()
    WORLD.Barrier()
