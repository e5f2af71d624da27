"""The inner loops of histogram boosting, in two interchangeable versions.

``numba`` compiles plain loops over rows (one pass per level for all nodes
and features; about 4x faster than NumPy here), ``numpy`` is the fallback
when numba is not installed. Histogram sums are of integer-valued float64
(Note [exact histograms] in gbdt.py), so both give bit-identical models.

Each version keeps the binned features in the layout its loops read best:
``numpy`` one contiguous row per feature (F, n), ``numba`` one contiguous row
per sample (n, F).
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

__all__ = ["get_kernels", "numba_available"]


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


class NumpyKernels:
    """Vectorized NumPy: one ``bincount`` per feature and statistic."""

    name = "numpy"

    @staticmethod
    def layout(binned_columns: np.ndarray) -> np.ndarray:
        return binned_columns

    @staticmethod
    def histograms(bins: np.ndarray, node_of_row: np.ndarray, slot_of_node: np.ndarray,
                   n_slots: int, g: np.ndarray, h: np.ndarray, features: np.ndarray,
                   width: int) -> np.ndarray:
        """(n_slots, len(features), width, 2) sums of g and h, by node slot,
        feature and bin, over the rows whose node has a slot."""
        slot = np.where(node_of_row >= 0, slot_of_node[np.maximum(node_of_row, 0)], -1)
        rows = np.flatnonzero(slot >= 0)
        everyone = rows.size == node_of_row.size
        base = slot[rows] * width if n_slots > 1 else None
        gs = g if everyone else g[rows]
        hs = h if everyone else h[rows]
        size = n_slots * width
        out = np.empty((n_slots, features.size, width, 2))
        for i, f in enumerate(features):
            col = bins[f] if everyone else bins[f][rows]
            idx = col if base is None else base + col
            out[:, i, :, 0] = np.bincount(idx, weights=gs, minlength=size).reshape(n_slots, width)
            out[:, i, :, 1] = np.bincount(idx, weights=hs, minlength=size).reshape(n_slots, width)
        return out

    @staticmethod
    def route(bins: np.ndarray, node_of_row: np.ndarray, is_split: np.ndarray,
              tree: Dict[str, np.ndarray], missing: int) -> None:
        """Move the rows of the nodes just split (``is_split``) to their children."""
        rows = np.flatnonzero((node_of_row >= 0) & is_split[np.maximum(node_of_row, 0)])
        n = node_of_row[rows]
        v = bins[tree["feature"][n], rows]
        go_left = np.where(v == missing, tree["default_left"][n], v <= tree["bin"][n])
        node_of_row[rows] = np.where(go_left, tree["left"][n], tree["right"][n])

    @staticmethod
    def leaf_values(bins: np.ndarray, tree: Dict[str, np.ndarray], missing: int) -> np.ndarray:
        """The leaf value each row reaches (rows routed by binned values)."""
        node = np.zeros(bins.shape[1], dtype=np.int32)
        left, right = tree["left"], tree["right"]
        active = np.arange(bins.shape[1])
        while active.size:
            n = node[active]
            inner = left[n] >= 0
            active, n = active[inner], n[inner]
            if not active.size:
                break
            v = bins[tree["feature"][n], active]
            go_left = np.where(v == missing, tree["default_left"][n], v <= tree["bin"][n])
            node[active] = np.where(go_left, left[n], right[n])
        return tree["value"][node]


_NUMBA: Dict[str, Any] = {}


def _compile() -> Dict[str, Any]:
    if _NUMBA:
        return _NUMBA
    from numba import njit

    @njit(cache=True, nogil=True)
    def histograms(bins, node_of_row, slot_of_node, n_slots, g, h, features,
                   width):  # pragma: no cover - compiled
        out = np.zeros((n_slots, features.size, width, 2))
        nf = features.size
        for r in range(node_of_row.size):
            node = node_of_row[r]
            if node < 0:
                continue
            s = slot_of_node[node]
            if s < 0:
                continue
            gr = g[r]
            hr = h[r]
            for j in range(nf):
                b = bins[r, features[j]]
                out[s, j, b, 0] += gr
                out[s, j, b, 1] += hr
        return out

    @njit(cache=True, nogil=True)
    def route(bins, node_of_row, is_split, feature, split_bin, default_left, left, right,
              missing):  # pragma: no cover - compiled
        for r in range(node_of_row.size):
            node = node_of_row[r]
            if node < 0 or not is_split[node]:
                continue
            v = bins[r, feature[node]]
            go_left = default_left[node] if v == missing else v <= split_bin[node]
            node_of_row[r] = left[node] if go_left else right[node]

    @njit(cache=True, nogil=True)
    def leaf_values(bins, feature, split_bin, default_left, left, right, value,
                    missing):  # pragma: no cover - compiled
        out = np.empty(bins.shape[0])
        for r in range(bins.shape[0]):
            node = 0
            while left[node] >= 0:
                v = bins[r, feature[node]]
                go_left = default_left[node] if v == missing else v <= split_bin[node]
                node = left[node] if go_left else right[node]
            out[r] = value[node]
        return out

    _NUMBA.update(histograms=histograms, route=route, leaf_values=leaf_values)
    return _NUMBA


class NumbaKernels:
    """Compiled loops over rows (numba, compiled once and cached on disk)."""

    name = "numba"

    def __init__(self) -> None:
        self._fn = _compile()

    @staticmethod
    def layout(binned_columns: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(binned_columns.T)

    def histograms(self, bins: np.ndarray, node_of_row: np.ndarray, slot_of_node: np.ndarray,
                   n_slots: int, g: np.ndarray, h: np.ndarray, features: np.ndarray,
                   width: int) -> np.ndarray:
        return self._fn["histograms"](bins, node_of_row, slot_of_node, n_slots, g, h,
                                      features.astype(np.int64), width)

    def route(self, bins: np.ndarray, node_of_row: np.ndarray, is_split: np.ndarray,
              tree: Dict[str, np.ndarray], missing: int) -> None:
        self._fn["route"](bins, node_of_row, is_split, tree["feature"], tree["bin"],
                          tree["default_left"], tree["left"], tree["right"], missing)

    def leaf_values(self, bins: np.ndarray, tree: Dict[str, np.ndarray],
                    missing: int) -> np.ndarray:
        return self._fn["leaf_values"](bins, tree["feature"], tree["bin"], tree["default_left"],
                                       tree["left"], tree["right"], tree["value"], missing)


def get_kernels(name: str) -> Any:
    """``"auto"`` (numba when installed), ``"numba"`` or ``"numpy"``.

    Raises:
        ValueError: an unknown name, or ``"numba"`` without numba installed.
    """
    if name == "auto":
        name = "numba" if numba_available() else "numpy"
    if name == "numpy":
        return NumpyKernels()
    if name == "numba":
        if not numba_available():
            raise ValueError("hist_kernel='numba' needs numba: pip install numba "
                             "(or use hist_kernel='numpy')")
        return NumbaKernels()
    raise ValueError(f"hist_kernel={name!r}: use 'auto', 'numba' or 'numpy'")
