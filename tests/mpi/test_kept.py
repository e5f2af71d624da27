"""The robust engine's kept results (Note [kept results] in
rabit_py/engine/_shm.py) on every rank: from ``shm_keep_min_bytes`` an
allreduce's result is kept where the shared-memory reduction wrote it, one
area per node, read-only, reused once every rank let go of it; ranks that
take different paths in one call (``prepare_fun``, past the cache budget)
run one protocol and get the same bits."""

import numpy as np
import pytest
from mpi4py import MPI

import rabit_py as rabit
from rabit_py import Op

from .conftest import WORLD, needs_ranks

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()
COUNT = 1 << 18                 # float32: 1 MiB, the default shm_keep_min_bytes


def rank_order_sum(mine: np.ndarray) -> np.ndarray:
    """Every rank's ``mine`` summed in rank order (the shared-memory bits)."""
    everyone = WORLD.allgather(mine)
    total = everyone[0].copy()
    for other in everyone[1:]:
        total += other
    return total


def my_input(*seed: int) -> np.ndarray:
    return np.random.default_rng([RANK, *seed]).normal(size=COUNT).astype(np.float32)


@needs_ranks(2)
def test_results_are_kept_in_one_area_per_node_reused_across_versions():
    rabit.init(engine="robust", timeout=60)
    try:
        engine = rabit.api._engine
        rabit.load_checkpoint()         # (calls before it are kept for the whole job)
        for version in range(6):
            for call in range(2):
                mine = my_input(version, call)
                data = mine.copy()
                rabit.allreduce(data, Op.SUM)
                assert data.tobytes() == rank_order_sum(mine).tobytes()
                kept = engine._cache.get((engine._epoch, engine.frame.seqno - 1)).payload
                # the cache holds the node's area itself: the same bytes, read-only
                assert not kept.flags.writeable and not kept.flags.owndata
                assert kept.tobytes() == data.tobytes()
                with pytest.raises(ValueError, match="read-only"):
                    kept[0] = 1.0
                del kept
            rabit.lazy_checkpoint(data)
        reducer = engine._reduce._shm
        assert reducer is not None and reducer.keeps
        # Two results per version, let go at the next checkpoint: the areas
        # of a version are reused by the versions after it.
        assert 2 <= len(reducer._areas) <= 4, sorted(reducer._areas)
        # An area is held by every node rank while their caches keep it.
        kept = [e for e in engine._cache._entries.values()
                if isinstance(e.payload, np.ndarray) and not e.payload.flags.writeable]
        WORLD.Barrier()
        holds = sorted(sum(int(hold[0]) for hold in area.holds)
                       for area in reducer._areas.values())
        assert holds == [0] * (len(holds) - len(kept)) + [reducer.node_size] * len(kept)
        del kept
        engine._cache.drop_epochs_before(engine._epoch + 1)     # what a checkpoint does
        WORLD.Barrier()
        holds = [[int(hold[0]) for hold in area.holds] for area in reducer._areas.values()]
        assert all(h == [0] * reducer.node_size for h in holds), holds
    finally:
        rabit.finalize()


@needs_ranks(2)
def test_ranks_on_different_paths_in_one_call_get_the_same_bits():
    # rank 0 with prepare_fun (in place), the others by default (out of
    # place): one shared-memory protocol, one result. Then the budget is
    # passed: the call that passes it still runs that protocol (the result
    # is not kept), and the calls after it, on every rank, rank 0 still
    # with prepare_fun, MPI's own in-place allreduce, with MPI's bits.
    rabit.init(engine="robust", timeout=60)
    try:
        rabit.checkpoint(None)
        mine = my_input(99)
        mpi_bits = mine.copy()
        WORLD.Allreduce(MPI.IN_PLACE, mpi_bits, op=MPI.SUM)
        expected = [rank_order_sum(mine)] * 2 + [mpi_bits] * 2
        for call, bits in enumerate(expected):
            if call == 1:
                # The budget is charged alike on every rank (Note [uniform
                # budget]): one byte more than this version holds.
                rabit.api._engine._cache.budget = mine.nbytes + 1
            if RANK == 0:
                got = rabit.allreduce(np.zeros_like(mine), Op.SUM,
                                      prepare_fun=lambda buf: np.copyto(buf, mine))
            else:
                got = rabit.allreduce(mine.copy(), Op.SUM)
            assert got.tobytes() == bits.tobytes(), call
            info = rabit.engine_info()
            assert (info.cache_refused, info.cache_bytes) == (call, mine.nbytes), call
    finally:
        rabit.finalize()


