"""Loading this rank's shard of the training data, and checking it.

Each rank reads only its own rows: either one file per rank (a path with
``{rank}`` in it, e.g. ``part-{rank}.svm``) or a consecutive row range of one
shared file (rank r of w gets rows ``[n*r//w, n*(r+1)//w)``), so that the
global row order is the same for any number of ranks.

Formats, by extension: ``.npy`` (2-D; the label is column ``label_column``,
read memory-mapped so a rank touches only its rows), ``.npz`` (arrays ``X``
and ``y``), ``.csv`` (numeric, optional header line, label column), and
libsvm/svmlight (``.svm``, ``.libsvm``, ``.svmlight``, ``.txt``; via
scikit-learn). Bad data raises :class:`~trainers._common.DataError` on every
rank at once.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np

import rabit_py as rabit

from ._common import DataError, agree, ensure_init

__all__ = ["load_shard", "shard_range", "check_features", "check_labels", "DataError",
           "make_higgs_like", "make_blobs"]

_LIBSVM = (".svm", ".libsvm", ".svmlight", ".txt")


def shard_range(n_rows: int, rank: int, world: int) -> Tuple[int, int]:
    """The rows ``[start, stop)`` of a file of ``n_rows`` that rank ``rank`` of
    ``world`` reads."""
    return n_rows * rank // world, n_rows * (rank + 1) // world


def load_shard(path: str, label_column: Optional[int] = 0, fmt: Optional[str] = None,
               n_features: Optional[int] = None) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Read this rank's rows of ``path``.

    Args:
        path: a file shared by all ranks, or a pattern with ``{rank}``.
        label_column: the column holding the label (``.npy``/``.csv``), or
            None for unlabelled data.
        fmt: ``"npy"``, ``"npz"``, ``"csv"`` or ``"libsvm"``; by default from
            the extension.
        n_features: libsvm only: the number of features (by default the
            largest feature index seen on any rank).

    Returns:
        ``(X, y)``: float64 features (C order) and labels (None without labels).

    Raises:
        DataError: on every rank, when any rank's file is missing, unreadable,
            ragged, or its shard is empty.
    """
    ensure_init()
    rank, world = rabit.get_rank(), rabit.get_world_size()
    per_rank = "{rank}" in path
    file = path.format(rank=rank) if per_rank else path
    kind = fmt or _format_of(file)
    X: Optional[np.ndarray] = None
    y: Optional[np.ndarray] = None
    problem: Optional[str] = None
    try:
        X, y = _read(file, kind, label_column, None if per_rank else (rank, world))
        if X.shape[0] == 0:
            problem = f"{file}: this rank's shard is empty"
    except (OSError, ValueError, KeyError, IndexError) as exc:
        problem = f"cannot read {file} as {kind}: {exc}"
    agree(problem)
    assert X is not None
    if kind == "libsvm":
        width = rabit.allreduce(np.array([n_features or X.shape[1]], dtype=np.int64),
                                rabit.Op.MAX)[0]
        if X.shape[1] < width:
            X = np.hstack([X, np.zeros((X.shape[0], int(width) - X.shape[1]))])
    return np.ascontiguousarray(X, dtype=np.float64), y


def _format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in (".npy", ".npz", ".csv"):
        return ext[1:]
    if ext in _LIBSVM:
        return "libsvm"
    raise DataError(f"{path}: unknown data format {ext!r}; pass fmt='npy', 'npz', 'csv' "
                    f"or 'libsvm'")


