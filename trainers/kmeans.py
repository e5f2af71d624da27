"""Distributed k-means: k-means++ seeding through the engine, then Lloyd
iterations that reduce per-cluster sums and counts with one ``allreduce``.

The centers are the global checkpoint after each iteration, so a replaced
worker resumes at the last iteration. The k-means++ draws are made on the
global row order with integer (exact) prefix sums, so the seeding picks the
same rows for any number of ranks, provided that the shards are consecutive
row ranges in rank order (rank 0 holds the first rows; what ``load_shard``
gives): the global row order is the ranks' rows one after the other, so a
round-robin split is another order and gives other seeds.
"""

from __future__ import annotations

import json
import numbers
import sys
from typing import Any, Optional, Sequence, Union

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

import rabit_py as rabit

from ._common import cli_parser
from ._common import (DataError, data_fingerprint, ensure_init, global_offset, progress,
                      resume_state, state_key)
from ._sklearn import checked
from .data import check_features, load_shard

__all__ = ["KMeans", "DataError", "main"]

_CHUNK = 65536


def _sq_distances(X: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Squared distances (n, k), clipped at 0 (rounding can make them negative)."""
    d = (X * X).sum(axis=1)[:, None] - 2.0 * X @ centers.T + (centers * centers).sum(axis=1)
    return np.maximum(d, 0.0)


def _assign(X: np.ndarray, centers: np.ndarray) -> tuple:
    """(label, squared distance to it) of every row, in chunks to bound memory."""
    labels = np.empty(X.shape[0], dtype=np.int64)
    best = np.empty(X.shape[0])
    for lo in range(0, X.shape[0], _CHUNK):
        d = _sq_distances(X[lo:lo + _CHUNK], centers)
        labels[lo:lo + _CHUNK] = d.argmin(axis=1)
        best[lo:lo + _CHUNK] = d[np.arange(d.shape[0]), labels[lo:lo + _CHUNK]]
    return labels, best


class KMeans(ClusterMixin, TransformerMixin, BaseEstimator):
    """k-means over the rows of all ranks; a scikit-learn estimator.

    Args:
        n_clusters: k.
        init: ``"k-means++"``, ``"random"`` (k distinct rows drawn on the global
            row order) or an array of initial centers (k, n_features).
        max_iter: Lloyd iterations at most.
        tol: stop when the centers move less than ``tol`` times the mean
            feature variance (squared distance, summed over centers), as
            scikit-learn does.
        seed: the seed of the initialization draws (the same on every rank).
        verbose: progress bar on rank 0.

    After :meth:`fit`: ``cluster_centers_``, ``inertia_`` (sum of squared
    distances of all rows to their center), ``n_iter_``, ``labels_`` (this
    rank's rows), ``initial_centers_`` (where the iterations started),
    ``n_features_in_``. As scikit-learn asks, the constructor only stores
    the settings; :meth:`fit` checks them.
    """

    def __init__(self, n_clusters: int = 8, init: Union[str, np.ndarray] = "k-means++",
                 max_iter: int = 100, tol: float = 1e-4, seed: int = 0,
                 verbose: bool = False) -> None:
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.seed = seed
        self.verbose = verbose

    def _check_settings(self) -> None:
        if not isinstance(self.n_clusters, numbers.Integral) or self.n_clusters < 1:
            raise ValueError(f"n_clusters={self.n_clusters!r} must be an integer >= 1")
        if isinstance(self.init, str) and self.init not in ("k-means++", "random"):
            raise ValueError(f"init={self.init!r}: use 'k-means++', 'random' or an array of "
                             f"centers")
        if not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 0:
            raise ValueError(f"max_iter={self.max_iter!r} must be an integer >= 0")
        if not isinstance(self.tol, numbers.Real) or self.tol < 0:
            raise ValueError(f"tol={self.tol!r} must be a number >= 0")

    def _validated(self, X: Any, reset: bool) -> np.ndarray:
        """``X`` checked by scikit-learn's rules, every rank agreeing."""
        return check_features(checked(self, X, reset=reset)[0], allow_nan=False)

    def fit(self, X: Any, y: Any = None) -> "KMeans":
        """Cluster the rows of all ranks (``X``: this rank's shard; ``y`` is
        ignored).

        Raises:
            ValueError: bad settings.
            DataError: on every rank, when any rank's data is bad or there are
                fewer rows than clusters.
        """
        ensure_init()
        self._check_settings()
        X = self._validated(X, reset=True)
        offset, n_total = global_offset(X.shape[0])
        k = int(self.n_clusters)
        if n_total < k:
            raise DataError(f"n_samples={n_total} should be >= n_clusters={k}")
        moments = np.concatenate([X.sum(axis=0), (X * X).sum(axis=0)])
        rabit.allreduce(moments, rabit.Op.SUM)
        mean = moments[:X.shape[1]] / n_total
        variance = np.maximum(moments[X.shape[1]:] / n_total - mean ** 2, 0.0)
        threshold = self.tol * float(variance.mean())

        key = [k, X.shape[1], n_total, int(self.seed), float(self.tol), repr(self.init),
               data_fingerprint(X)]
        state = resume_state("kmeans", key)
        if state is None:
            start = self._initial_centers(X, offset, n_total)
            state = {"trainer": "kmeans", "key": state_key(key), "iter": 0, "converged": False,
                     "centers": start, "initial_centers": start}
        bar = progress(range(state["iter"], self.max_iter), self.max_iter - state["iter"],
                       "k-means", self.verbose)
        for _ in bar:
            if state["converged"]:
                break
            centers = state["centers"]
            labels, dist = _assign(X, centers)
            buf = np.zeros((k, X.shape[1] + 1))
            for j in range(X.shape[1]):
                buf[:, j] = np.bincount(labels, weights=X[:, j], minlength=k)
            buf[:, -1] = np.bincount(labels, minlength=k)
            rabit.allreduce(buf, rabit.Op.SUM)
            counts = buf[:, -1]
            new = centers.copy()            # an empty cluster keeps its center
            filled = counts > 0
            new[filled] = buf[filled, :-1] / counts[filled, None]
            shift = float(((new - centers) ** 2).sum())
            state = {**state, "centers": new, "iter": state["iter"] + 1,
                     "converged": shift <= threshold}
            rabit.checkpoint(state)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(shift=f"{shift:.3g}")
        self.cluster_centers_ = state["centers"]
        self.initial_centers_ = state["initial_centers"]
        self.labels_, dist = _assign(X, self.cluster_centers_)
        self.inertia_ = float(rabit.allreduce(np.array([dist.sum()]), rabit.Op.SUM)[0])
        self.n_iter_ = int(state["iter"])
        return self

    def _initial_centers(self, X: np.ndarray, offset: int, n_total: int) -> np.ndarray:
        k = int(self.n_clusters)
        if not isinstance(self.init, str):
            centers = np.array(self.init, dtype=np.float64)
            if centers.shape != (k, X.shape[1]):
                raise ValueError(f"init has shape {centers.shape}; expected {(k, X.shape[1])}")
            return centers
        rng = np.random.default_rng(int(self.seed))
        if self.init == "random":
            return np.stack([self._row(X, offset, int(i))
                             for i in rng.choice(n_total, k, replace=False)])
        centers = [self._row(X, offset, int(rng.integers(n_total)))]
        closest = _sq_distances(X, centers[0][None])[:, 0]
        for _ in range(1, k):
            centers.append(self._row(X, offset, self._draw(closest, offset, n_total, rng)))
            closest = np.minimum(closest, _sq_distances(X, centers[-1][None])[:, 0])
        return np.stack(centers)

    @staticmethod
    def _row(X: np.ndarray, offset: int, index: int) -> np.ndarray:
        """Global row ``index``, from the rank that holds it, on every rank."""
        mine = offset <= index < offset + X.shape[0]
        owner = rabit.allreduce(np.array([rabit.get_rank() if mine else -1]), rabit.Op.MAX)[0]
        row = X[index - offset].copy() if mine else np.empty(X.shape[1])
        return rabit.broadcast(row, int(owner))

    @staticmethod
    def _draw(weights: np.ndarray, offset: int, n: int, rng: np.random.Generator) -> int:
        """A global row drawn with probability proportional to ``weights``,
        by exact integer prefix sums in global row order."""
        top = rabit.allreduce(np.array([weights.max() if weights.size else 0.0]),
                              rabit.Op.MAX)[0]
        if top <= 0:                        # every row sits on a center: any row will do
            return int(rng.integers(n))
        scale = 2.0 ** (62 - int(np.ceil(np.log2(n + 1))) - 1) / top
        fixed = np.floor(weights * scale).astype(np.int64)
        totals = rabit.allgather(np.array([fixed.sum()], dtype=np.int64))
        target = int(rng.integers(int(totals.sum())))
        before = int(totals[:rabit.get_rank()].sum())
        found = -1
        if before <= target < before + int(totals[rabit.get_rank()]):
            found = offset + int(np.searchsorted(np.cumsum(fixed), target - before,
                                                 side="right"))
        return int(rabit.allreduce(np.array([found], dtype=np.int64), rabit.Op.MAX)[0])

    def _local(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=np.float64, order="C")

    def predict(self, X: Any) -> np.ndarray:
        """Index of the nearest center for each row (no MPI needed).

        Raises:
            NotFittedError: before :meth:`fit`.
            ValueError: ``X`` is not a 2-D array of the fitted width.
        """
        return _assign(self._local(X), self.cluster_centers_)[0]

    def transform(self, X: Any) -> np.ndarray:
        """Distance of each row to every center, (n, n_clusters) (no MPI)."""
        return np.sqrt(_sq_distances(self._local(X), self.cluster_centers_))

    def score(self, X: Any, y: Any = None) -> float:
        """Minus the sum of squared distances of these rows to their centers
        (higher is better, as scikit-learn's KMeans; no MPI)."""
        return -float(_assign(self._local(X), self.cluster_centers_)[1].sum())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m trainers.kmeans --train blobs.npy --clusters 8 --out centers.json``"""
    parser = cli_parser("rabit-kmeans", __doc__)
    parser.add_argument("--train", required=True, help="data without labels (see trainers.data)")
    parser.add_argument("--clusters", type=int, default=8, help="number of clusters (k)")
    parser.add_argument("--max-iter", type=int, default=100, help="Lloyd iterations at most")
    parser.add_argument("--tol", type=float, default=1e-4,
                        help="stop when the centers move less than this times the mean "
                             "feature variance, as scikit-learn")
    parser.add_argument("--seed", type=int, default=0, help="seed of the k-means++ draws")
    parser.add_argument("--out", help="write the centers as JSON here (rank 0; default: not "
                        "written)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or log")
    args = parser.parse_args(argv)
    with rabit.session():
        X, _ = load_shard(args.train, label_column=None)
        model = KMeans(args.clusters, max_iter=args.max_iter, tol=args.tol, seed=args.seed,
                       verbose=not args.quiet).fit(X)
        if rabit.get_rank() == 0:
            print(f"inertia {model.inertia_:.10g} after {model.n_iter_} iterations", flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"centers": model.cluster_centers_.tolist(),
                               "inertia": model.inertia_}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