@needs_ranks(2)
def test_the_ranks_agree_on_the_smallest_default_budget(monkeypatch):
    # Note [uniform budget]: hosts with more memory get larger defaults;
    # the job runs on the smallest, which a replacement is given too.
    import rabit_py.engine.robust as robust
    monkeypatch.setattr(robust, "default_budget", lambda: (64 << 20) + (RANK + 1) * 4096)
    rabit.init(engine="robust", timeout=60)
    try:
        engine = rabit.api._engine
        assert rabit.engine_info().cache_budget == (64 << 20) + 4096
        assert engine._config.cache_budget == (64 << 20) + 4096
        assert engine.recovery.config.cache_budget == (64 << 20) + 4096
    finally:
        rabit.finalize()


@needs_ranks(2)
def test_below_the_threshold_and_with_shm_off_results_are_private_copies():
    for settings in ({"shm_keep_min_bytes": COUNT * 4 + 1}, {"shm": False}):
        rabit.init(engine="robust", timeout=60, **settings)
        try:
            engine = rabit.api._engine
            mine = my_input(7)
            data = mine.copy()
            rabit.allreduce(data, Op.SUM)
            kept = engine._cache.get((engine._epoch, engine.frame.seqno - 1)).payload
            assert kept.flags.writeable and kept.flags.owndata, settings
            assert kept.tobytes() == data.tobytes()
            assert engine._reduce._shm is None, settings
        finally:
            rabit.finalize()


# ---------------------------------------------------------------- fused calls
# Note [fused in place] in rabit_py/engine/_shm.py: on one node the kept
# allreduce reduces in the caller's array; a call run again after a failure
# is finished from what the interrupted one left, with the bits of a run
# without failures.
CHUNKS = 4
FUSED_COUNT = CHUNKS * (1 << 20) // 4        # float32, four 1 MiB chunks


