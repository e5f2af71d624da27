import pytest

from rabit_py.engine import _mockplan as mock
from rabit_py.engine._cache import BOOT, ResultCache


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
    cache.put_array((1, 0), 1, (), np.ones(4))   # reuses the freed array
    assert np.array_equal(cache.get((1, 0)).payload, np.ones(4))
