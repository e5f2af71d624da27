import os

import numpy as np
import pytest

from rabit_py.engine import _mockplan as mock
from rabit_py.engine.recovery._cache import BOOT, BOOT_SHARE, ResultCache


def test_parse_plan():
    assert mock.parse_plan("1,2,0,0; 3,4,5,1;") == {(1, 2, 0, 0), (3, 4, 5, 1)}
    assert mock.parse_plan("") == frozenset()


@pytest.mark.parametrize("bad", ["1,2,3", "a,b,c,d", "1,2,3,4,5", "1,-2,3,0"])
def test_bad_plans_are_explained(bad):
    with pytest.raises(ValueError, match="is not 'rank,version,seqno,trial'"):
        mock.parse_plan(bad)


def test_plan_matches_exact_points_only():
    plan = mock.parse_plan("1,2,0,0;1,2,3,1")
    assert mock.matches(plan, rank=1, version=2, seqno=0, trial=0)
    assert mock.matches(plan, rank=1, version=2, seqno=3, trial=1)
    assert not mock.matches(plan, rank=1, version=2, seqno=3, trial=0)   # other life
    assert not mock.matches(plan, rank=0, version=2, seqno=0, trial=0)
    assert not mock.matches(plan, rank=1, version=3, seqno=0, trial=0)


def test_cache_keeps_bootstrap_and_reuses_arrays():
    import numpy as np
    cache = ResultCache()
    a = np.arange(4.0)
    cache.put_array((BOOT, 0), 1, (), a)
    cache.put_array((0, 0), 1, (), a * 2)
    cache.put_bytes((0, 1), 2, (), b"xyz")
    a[:] = -1                                   # the cache holds copies
    assert np.array_equal(cache.get((BOOT, 0)).payload, np.arange(4.0))
    assert cache.nbytes == 32 + 32 + 3
    cache.drop_epochs_before(1)
    assert (BOOT, 0) in cache and (0, 0) not in cache and (0, 1) not in cache
    assert cache.nbytes == 32
    cache.put_array((1, 0), 1, (), np.ones(4))
    assert np.array_equal(cache.get((1, 0)).payload, np.ones(4))