def _read(file: str, kind: str, label_column: Optional[int],
          shard: Optional[Tuple[int, int]]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    def rows(n: int) -> slice:
        return slice(*shard_range(n, *shard)) if shard else slice(0, n)

    if kind == "npz":
        with np.load(file) as archive:
            X = archive["X"]
            y = archive["y"] if "y" in archive else None
            part = rows(X.shape[0])
            return np.array(X[part], dtype=np.float64), (None if y is None else
                                                         np.array(y[part], dtype=np.float64))
    if kind == "npy":
        table = np.load(file, mmap_mode="r")
        if table.ndim != 2:
            raise ValueError(f"expected a 2-D array, got shape {table.shape}")
        table = np.array(table[rows(table.shape[0])], dtype=np.float64)
    elif kind == "csv":
        table = _read_csv(file)
        table = table[rows(table.shape[0])]
    elif kind == "libsvm":
        from sklearn.datasets import load_svmlight_file

        X_sparse, y = load_svmlight_file(file)
        part = rows(X_sparse.shape[0])
        return X_sparse[part].toarray(), y[part].astype(np.float64)
    else:
        raise ValueError(f"unknown format {kind!r}")
    if label_column is None:
        return table, None
    label = label_column % table.shape[1]
    return np.delete(table, label, axis=1), table[:, label].copy()


def _read_csv(file: str) -> np.ndarray:
    with open(file) as f:
        first = f.readline()
    try:
        [float(v) for v in first.split(",")]
        skip = 0
    except ValueError:
        skip = 1        # a header line
    table = np.loadtxt(file, delimiter=",", skiprows=skip, ndmin=2, dtype=np.float64)
    return table


def check_features(X: np.ndarray, allow_nan: bool, what: str = "X") -> np.ndarray:
    """``X`` as a C-ordered float64 2-D array, with every rank agreeing that it
    is usable (same number of columns everywhere; no inf; no NaN unless
    ``allow_nan``).

    Raises:
        DataError: on every rank, if any rank's ``X`` is bad.
    """
    problem: Optional[str] = None
    try:
        X = np.ascontiguousarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        problem = f"{what} is not a numeric array: {exc}"
    if problem is None and X.ndim != 2:
        problem = f"{what} must be 2-D (rows x features), got shape {X.shape}"
    elif problem is None and np.isinf(X).any():
        problem = f"{what} has infinite values"
    elif problem is None and not allow_nan and np.isnan(X).any():
        row = int(np.flatnonzero(np.isnan(X).any(axis=1))[0])
        problem = f"{what} has NaN (first in local row {row}); this trainer needs complete rows"
    agree(problem)
    widths = rabit.allgather(np.array([X.shape[1]], dtype=np.int64))
    if (widths != widths[0]).any():
        raise DataError(f"ranks hold different numbers of features: "
                        f"{dict(enumerate(widths.tolist()))}")
    return X


def check_labels(y: np.ndarray, n_rows: int, kind: str, num_class: int = 0) -> np.ndarray:
    """Labels as float64, checked on every rank for ``kind``: ``"binary"``
    (0 or 1), ``"multiclass"`` (integers in ``[0, num_class)``) or
    ``"regression"`` (finite numbers).

    Raises:
        DataError: on every rank, if any rank's labels are bad.
    """
    problem: Optional[str] = None
    y = np.asarray(y, dtype=np.float64).ravel() if y is not None else np.empty(0)
    if y.shape[0] != n_rows:
        problem = f"{y.shape[0]} labels for {n_rows} rows"
    elif not np.isfinite(y).all():
        problem = "labels contain NaN or infinity"
    elif kind == "binary" and not np.isin(y, (0.0, 1.0)).all():
        bad = y[~np.isin(y, (0.0, 1.0))][:3]
        problem = f"binary labels must be 0 or 1, found {bad.tolist()}"
    elif kind == "multiclass" and ((y != np.rint(y)).any() or (y < 0).any()
                                   or (y >= num_class).any()):
        problem = f"class labels must be integers in [0, {num_class})"
    agree(problem)
    return y


def make_higgs_like(n_rows: int, seed: int = 0, start: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Rows ``[start, start + n_rows)`` of a seeded HIGGS-like binary task:
    28 dense features (21 "low-level" skewed momenta and angles, 7 "high-level"
    nonlinear combinations), labels from a nonlinear logistic model. Row i is
    the same whatever range it is generated in, so ranks can generate their
    own shards."""
    X = np.empty((n_rows, 28))
    y = np.empty(n_rows)
    block = 65536
    first = start // block
    for b in range(first, (start + n_rows + block - 1) // block):
        rng = np.random.default_rng([seed, b])
        base = rng.standard_normal((block, 21))
        noise = rng.standard_normal(block)
        u = rng.random(block)
        lo, hi = max(start, b * block), min(start + n_rows, (b + 1) * block)
        sel = slice(lo - b * block, hi - b * block)
        out = slice(lo - start, hi - start)
        low = base[sel].copy()
        low[:, ::3] = np.exp(0.5 * low[:, ::3])                 # positive, skewed momenta
        low[:, 1::3] = np.tanh(low[:, 1::3]) * 2.5              # pseudorapidities
        high = np.stack([
            np.sqrt(low[:, 0] * low[:, 3] + 0.1),
            np.abs(low[:, 6] - low[:, 9]),
            low[:, 0] + low[:, 3] + low[:, 6],
            np.cos(low[:, 2] - low[:, 5]),
            low[:, 12] * np.cosh(low[:, 1] / 2.5),
            np.log1p(low[:, 15] * low[:, 18]),
            low[:, 4] * low[:, 7] - low[:, 10],
        ], axis=1)
        X[out, :21], X[out, 21:] = low, high
        logit = (1.2 * (high[:, 0] - 1.3) - 0.8 * high[:, 1] + 0.6 * high[:, 3]
                 + 0.5 * np.sin(2.0 * low[:, 4]) + 0.4 * (low[:, 13] > 0.3)
                 - 0.3 * high[:, 6] + 0.25 * noise[sel])
        y[out] = (u[sel] < 1.0 / (1.0 + np.exp(-logit))).astype(np.float64)
    return X, y


def make_blobs(n_rows: int, n_clusters: int = 8, n_features: int = 10, seed: int = 0,
               start: int = 0) -> np.ndarray:
    """Rows ``[start, start + n_rows)`` of seeded Gaussian blobs for k-means
    (row i is the same whatever range it is generated in)."""
    centers = np.random.default_rng(seed).normal(scale=5.0, size=(n_clusters, n_features))
    X = np.empty((n_rows, n_features))
    block = 65536
    for b in range(start // block, (start + n_rows + block - 1) // block):
        rng = np.random.default_rng([seed, 1, b])
        label = rng.integers(0, n_clusters, size=block)
        points = centers[label] + rng.standard_normal((block, n_features))
        lo, hi = max(start, b * block), min(start + n_rows, (b + 1) * block)
        X[lo - start:hi - start] = points[lo - b * block:hi - b * block]
    return X
