"""What the trainers' scikit-learn estimators share: input checked by
scikit-learn's own rules, with every rank agreeing, and the global classes.

The estimators are scikit-learn estimators (``BaseEstimator`` and the right
mixins; settings stored as given by the constructor and checked by ``fit``;
fitted attributes ending in ``_``), whose ``fit`` runs across every rank of
the job and whose predictions need no MPI.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import validate_data

import rabit_py as rabit

from ._common import DataError, agree

__all__ = ["checked", "global_classes"]


def checked(estimator: Any, X: Any, y: Any = "no_validation", reset: bool = True,
            classification: bool = False,
            allow_nan: bool = False) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(X, y) checked by ``sklearn.utils.validation.validate_data`` on every
    rank. A rank whose input is bad raises scikit-learn's own error (its own
    type); the other ranks raise :class:`DataError` naming that rank, so no
    rank is left waiting in a collective. ``y`` left out: ``X`` alone (an
    unsupervised estimator); ``y=None`` for a supervised one is an error.
    ``allow_nan``: NaN in ``X`` is a missing value, not an error.

    Raises:
        TypeError, ValueError: this rank's input is bad.
        DataError: another rank's input is bad.
    """
    error: Optional[Exception] = None
    try:
        finite = "allow-nan" if allow_nan else True
        if isinstance(y, str) and y == "no_validation":
            X, y = validate_data(estimator, X, reset=reset, dtype=np.float64, order="C",
                                 ensure_all_finite=finite), None
        else:
            X, y = validate_data(estimator, X, y, reset=reset, dtype=np.float64, order="C",
                                 ensure_all_finite=finite)
            if classification:
                check_classification_targets(y)
    except (TypeError, ValueError) as exc:
        error = exc
    try:
        agree(None if error is None else str(error))
    except DataError:
        if error is not None:
            raise error
        raise
    return X, y


def global_classes(y: np.ndarray) -> np.ndarray:
    """The sorted labels found on any rank (labels of any type)."""
    mine = np.unique(y)
    found: List[Any] = []
    for rank in range(rabit.get_world_size()):
        # As a list: an object broadcast (labels may be strings).
        found.extend(rabit.broadcast(mine.tolist() if rabit.get_rank() == rank else None, rank))
    return np.unique(np.asarray(found, dtype=mine.dtype))
