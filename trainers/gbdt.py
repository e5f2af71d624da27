"""Distributed gradient-boosted trees, as XGBoost's ``tree_method="hist"``.

Rows are split across ranks; every rank grows the same trees. Per round:

1. gradients and hessians of this rank's rows, quantized to integers on a grid
   common to all ranks (Note [exact histograms]);
2. depth-wise growth: per level, gradient/hessian histograms of the nodes
   being built, summed over ranks with one ``allreduce``; the larger sibling
   of each pair is the parent's histogram minus the smaller one's;
3. split finding with XGBoost's gain (``lambda``, ``gamma``,
   ``min_child_weight``), missing values sent the better way;
4. the model after the round is the global checkpoint (``lazy_checkpoint``:
   serialized only when a failure needs it), so a replaced or restarted
   worker resumes after the last finished round.

# Note [exact histograms]
Float sums depend on the order of their terms, and that order depends on how
rows are split. So gradients are rounded to integers on a grid chosen from
the global largest gradient and row count (as XGBoost does for deterministic
GPU histograms): every partial sum is an integer below 2**52, exact in
float64, hence the same for any split. Cut points come from a sample of rows
chosen by a hash of their global row number, gathered in global order. Each
round's subsample is drawn the same way. So 1, 2 or 4 workers grow
bit-identical models.
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

import rabit_py as rabit

from ._common import cli_parser
from ._common import (DataError, agree, data_fingerprint, ensure_init, exact_sum, global_offset,
                      progress, resume_state, state_key, splitmix64)
from ._kernels import get_kernels
from .data import check_features, check_labels, load_shard

__all__ = ["train", "Booster", "DataError", "main"]

_ALIASES = {"learning_rate": "eta", "reg_lambda": "lambda", "min_split_loss": "gamma",
            "random_state": "seed", "n_estimators": None}
_DEFAULTS: Dict[str, Any] = {
    "objective": "reg:squarederror", "eta": 0.3, "max_depth": 6, "min_child_weight": 1.0,
    "lambda": 1.0, "gamma": 0.0, "max_bin": 256, "subsample": 1.0, "colsample_bytree": 1.0,
    "seed": 0, "num_class": 0, "eval_metric": None, "base_score": None,
    "hist_kernel": "auto",
}
_IGNORED = {"tree_method", "nthread", "n_jobs", "verbosity", "silent", "device"}
_OBJECTIVES = ("binary:logistic", "reg:squarederror", "multi:softprob")
_METRICS = ("logloss", "auc", "rmse", "merror", "mlogloss", "error")
_DEFAULT_METRIC = {"binary:logistic": "logloss", "reg:squarederror": "rmse",
                   "multi:softprob": "mlogloss"}
_SKETCH_ROWS = 100_000      # rows sampled (globally) to choose the cut points
_EPS = 1e-6                 # XGBoost's kRtEps: smallest loss change worth a split


def _normalize(params: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(_DEFAULTS)
    for key, value in params.items():
        if key in _IGNORED:
            continue
        name = _ALIASES.get(key, key)
        if name is None or name not in _DEFAULTS:
            known = sorted(set(_DEFAULTS) | {a for a, n in _ALIASES.items() if n})
            raise ValueError(f"unknown GBDT parameter {key!r}; known: {', '.join(known)}")
        out[name] = value
    if out["objective"] not in _OBJECTIVES:
        raise ValueError(f"objective {out['objective']!r} is not supported; use one of "
                         f"{', '.join(_OBJECTIVES)}")
    if out["objective"] == "multi:softprob" and int(out["num_class"]) < 2:
        raise ValueError("multi:softprob needs num_class >= 2")
    for key, low, high in (("eta", 0.0, math.inf), ("subsample", 0.0, 1.0),
                           ("colsample_bytree", 0.0, 1.0)):
        if not low < float(out[key]) <= high:
            raise ValueError(f"{key}={out[key]} is outside ({low}, {high}]")
    if not 1 <= int(out["max_depth"]) <= 30:
        raise ValueError(f"max_depth={out['max_depth']} must be in [1, 30]")
    if not 3 <= int(out["max_bin"]) <= 65536:
        raise ValueError(f"max_bin={out['max_bin']} must be in [3, 65536]")
    for key in ("lambda", "gamma", "min_child_weight"):
        if float(out[key]) < 0:
            raise ValueError(f"{key}={out[key]} must be >= 0")
    metrics = out["eval_metric"] or [_DEFAULT_METRIC[out["objective"]]]
    out["eval_metric"] = [metrics] if isinstance(metrics, str) else list(metrics)
    for m in out["eval_metric"]:
        if m not in _METRICS:
            raise ValueError(f"eval_metric {m!r} is not supported; use {', '.join(_METRICS)}")
    return out


# ---------------------------------------------------------------- the model
class Booster:
    """A trained model: trees over raw feature values. ``predict`` needs no MPI."""

    def __init__(self, params: Dict[str, Any], base_score: float, n_features: int) -> None:
        self.params = params
        self.base_score = base_score
        self.n_features = n_features
        self.trees: List[Dict[str, np.ndarray]] = []   # per round: num_class (or 1) trees
        self.evals_result: Dict[str, Dict[str, List[float]]] = {}
        self.best_iteration: Optional[int] = None
        self.best_score: Optional[float] = None

    @property
    def num_trees_per_round(self) -> int:
        return int(self.params["num_class"]) if self.params["objective"] == "multi:softprob" \
            else 1

    def num_boosted_rounds(self) -> int:
        """Rounds in the model."""
        return len(self.trees) // self.num_trees_per_round

    def predict(self, X: np.ndarray, output_margin: bool = False,
                iteration_range: Optional[Tuple[int, int]] = None) -> np.ndarray:
        """Predictions for the rows of ``X``: probabilities for
        ``binary:logistic`` (n,), class probabilities for ``multi:softprob``
        (n, num_class), values for ``reg:squarederror``; raw scores with
        ``output_margin``. NaN is a missing value.

        Raises:
            ValueError: ``X`` does not have the model's number of features.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X has shape {X.shape}; the model was trained on "
                             f"{self.n_features} features")
        first, last = iteration_range or (0, self.num_boosted_rounds())
        k = self.num_trees_per_round
        margin = np.full((X.shape[0], k), self.base_score)
        for i in range(first * k, last * k):
            margin[:, i % k] += _apply_raw(self.trees[i], X)
        if output_margin:
            return margin[:, 0] if k == 1 else margin
        return _transform(self.params["objective"], margin)

    # ---------------------------------------------------------- persistence
    def to_dict(self) -> Dict[str, Any]:
        """The model as plain JSON-able data."""
        state = self.snapshot()
        state["trees"] = [{k: v.tolist() for k, v in t.items()} for t in self.trees]
        return state

    def snapshot(self) -> Dict[str, Any]:
        """The model as it is now, sharing the (never modified) tree arrays:
        cheap enough to hand to ``lazy_checkpoint`` every round."""
        return {"format": "rabit_py.gbdt/1", "params": dict(self.params),
                "base_score": self.base_score, "n_features": self.n_features,
                "trees": list(self.trees),
                "evals_result": {name: {m: list(v) for m, v in metrics.items()}
                                 for name, metrics in self.evals_result.items()},
                "best_iteration": self.best_iteration, "best_score": self.best_score}

    @classmethod
    def from_dict(cls, state: Dict[str, Any]) -> "Booster":
        if state.get("format") != "rabit_py.gbdt/1":
            raise ValueError(f"not a rabit_py GBDT model (format {state.get('format')!r})")
        booster = cls(dict(state["params"]), float(state["base_score"]),
                      int(state["n_features"]))
        booster.trees = [{k: np.asarray(v, dtype=_TREE_DTYPES[k]) for k, v in t.items()}
                         for t in state["trees"]]
        booster.evals_result = {name: {m: list(v) for m, v in metrics.items()}
                                for name, metrics in state["evals_result"].items()}
        booster.best_iteration = state["best_iteration"]
        booster.best_score = state["best_score"]
        return booster

    def save_model(self, path: str, format: str = "rabit_py") -> None:
        """Write the model as JSON: ``format="rabit_py"`` (ours: floats
        round-trip exactly, :meth:`load_model` reads it) or ``"xgboost"``
        (XGBoost's JSON model, which ``xgboost.Booster(model_file=path)``
        loads; Note [xgboost json] in ``trainers/_xgboost_format.py``).

        Raises:
            ValueError: an unknown ``format``.
        """
        if format == "xgboost":
            document = self.to_xgboost_json()
        elif format == "rabit_py":
            document = self.to_dict()
        else:
            raise ValueError(f"format={format!r}: use 'rabit_py' or 'xgboost'")
        with open(path, "w") as f:
            json.dump(document, f)

    def to_xgboost_json(self) -> Dict[str, Any]:
        """The model in XGBoost's JSON schema (as a dict)."""
        from ._xgboost_format import to_xgboost_json

        return to_xgboost_json(self.params, self.base_score, self.n_features, self.trees,
                               self.num_trees_per_round)

    def to_xgboost(self) -> Any:
        """The model as an ``xgboost.Booster``.

        Raises:
            ImportError: xgboost is not installed (``pip install xgboost-cpu``).
        """
        try:
            import xgboost
        except ImportError as exc:
            raise ImportError("to_xgboost() needs xgboost: pip install xgboost-cpu (or "
                              "xgboost)") from exc
        return xgboost.Booster(model_file=bytearray(json.dumps(self.to_xgboost_json()),
                                                    "utf-8"))

    @classmethod
    def load_model(cls, path: str) -> "Booster":
        """Read a model written by :meth:`save_model`.

        Raises:
            ValueError: the file is not a rabit_py GBDT model.
        """
        with open(path) as f:
            return cls.from_dict(json.load(f))