def fused_input(seed: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng([RANK, seed]).normal(size=FUSED_COUNT).astype(dtype)


@needs_ranks(2)
def test_a_fused_call_that_finished_is_given_again_not_reduced_again():
    # A failure noticed after the call (before the engine cached the
    # result) runs it again: the array holds the result, not the input.
    rabit.init(engine="robust", timeout=60)
    try:
        reduce = rabit.api._engine._reduce
        mine = fused_input(1)
        expected = rank_order_sum(mine)
        data = mine.copy()
        kept = reduce.run_kept(data, Op.SUM, call_id=(7, 3))
        assert reduce._shm.fused
        assert data.tobytes() == kept.tobytes() == expected.tobytes()
        if RANK == SIZE - 1:
            # a replacement: its input again, nothing of the call kept
            data, reduce._last_kept = mine.copy(), None
        again = reduce.run_kept(data, Op.SUM, call_id=(7, 3), again=True)
        assert data.tobytes() == again.tobytes() == expected.tobytes()
        assert not again.flags.writeable
        # Another call's leftovers are not used: run as a new call.
        data = mine.copy()
        fresh = reduce.run_kept(data, Op.SUM, call_id=(7, 4), again=True)
        assert data.tobytes() == fresh.tobytes() == expected.tobytes()
    finally:
        rabit.finalize()


@needs_ranks(2)
@pytest.mark.parametrize("op,dtype", [(Op.SUM, np.float32), (Op.MAX, np.float64)])
@pytest.mark.parametrize("chunk", [0, 1, CHUNKS - 2])
@pytest.mark.parametrize("replaced", [False, True])
def test_a_fused_call_interrupted_part_way_is_finished_with_the_same_bits(
        monkeypatch, op, dtype, chunk, replaced):
    interrupt_and_finish(monkeypatch, op, dtype, chunk, replaced, True)


@needs_ranks(2)
def test_an_interrupted_fused_call_is_finished_by_a_reducer_that_cannot_keep(monkeypatch):
    # The replacement came up on another host: the rebuilt reducer keeps
    # nothing and reduces over MPI, but the call is finished all the same.
    interrupt_and_finish(monkeypatch, Op.SUM, np.float32, 1, True, False)


def interrupt_and_finish(monkeypatch, op, dtype, chunk, replaced, rebuilt_keeps):
    # The last rank leaves the call as if it died there, having reduced its
    # part of chunk `chunk` + 1 and waiting for chunk `chunk` to be reduced
    # everywhere; the others reduce their part of `chunk` + 1 too, then wait
    # for its flags of the chunk after: they notice and leave, with some
    # parts of their arrays reduced and the rest still input -- or, when
    # `chunk` + 1 is the last chunk, they finish the call. Run again, every
    # rank ends with the bits of an uninterrupted call; `replaced`: the rank
    # that left comes back as a replacement would, with its input and
    # nothing kept.
    from rabit_py.engine._mpistart import ERR_PROC_FAILED
    rabit.init(engine="robust", timeout=60)
    try:
        reduce = rabit.api._engine._reduce
        mine = fused_input(chunk, dtype)
        everyone = WORLD.allgather(mine)
        expected = everyone[0].copy()
        for other in everyone[1:]:
            expected = np.maximum(expected, other) if op == Op.MAX else expected + other
        data = mine.copy()
        reduce.run_kept(data.copy(), op, call_id=(1, 0))        # builds the reducer
        reducer = reduce._shm
        leaver = RANK == SIZE - 1
        if leaver:
            copies = []
            real = reducer._copy_others

            def leave_at_chunk(*args):
                if len(copies) == chunk:
                    raise MPI.Exception(ERR_PROC_FAILED)
                copies.append(args)
                return real(*args)
            monkeypatch.setattr(reducer, "_copy_others", leave_at_chunk)
        try:
            reduce.run_kept(data, op, call_id=(1, 1))
            raised = False
        except MPI.Exception:
            raised = True
        # Another rank may notice the leaver's exit between two looks at a
        # flag the leaver raised meanwhile, and leave a chunk earlier.
        assert raised or (not leaver and chunk + 2 == CHUNKS)
        WORLD.Barrier()                 # the flags are read once no rank runs the call
        left = reduce._last_kept
        assert left is not None and left.call_id == (1, 1)
        if raised:
            done = left.unfinished.chunks_done()
            assert done[SIZE - 1] == chunk + 2, done
            assert all(chunk + 1 <= d <= chunk + 2 for d in done), done
        else:
            assert left.result is not None and data.tobytes() == expected.tobytes()
        if raised:
            changed = np.frombuffer(data.tobytes(), dtype=dtype) != mine
            assert changed.any() and not changed.all()
        if replaced and RANK == SIZE - 1:
            data, reduce._last_kept = mine.copy(), None
        reduce.use(reduce._comm)        # as the repair does on every rank
        if not rebuilt_keeps:
            reduce._wants_shm(data, op)
            monkeypatch.setattr(reduce._shm, "keeps", False)
            monkeypatch.setattr(reduce._shm, "fused", False)
            monkeypatch.setattr(reduce._shm, "colocated", False)
        again = reduce.run_kept(data, op, call_id=(1, 1), again=True)
        assert data.tobytes() == again.tobytes() == expected.tobytes()
        if not rebuilt_keeps:
            return
        # the rebuilt reducer runs the next call as usual
        data = mine.copy()
        reduce.run_kept(data, op, call_id=(1, 2))
        assert data.tobytes() == expected.tobytes()
    finally:
        rabit.finalize()
