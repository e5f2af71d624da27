"""Bucket planning (no MPI): reverse order, first bucket small, big ones alone,
dtype changes split."""

import numpy as np
import pytest

from rabit_py.ddp.bucket import plan_buckets

MIB = 2 ** 20


def test_buckets_in_reverse_order_with_a_small_first_one():
    sizes = [MIB // 2, MIB // 2, 2 * MIB, 30 * MIB, MIB]
    assert plan_buckets(sizes, ["f4"] * 5) == [[4], [3], [2, 1, 0]]
    assert plan_buckets(sizes, ["f4"] * 5, bucket_cap_mb=100, first_bucket_mb=100) == \
        [[4, 3, 2, 1, 0]]


def test_a_dtype_change_starts_a_new_bucket():
    assert plan_buckets([8, 8, 8], [np.float32, np.int64, np.int64]) == [[2, 1], [0]]


def test_bad_caps():
    with pytest.raises(ValueError, match="must be > 0"):
        plan_buckets([8], ["f8"], bucket_cap_mb=0)