_TREE_DTYPES = {"feature": np.int32, "bin": np.int32, "threshold": np.float64,
                "default_left": np.bool_, "left": np.int32, "right": np.int32,
                "value": np.float64}


# Note [missing-only child]
# A split may put the missing values of a feature on one side and all its
# values on the other: the split after the feature's last value bin, with
# the missing values going right. XGBoost's hist makes it (its last cut lies
# above the largest value); without it, a node could not set apart missing
# values that predict the label (one depth-1 tree on a label that is "f0 is
# missing", 10% noise: XGBoost's split gave training AUC 0.9482, ours, on a
# value of f0, 0.9465; now the same split and 0.9482). Its threshold is
# +inf: every value is below it, and a NaN follows default_left (false).
# Where no value is missing the right side is empty and the split is never
# taken, so such models did not change.


def _apply_raw(tree: Dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    node = np.zeros(X.shape[0], dtype=np.int32)
    left, right = tree["left"], tree["right"]
    rows = np.arange(X.shape[0])
    while True:
        inner = left[node] >= 0
        if not inner.any():
            return tree["value"][node]
        r = rows[inner]
        n = node[inner]
        x = X[r, tree["feature"][n]]
        go_left = np.where(np.isnan(x), tree["default_left"][n], x < tree["threshold"][n])
        node[inner] = np.where(go_left, left[n], right[n])


def _transform(objective: str, margin: np.ndarray) -> np.ndarray:
    if objective == "binary:logistic":
        return 1.0 / (1.0 + np.exp(-margin[:, 0]))
    if objective == "multi:softprob":
        e = np.exp(margin - margin.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    return margin[:, 0]


# ---------------------------------------------------------------- binning
class _Cuts:
    """Per-feature cut points: a value x falls in bin ``#edges <= x``. The
    last of the ``max_bin`` bins holds missing values (as in LightGBM), so
    values get ``max_bin - 1`` bins and 256 bins fit in a byte."""

    def __init__(self, edges: List[np.ndarray], max_bin: int) -> None:
        self.edges = edges
        self.missing = max_bin - 1
        self.width = max_bin
        self.dtype = np.uint8 if self.width <= 256 else np.uint16
        self.n_edges = np.array([e.size for e in edges], dtype=np.int64)

    def bin(self, X: np.ndarray, kernels: Any) -> np.ndarray:
        """``X``'s bins in the layout of ``kernels``."""
        return kernels.binned(self.edges, self.missing, self.dtype, X)


def _sketch(X: np.ndarray, offset: int, n_total: int, max_bin: int, seed: int) -> _Cuts:
    """Cut points from a sample of rows picked by global row number (Note
    [exact histograms]): the same cuts for any split of the rows."""
    fraction = min(1.0, _SKETCH_ROWS / max(n_total, 1))
    rows = np.arange(offset, offset + X.shape[0], dtype=np.uint64)
    u = (splitmix64(rows ^ np.uint64(0x5EED + seed)) >> np.uint64(11)) * 2.0 ** -53
    sample = rabit.allgather(np.ascontiguousarray(X[u < fraction]))
    edges = []
    for f in range(X.shape[1]):
        v = np.sort(sample[:, f][~np.isnan(sample[:, f])])
        if v.size == 0:
            edges.append(np.empty(0))
            continue
        unique = np.unique(v)
        value_bins = max_bin - 1           # the last bin is for missing values
        if unique.size <= value_bins:
            cut = unique[1:]
        else:
            cut = np.unique(v[(np.arange(1, value_bins) * v.size) // value_bins])
            cut = cut[cut > v[0]]
        edges.append(np.ascontiguousarray(cut, dtype=np.float64))
    return _Cuts(edges, max_bin)


# ---------------------------------------------------------------- objectives
def _gradients(objective: str, margin: np.ndarray, y: np.ndarray,
               num_class: int) -> Tuple[np.ndarray, np.ndarray]:
    """(g, h), each of shape (n, trees per round)."""
    if objective == "binary:logistic":
        p = 1.0 / (1.0 + np.exp(-margin[:, 0]))
        return (p - y)[:, None], np.maximum(p * (1.0 - p), 1e-16)[:, None]
    if objective == "multi:softprob":
        p = _transform(objective, margin)
        onehot = np.zeros_like(p)
        onehot[np.arange(y.size), y.astype(np.int64)] = 1.0
        return p - onehot, np.maximum(2.0 * p * (1.0 - p), 1e-16)
    return (margin[:, 0] - y)[:, None], np.ones((y.size, 1))


def _metric(name: str, objective: str, margin: np.ndarray, y: np.ndarray) -> float:
    pred = _transform(objective, margin)
    if name == "rmse":
        return float(np.sqrt(np.mean((pred - y) ** 2)))
    if name == "logloss":
        p = np.clip(pred, 1e-15, 1 - 1e-15)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    if name == "error":
        return float(np.mean((pred > 0.5) != (y > 0.5)))
    if name == "mlogloss":
        p = np.clip(pred[np.arange(y.size), y.astype(np.int64)], 1e-15, 1.0)
        return float(-np.mean(np.log(p)))
    if name == "merror":
        return float(np.mean(np.argmax(pred, axis=1) != y))
    return _auc(pred if pred.ndim == 1 else pred[:, 1], y)


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve, ties counted half (rank statistic)."""
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2.0, counts)
    positives = y[order] > 0.5
    n_pos = int(positives.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# ---------------------------------------------------------------- growing trees
class _Grower:
    """Grows one tree per call from quantized gradients of this rank's rows."""

    def __init__(self, bins: np.ndarray, cuts: _Cuts, params: Dict[str, Any],
                 kernels: Any) -> None:
        self.bins = bins            # in the kernels' layout
        self.kernels = kernels
        self.n_rows = bins.shape[1] if kernels.name == "numpy" else bins.shape[0]
        self.cuts = cuts
        self.lam = float(params["lambda"])
        self.gamma = float(params["gamma"])
        self.mcw = float(params["min_child_weight"])
        self.depth = int(params["max_depth"])
        self.eta = float(params["eta"])
        n_edges = cuts.n_edges
        # valid[f, b]: splitting feature f after bin b leaves both sides
        # non-empty-able. Feature f has value bins 0..n_edges[f]; the split
        # after the last of them sends every value left and the missing
        # values right (Note [missing-only child]).
        self.valid = np.arange(cuts.width - 1)[None, :] <= n_edges[:, None]

    def grow(self, gq: np.ndarray, hq: np.ndarray, scale_g: float, scale_h: float,
             rows: Optional[np.ndarray], features: np.ndarray
             ) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
        """One tree. ``rows``: the sampled local rows (None = all).

        Returns the tree and the leaf of every sampled row (-1 elsewhere)."""
        n = self.n_rows
        node_of_row = np.full(n, -1, dtype=np.int32)
        node_of_row[rows if rows is not None else slice(None)] = 0
        tree = {k: [] for k in _TREE_DTYPES}
        self._add_node(tree)
        # Root histogram over the sampled rows.
        hist = self._histograms(node_of_row, np.array([0]), gq, hq, features)  # (2,1,F',B)
        frontier = np.array([0])
        totals = hist[:, :, 0, :].sum(axis=2)                       # (2, S): exact integers
        for depth in range(self.depth):
            if frontier.size == 0:
                break
            G, H = hist[0] / scale_g, hist[1] / scale_h              # (S, F', B)
            Gt, Ht = totals[0] / scale_g, totals[1] / scale_h
            best = self._shared_best_splits(G, H, Gt, Ht, features)
            split_nodes, small_children, large_children, parents_hist, children_totals = \
                [], [], [], [], []
            for i, node in enumerate(frontier):
                gain, f_local, b, default_left = best[i]
                if not (gain > _EPS and gain >= self.gamma):
                    tree["value"][node] = self._leaf(Gt[i], Ht[i])
                    continue
                f = int(features[f_local])
                left, right = self._add_node(tree), self._add_node(tree)
                tree["feature"][node], tree["bin"][node] = f, b
                edges = self.cuts.edges[f]
                tree["threshold"][node] = edges[b] if b < edges.size else np.inf
                tree["default_left"][node] = default_left
                tree["left"][node], tree["right"][node] = left, right
                split_nodes.append(node)
                # Children's exact integer totals, from the parent's histogram.
                q_left = self._left_totals(hist[:, i, f_local], b, default_left)
                q_right = totals[:, i] - q_left
                if depth == self.depth - 1:
                    tree["value"][left] = self._leaf(q_left[0] / scale_g, q_left[1] / scale_h)
                    tree["value"][right] = self._leaf(q_right[0] / scale_g,
                                                      q_right[1] / scale_h)
                    continue
                small_is_left = q_left[1] <= q_right[1]
                small, large = (left, right) if small_is_left else (right, left)
                small_children.append(small)
                large_children.append(large)
                parents_hist.append(i)
                children_totals.append((q_left, q_right) if small_is_left else (q_right, q_left))
            if split_nodes:
                self._route(node_of_row, tree, np.array(split_nodes))
            if not small_children:
                break
            small_hist = self._histograms(node_of_row, np.array(small_children), gq, hq,
                                          features)
            large_hist = hist[:, parents_hist] - small_hist
            frontier = np.array(small_children + large_children)
            hist = np.concatenate([small_hist, large_hist], axis=1)
            totals = np.array([t[0] for t in children_totals] + [t[1] for t in children_totals]).T
        return {k: np.asarray(v, dtype=_TREE_DTYPES[k]) for k, v in tree.items()}, node_of_row

    @staticmethod
    def _add_node(tree: Dict[str, list]) -> int:
        for key, default in (("feature", -1), ("bin", -1), ("threshold", 0.0),
                             ("default_left", False), ("left", -1), ("right", -1),
                             ("value", 0.0)):
            tree[key].append(default)
        return len(tree["left"]) - 1

    def _leaf(self, G: float, H: float) -> float:
        return float(-G / (H + self.lam) * self.eta)

    def _left_totals(self, hist_f: np.ndarray, b: int, default_left: bool) -> np.ndarray:
        """(2,) exact totals of the rows going left: bins <= b, plus missing."""
        left = hist_f[:, :b + 1].sum(axis=1)
        if default_left:
            left = left + hist_f[:, -1]
        return left

    def _histograms(self, node_of_row: np.ndarray, nodes: np.ndarray, gq: np.ndarray,
                    hq: np.ndarray, features: np.ndarray) -> np.ndarray:
        """Histograms (2, len(nodes), len(features), width) summed over ranks."""
        lookup = np.full(max(int(node_of_row.max()), int(nodes.max())) + 1, -1, dtype=np.int64)
        lookup[nodes] = np.arange(nodes.size)
        out = self.kernels.histograms(self.bins, node_of_row, lookup, nodes.size, gq, hq,
                                      features, self.cuts.width)
        rabit.allreduce(out, rabit.Op.SUM)
        return np.moveaxis(out, 3, 0)

    def _shared_best_splits(self, G: np.ndarray, H: np.ndarray, Gt: np.ndarray,
                            Ht: np.ndarray, features: np.ndarray) -> List[tuple]:
        """:meth:`_best_splits` of every node, the nodes dealt out over the
        ranks and the answers gathered (a pure function of the summed
        histograms, so whoever computes a node gets the same split)."""
        size, rank, n = rabit.get_world_size(), rabit.get_rank(), G.shape[0]
        if size == 1 or n < size:
            return self._best_splits(G, H, Gt, Ht, features)
        mine = np.arange(rank, n, size)
        part = self._best_splits(G[mine], H[mine], Gt[mine], Ht[mine], features)
        gathered = rabit.allgather(np.array(part, dtype=np.float64).reshape(-1, 4))
        order = np.concatenate([np.arange(r, n, size) for r in range(size)])
        best: List[tuple] = [()] * n
        for node, (gain, f_local, b, default_left) in zip(order, gathered):
            best[node] = (float(gain), int(f_local), int(b), bool(default_left))
        return best

    def _best_splits(self, G: np.ndarray, H: np.ndarray, Gt: np.ndarray, Ht: np.ndarray,
                     features: np.ndarray) -> List[tuple]:
        """Per node: (gain, local feature index, bin, default_left)."""
        return self.kernels.best_splits(G, H, Gt, Ht, self.valid[features], self.lam, self.mcw)

    def _route(self, node_of_row: np.ndarray, tree: Dict[str, list],
               split_nodes: np.ndarray) -> None:
        """Move the rows of the nodes just split to their children."""
        is_split = np.zeros(len(tree["left"]), dtype=np.bool_)
        is_split[split_nodes] = True
        arrays = {k: np.asarray(v, dtype=_TREE_DTYPES[k]) for k, v in tree.items()}
        self.kernels.route(self.bins, node_of_row, is_split, arrays, self.cuts.missing)


# ---------------------------------------------------------------- training
def train(params: Dict[str, Any], X: np.ndarray, y: np.ndarray, num_boost_round: int = 10,
          evals: Sequence[Tuple[np.ndarray, np.ndarray, str]] = (),
          early_stopping_rounds: Optional[int] = None, verbose_eval: bool = True) -> Booster:
    """Train a boosted model on the rows of all ranks (``X``, ``y``: this
    rank's shard, rows in global order by rank).

    Args:
        params: XGBoost-style parameters: ``objective`` (``binary:logistic``,
            ``reg:squarederror``, ``multi:softprob`` with ``num_class``),
            ``eta``, ``max_depth``, ``min_child_weight``, ``lambda``,
            ``gamma``, ``max_bin``, ``subsample``, ``colsample_bytree``,
            ``seed``, ``eval_metric``, ``base_score``; and ``hist_kernel``
            (``"auto"``: compiled with numba when installed, else NumPy; the
            model is the same either way).
        X, y: this rank's rows; NaN in ``X`` is a missing value.
        num_boost_round: rounds to train (the job resumes after the last
            checkpointed round when restarted or recovered).
        evals: ``(X, y, name)`` validation shards; metrics are printed per
            round on rank 0 and kept in ``booster.evals_result``.
        early_stopping_rounds: stop when the last ``evals`` entry's first
            metric has not improved for this many rounds.
        verbose_eval: progress bar and per-round metrics on rank 0.

    Returns:
        The same :class:`Booster` on every rank.

    Raises:
        ValueError: bad parameters (before any communication).
        DataError: on every rank, when any rank's data is bad.
    """
    params = _normalize(params)
    # The kernel changes speed, not the model: keep it out of the saved parameters.
    hist_kernel = str(params.pop("hist_kernel"))
    get_kernels(hist_kernel)
    if num_boost_round < 0:
        raise ValueError(f"num_boost_round={num_boost_round} must be >= 0")
    if early_stopping_rounds is not None and not evals:
        raise ValueError("early_stopping_rounds needs at least one entry in evals")
    ensure_init()
    objective = params["objective"]
    k = int(params["num_class"]) if objective == "multi:softprob" else 1
    kind = {"binary:logistic": "binary", "multi:softprob": "multiclass"}.get(objective,
                                                                             "regression")
    X = check_features(X, allow_nan=True)
    y = check_labels(y, X.shape[0], kind, k)
    agree("this rank's shard is empty" if X.shape[0] == 0 else None)
    checked_evals = []
    for i, (Xe, ye, name) in enumerate(evals):
        Xe = check_features(Xe, allow_nan=True, what=f"evals[{i}] X")
        checked_evals.append((Xe, check_labels(ye, Xe.shape[0], kind, k), str(name)))
    offset, n_total = global_offset(X.shape[0])
    seed = int(params["seed"])

    # Start-up collectives (before load_checkpoint: a replacement replays them).
    cuts = _sketch(X, offset, n_total, int(params["max_bin"]), seed)
    if params["base_score"] is None:
        mean = exact_sum(y) / n_total
        params["base_score"] = (float(np.log(np.clip(mean, 1e-6, 1 - 1e-6) /
                                             (1 - np.clip(mean, 1e-6, 1 - 1e-6))))
                                if objective == "binary:logistic" else
                                (0.5 if objective == "multi:softprob" else mean))
    kernels = get_kernels(hist_kernel)
    bins = cuts.bin(X, kernels)
    eval_bins = [cuts.bin(Xe, kernels) for Xe, _, _ in checked_evals]
    grower = _Grower(bins, cuts, params, kernels)

    resume_key = [json.dumps(params, sort_keys=True), X.shape[1], n_total, num_boost_round,
                  early_stopping_rounds, [Xe.shape[1] for Xe, _, _ in checked_evals],
                  data_fingerprint(X, y, *(a for Xe, ye, _ in checked_evals for a in (Xe, ye)))]
    state = resume_state("gbdt", resume_key)
    booster = Booster.from_dict(state["model"]) if state is not None else \
        Booster(params, float(params["base_score"]), X.shape[1])
    margin = np.full((X.shape[0], k), booster.base_score)
    eval_margins = [np.full((Xe.shape[0], k), booster.base_score) for Xe, _, _ in checked_evals]
    for i, tree in enumerate(booster.trees):          # resume: replay the finished rounds
        margin[:, i % k] += kernels.leaf_values(bins, tree, cuts.missing)
        for em, eb in zip(eval_margins, eval_bins):
            em[:, i % k] += kernels.leaf_values(eb, tree, cuts.missing)

    n_features = X.shape[1]
    n_cols = max(1, int(round(float(params["colsample_bytree"]) * n_features)))
    subsample = float(params["subsample"])
    row_ids = np.arange(offset, offset + X.shape[0], dtype=np.uint64)
    bits = 52 - math.ceil(math.log2(n_total + 1))
    stop_at = num_boost_round
    start = booster.num_boosted_rounds()
    if booster.best_iteration is not None and early_stopping_rounds is not None and \
            start - booster.best_iteration > early_stopping_rounds:
        stop_at = start
    bar = progress(range(start, stop_at), stop_at - start, "gbdt", verbose_eval)
    for rnd in bar:
        g_all, h_all = _gradients(objective, margin, y, k)
        rows = None
        if subsample < 1.0:
            draw = splitmix64(np.array([seed * 1_000_003 + rnd], dtype=np.uint64))[0]
            u = (splitmix64(row_ids ^ draw) >> np.uint64(11)) * 2.0 ** -53
            rows = np.flatnonzero(u < subsample)
        features = np.arange(n_features)
        if n_cols < n_features:
            rng = np.random.default_rng([seed, rnd])
            features = np.sort(rng.choice(n_features, n_cols, replace=False))
        top = np.array([np.abs(g_all).max(axis=0), h_all.max(axis=0)]).ravel()
        rabit.allreduce(top, rabit.Op.MAX)
        for c in range(k):
            scale_g = math.ldexp(1.0, bits) / max(top[c], 1e-300)
            scale_h = math.ldexp(1.0, bits) / max(top[k + c], 1e-300)
            gq = np.rint(g_all[:, c] * scale_g)
            hq = np.rint(h_all[:, c] * scale_h)
            tree, leaf = grower.grow(gq, hq, scale_g, scale_h, rows, features)
            booster.trees.append(tree)
            if rows is None:
                margin[:, c] += tree["value"][leaf]
            else:
                margin[:, c] += kernels.leaf_values(bins, tree, cuts.missing)
            for em, eb in zip(eval_margins, eval_bins):
                em[:, c] += kernels.leaf_values(eb, tree, cuts.missing)
        stop = _evaluate(booster, rnd, checked_evals, eval_margins, params, objective,
                         early_stopping_rounds, verbose_eval, bar)
        # Serialized only if a failure needs it (the snapshot is never changed).
        rabit.lazy_checkpoint({"trainer": "gbdt", "key": state_key(resume_key),
                               "model": booster.snapshot()})
        if stop:
            break
    return booster


def _evaluate(booster: Booster, rnd: int, evals: list, margins: list, params: Dict[str, Any],
              objective: str, early_stopping_rounds: Optional[int], verbose: bool,
              bar: Any) -> bool:
    """Metrics of the round on the whole validation sets (gathered in global
    row order, so the same on every rank for any split); True to stop."""
    if not evals:
        return False
    line = [f"[{rnd}]"]
    for (_, ye, name), em in zip(evals, margins):
        both = rabit.allgather(np.column_stack([em, ye]))
        for metric in params["eval_metric"]:
            value = _metric(metric, objective, both[:, :-1], both[:, -1])
            booster.evals_result.setdefault(name, {}).setdefault(metric, []).append(value)
            line.append(f"{name}-{metric}:{value:.5f}")
    if verbose and rabit.get_rank() == 0:
        text = "\t".join(line)
        (bar.write if hasattr(bar, "write") else print)(text)
    if early_stopping_rounds is None:
        return False
    name = evals[-1][2]
    metric = params["eval_metric"][0]
    history = booster.evals_result[name][metric]
    better = max if metric == "auc" else min
    best = better(history)
    best_round = history.index(best)
    booster.best_iteration, booster.best_score = best_round, best
    return rnd - best_round >= early_stopping_rounds


# ---------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m trainers.gbdt --train data.npy --out model.json ...``"""
    parser = cli_parser("rabit-gbdt", __doc__)
    parser.add_argument("--train", required=True, help="training data (this rank's shard is "
                        "read; .npy/.npz/.csv/libsvm, or a pattern with {rank})")
    parser.add_argument("--valid", help="validation data, same format (default: none)")
    parser.add_argument("--label-column", type=int, default=0, help="column of the label")
    parser.add_argument("--rounds", type=int, default=10, help="boosting rounds")
    parser.add_argument("--early-stopping-rounds", type=int,
                        help="stop after this many rounds without improvement on --valid "
                             "(default: never)")
    parser.add_argument("--out", help="write the model here (rank 0; default: not written)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or log")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter, e.g. --param objective=binary:logistic "
                             "--param max_depth=6 (repeatable)")
    args = parser.parse_args(argv)
    params: Dict[str, Any] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--param {item!r}: expected KEY=VALUE")
        params[key] = _parse_value(value)
    with rabit.session():
        X, y = load_shard(args.train, args.label_column)
        evals = []
        if args.valid:
            Xv, yv = load_shard(args.valid, args.label_column)
            evals.append((Xv, yv, "valid"))
        start = time.perf_counter()
        booster = train(params, X, y, args.rounds, evals, args.early_stopping_rounds,
                        verbose_eval=not args.quiet)
        if rabit.get_rank() == 0:
            print(f"trained {booster.num_boosted_rounds()} rounds on "
                  f"{rabit.get_world_size()} rank(s) in {time.perf_counter() - start:.2f} s",
                  flush=True)
            if args.out:
                booster.save_model(args.out)
                print(f"model written to {args.out}", flush=True)
    return 0


def _parse_value(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


if __name__ == "__main__":
    sys.exit(main())
