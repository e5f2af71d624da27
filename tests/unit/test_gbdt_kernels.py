"""The GBDT's compiled (numba) and NumPy kernels give the same bits.

Models are bit-identical whichever kernel grows them (Note [exact
histograms] in trainers/gbdt.py); these tests hold each kernel to it on
inputs chosen to reach the corners: NaN, -0.0, values equal to a cut point,
a feature without cut points, rows without a node, equal gains (the first
must win), splits that min_child_weight or the valid mask rule out.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")          # trainers/__init__ needs it
pytest.importorskip("numba")

from trainers._kernels import NumbaKernels, NumpyKernels  # noqa: E402

MISSING = 255


@pytest.fixture(scope="module")
def kernels():
    return NumbaKernels(), NumpyKernels()


def _edges(rng, n_features):
    edges = [np.unique(rng.standard_normal(rng.integers(1, 255))) for _ in range(n_features)]
    edges[1] = np.empty(0)                       # a feature with one value: no cut points
    edges[2] = np.array([-0.0, 0.5, 1.0])
    return edges


def test_binning_is_searchsorted_with_missing_values(kernels):
    compiled, numpy_ = kernels
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3000, 6))
    edges = _edges(rng, 6)
    X[::7, 0] = np.nan
    X[:50, 2] = [0.0, -0.0, 0.5, 1.0, np.nextafter(0.5, 0)] * 10   # on and beside the cuts
    X[50:60, 3] = edges[3][:10] if edges[3].size >= 10 else edges[3][0]
    got = compiled.binned(edges, MISSING, np.uint8, X)
    want = numpy_.binned(edges, MISSING, np.uint8, X)
    assert got.shape == X.shape and want.shape == X.shape[::-1]
    np.testing.assert_array_equal(got, want.T)
    assert (got[::7, 0] == MISSING).all()
    assert got[:5, 2].tolist() == [1, 1, 2, 3, 1]      # #cuts <= x, -0.0 == 0.0
    assert (got[:, 1][~np.isnan(X[:, 1])] == 0).all()


def _histograms(rng, n_nodes, n_features, width, scale=1000):
    """Integer-valued sums, as the quantized gradients give; missing last."""
    G = rng.integers(-scale, scale, (n_nodes, n_features, width)).astype(np.float64)
    H = rng.integers(0, scale, (n_nodes, n_features, width)).astype(np.float64)
    H[:, :, rng.random(width) < 0.3] = 0.0              # empty bins
    return G / 7.0, H / 3.0


@pytest.mark.parametrize("lam,mcw", [(1.0, 1.0), (0.0, 0.0), (5.0, 400.0)])
def test_best_splits_agree_to_the_bit(kernels, lam, mcw):
    compiled, numpy_ = kernels
    rng = np.random.default_rng(int(lam * 10 + mcw))
    width = 33
    G, H = _histograms(rng, 9, 5, width)
    G[:, 3], H[:, 3] = G[:, 1], H[:, 1]                 # equal gains: the first feature wins
    G[4], H[4] = 0.0, 0.0                                # a node where nothing can split
    valid = rng.random((5, width - 1)) < 0.9
    valid[3] = valid[1]
    Gt = G.sum(axis=(2)).sum(axis=1) / 5
    Ht = H.sum(axis=(2)).sum(axis=1) / 5
    got = compiled.best_splits(G, H, Gt, Ht, valid, lam, mcw)
    with np.errstate(divide="ignore", invalid="ignore"):   # the empty node with lambda 0
        want = numpy_.best_splits(G, H, Gt, Ht, valid, lam, mcw)
    assert len(got) == len(want) == 9
    for a, b in zip(got, want):
        assert a[1:] == b[1:]
        assert np.float64(a[0]).tobytes() == np.float64(b[0]).tobytes()
    assert got[4] == (-np.inf, 0, 0, False)
    assert all(f != 3 for _, f, _, _ in got)             # never the later twin of feature 1


def test_best_splits_of_strided_views(kernels):
    # The trainer passes views of the summed histogram (np.moveaxis), not copies.
    compiled, numpy_ = kernels
    rng = np.random.default_rng(5)
    G, H = _histograms(rng, 4, 6, 17)
    stacked = np.moveaxis(np.stack([G, H], axis=-1), 3, 0)
    valid = np.ones((6, 16), dtype=bool)
    args = (stacked[0], stacked[1], G.sum(axis=(1, 2)) / 6, H.sum(axis=(1, 2)) / 6, valid,
            1.0, 1.0)
    assert compiled.best_splits(*args) == numpy_.best_splits(*args)


@pytest.mark.parametrize("features", [None, [0, 2, 3]])
def test_histograms_and_routing_agree(kernels, features):
    compiled, numpy_ = kernels
    rng = np.random.default_rng(7)
    n, n_features, width = 5000, 4, 16
    columns = rng.integers(0, width, (n_features, n)).astype(np.uint8)
    node_of_row = rng.integers(-1, 5, n).astype(np.int32)      # -1: a row not sampled
    slot_of_node = np.array([-1, 0, -1, 2, 1], dtype=np.int64)
    g = rng.integers(-100, 100, n).astype(np.float64)
    h = rng.integers(0, 100, n).astype(np.float64)
    chosen = np.arange(n_features) if features is None else np.array(features)
    got = compiled.histograms(np.ascontiguousarray(columns.T), node_of_row, slot_of_node, 3,
                              g, h, chosen, width)
    want = numpy_.histograms(columns, node_of_row, slot_of_node, 3, g, h, chosen, width)
    assert got.shape == (3, chosen.size, width, 2)
    np.testing.assert_array_equal(got, want)
    assert got[..., 1].sum() == h[np.isin(node_of_row, [1, 3, 4])].sum() * chosen.size

    tree = {"feature": np.array([0, 1, 2, 3, 0], dtype=np.int32),
            "bin": np.array([3, 7, 0, 15, 8], dtype=np.int32),
            "default_left": np.array([True, False, True, False, True]),
            "left": np.array([5, 7, 9, 11, 13], dtype=np.int32),
            "right": np.array([6, 8, 10, 12, 14], dtype=np.int32)}
    columns[1, ::5] = width - 1                         # missing values go default_left
    is_split = np.array([True, True, False, True, True])
    routed_compiled, routed_numpy = node_of_row.copy(), node_of_row.copy()
    compiled.route(np.ascontiguousarray(columns.T), routed_compiled, is_split, tree, width - 1)
    numpy_.route(columns, routed_numpy, is_split, tree, width - 1)
    np.testing.assert_array_equal(routed_compiled, routed_numpy)
    assert (routed_compiled[node_of_row == 2] == 2).all()      # a node not split stays
    assert (routed_compiled[node_of_row == -1] == -1).all()