def test_a_checkpoint_pools_large_arrays_for_reuse_and_lets_small_ones_go():
    from rabit_py.engine.recovery._cache import _POOL_MIN_BYTES
    cache = ResultCache()
    large = np.zeros(_POOL_MIN_BYTES // 8)
    small = np.zeros(_POOL_MIN_BYTES // 8 - 1)
    cache.put_owned((0, 0), 1, (), large)
    cache.put_owned((0, 1), 1, (), small)
    cache.put_owned((1, 0), 1, (), np.zeros(3))          # a later version's: stays
    cache.drop_epochs_before(1)
    assert len(cache) == 1 and (1, 0) in cache and cache.nbytes == 24
    assert cache.buffer_like(large) is large              # warm memory, handed out again
    assert cache.buffer_like(small) is not small
    assert cache.buffer_like(large) is not large          # once


def test_the_cache_keeps_results_within_its_budget_only():
    cache = ResultCache(budget=100)
    cache.put_array((0, 0), 1, (), np.zeros(8))          # 64 bytes: kept
    assert not cache.full and cache.missing_hint() == ""
    cache.put_array((0, 1), 1, (), np.zeros(8))          # 128 > 100: refused
    cache.put_bytes((0, 2), 2, (), b"x" * 40)            # 104 > 100: refused
    cache.put_bytes((0, 3), 2, (), b"x" * 30)            # 94: kept
    assert (0, 0) in cache and (0, 1) not in cache and (0, 2) not in cache and (0, 3) in cache
    assert cache.nbytes == 94 and cache.full and cache.refused == 2
    assert "2 result(s) since the last checkpoint were not kept" in cache.missing_hint()
    assert "RABIT_CACHE_BUDGET=100" in cache.missing_hint()
    cache.drop_epochs_before(1)                          # a checkpoint: a fresh budget
    assert not cache.full and cache.nbytes == 0
    cache.put_array((1, 0), 1, (), np.zeros(8))
    assert (1, 0) in cache


def test_start_up_calls_may_use_an_eighth_of_the_budget_and_keep_it():
    # Note [cache budget]: BOOT results live for the whole job, so they get
    # 1/BOOT_SHARE of the budget; a version's calls get the rest.
    assert BOOT_SHARE == 8
    cache = ResultCache(budget=8 * 24)                   # BOOT may use 24 bytes
    cache.put_owned((BOOT, 0), 1, (), np.zeros(2))       # 16: kept
    cache.put_array((BOOT, 1), 1, (), np.zeros(2))       # 32 > 24: refused
    cache.put_bytes((BOOT, 2), 2, (), b"x" * 8)          # 24: kept
    assert [(BOOT, s) in cache for s in range(3)] == [True, False, True]
    assert cache.refused == 1 and (cache.counted, cache.boot_counted) == (24, 24)
    cache.drop_epochs_before(0)                          # load_checkpoint: version 0
    assert cache.refused == 0 and cache.counted == 24 and (BOOT, 0) in cache
    cache.put_bytes((0, 0), 2, (), b"x" * 160)           # 24 + 160 = 184 <= 192: kept
    cache.put_bytes((0, 1), 2, (), b"x" * 9)             # 193 > 192: refused
    assert (0, 0) in cache and (0, 1) not in cache and cache.counted == 184
    cache.drop_epochs_before(1)                          # BOOT's share stays charged
    assert cache.counted == 24 and cache.nbytes == 24


def test_every_rank_passes_the_budget_at_the_same_call_whatever_it_holds():
    # Note [uniform budget]: with result_copies each rank holds its share,
    # but the budget is charged with every result, so the ranks refuse
    # together (they must then take the same reduction path).
    refused_at = {}
    for rank in range(4):
        cache = ResultCache(budget=8 * 5, copies=2)
        refused_at[rank] = []
        for seqno in range(8):
            key = (0, seqno)
            was = cache.refused
            cache.put_owned(key, 1, (), cache.buffer_like(np.zeros(1)))
            cache.thin(key, rank, 4)
            if cache.refused > was:
                refused_at[rank].append(seqno)
        assert cache.nbytes < cache.counted == 40, rank     # holds less than it is charged
    assert all(calls == [5, 6, 7] for calls in refused_at.values()), refused_at


def test_a_replayed_result_is_charged_once_as_its_holder_was():
    from rabit_py.engine.recovery._cache import Entry
    survivor, replacement = ResultCache(budget=100), ResultCache(budget=100)
    for seqno in range(3):
        survivor.put_array((0, seqno), 1, (), np.full(4, seqno, dtype=np.float64))
    for seqno in range(3):                               # served in the recovery rounds
        replacement.put_entry((0, seqno), survivor.get((0, seqno)))
    replacement.put_entry((0, 2), Entry(1, (), np.zeros(4)))    # the same call again
    assert replacement.counted == survivor.counted == 96
    survivor.put_array((0, 3), 1, (), np.zeros(1))       # 104 > 100: both refuse
    replacement.put_array((0, 3), 1, (), np.zeros(1))
    assert survivor.refused == replacement.refused == 1


def test_the_default_budget_is_a_sixteenth_of_memory_shared_by_the_node(monkeypatch):
    from rabit_py.engine.recovery._cache import default_budget
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert default_budget() == max(64 << 20, memory // 64)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE")
    assert default_budget() == max(64 << 20, memory // 16)


def test_a_replacement_gets_what_fits_in_one_info_value_most_needed_first():
    from rabit_py._spawn import spawn_environment

    environ = {"HOME": "/root", "RABIT_TIMEOUT": "30", "PYTHONPATH": "/src",
               "RABIT_CHECKPOINT_DIR": "/a/very/long/shared/path/" + "x" * 200,
               "RABIT_RUN_STATUS_DIR": "/shared/.rabit-run/rabit-run-abc",
               "RABIT_SPARES": "1", "RABIT_BAD": "a\nb"}
    value = spawn_environment(environ, 255)
    assert len(value) <= 255
    lines = value.split("\n")
    # The import path and the status folder first; the long path does not
    # fit and is left to the join state; nothing outside RABIT_* but the
    # import path; no value with a newline.
    assert lines[:3] == ["PYTHONPATH=/src", "RABIT_RUN_STATUS_DIR=/shared/.rabit-run/rabit-run-abc",
                         "RABIT_SPARES=1"]
    assert "RABIT_TIMEOUT=30" in lines
    assert not any(line.startswith(("RABIT_CHECKPOINT_DIR", "HOME", "RABIT_BAD"))
                   for line in lines)
    assert spawn_environment({"RABIT_TIMEOUT": "30"}, 1000) == "RABIT_TIMEOUT=30"


def test_thinning_keeps_each_result_on_its_holders_and_the_latest_everywhere():
    # result_copies=2 on 4 ranks: result #s lives on ranks s and s+1 (mod 4).
    kept = {}
    for rank in range(4):
        cache = ResultCache(copies=2)
        for seqno in range(6):
            key = (0, seqno)
            out = cache.buffer_like(np.zeros(2))
            cache.put_owned(key, 1, (), out)
            assert cache.thin(key, rank, 4) is False
        kept[rank] = [s for s in range(6) if (0, s) in cache]
    for rank, seqnos in kept.items():
        holders = [s for s in range(5) if (s - rank) % 4 < 2]
        assert seqnos == holders + [5], (rank, seqnos)
    every = ResultCache()                       # copies=0: every rank keeps all
    for seqno in range(3):
        every.put_owned((0, seqno), 1, (), every.buffer_like(np.zeros(1)))
        every.thin((0, seqno), 1, 4)
    assert len(every) == 3


def test_thinning_says_once_that_the_budget_was_passed():
    cache = ResultCache(budget=16)
    cache.put_owned((0, 0), 1, (), np.zeros(2))          # 16 bytes: kept
    assert cache.thin((0, 0), 0, 2) is False
    cache.put_owned((0, 1), 1, (), np.zeros(2))          # refused
    assert cache.thin((0, 1), 0, 2) is True
    cache.put_owned((0, 2), 1, (), np.zeros(2))
    assert cache.thin((0, 2), 0, 2) is False


def test_key_codes_order_like_the_calls_and_round_trip():
    from rabit_py.engine.recovery._cache import code_key, key_code
    keys = [(BOOT, 0), (BOOT, 7), (0, 0), (0, 3), (1, 0), (12, 1 << 20)]
    codes = [key_code(k) for k in keys]
    assert codes == sorted(codes) and len(set(codes)) == len(codes)
    assert [code_key(c) for c in codes] == keys
