"""What an interrupted fused allreduce left (Note [fused in place] in
rabit_py/engine/_shm.py): which elements hold the result, from how many
chunks each node rank finished its part of."""

import numpy as np

from rabit_py.engine._shm import _fold, _fold_in_place, finished_parts


def test_each_rank_finished_a_prefix_of_its_parts():
    # 10 elements in chunks of 4 (4, 4, 2) over 3 ranks: the parts of a
    # chunk of m are [m*q//3, m*(q+1)//3), of 1, 1, 2 and 0, 1, 1 elements.
    mask = finished_parts(10, 4, [2, 0, 3])
    assert mask.tolist() == [True, False, True, True, True, False, True, True, False, True]


def test_nothing_and_everything():
    assert not finished_parts(7, 3, [0, 0]).any()
    assert finished_parts(7, 3, [3, 3]).all()
    # one rank done with everything, the other with nothing: its halves
    assert finished_parts(8, 4, [2, 0]).tolist() == [True, True, False, False] * 2


def assert_same_bits_on_every_rank(ufunc, inputs):
    """Whichever rank's input is the output, the in-place fold gives the fold's bits."""
    expected = np.empty_like(inputs[0])
    _fold(ufunc, inputs, expected)
    for me in range(len(inputs)):
        parts = [x.copy() for x in inputs]
        _fold_in_place(ufunc, parts, parts[me], np.empty_like(inputs[0]))
        assert parts[me].tobytes() == expected.tobytes(), (len(inputs), me)


def test_the_fold_in_place_gives_the_bits_of_the_fold():
    rng = np.random.default_rng(3)
    for ranks in (2, 3, 4, 5):
        assert_same_bits_on_every_rank(
            np.add, [rng.normal(size=1000).astype(np.float32) for _ in range(ranks)])
        # a non-commutative order matters: MAX of -0.0 and +0.0 keeps the first
        assert_same_bits_on_every_rank(
            np.maximum,
            [np.array([-0.0 if q % 2 else 0.0], dtype=np.float64) for q in range(ranks)])
