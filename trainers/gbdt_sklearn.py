"""scikit-learn estimators over :mod:`trainers.gbdt`: ``GBDTClassifier`` and
``GBDTRegressor`` (a module of their own, so that ``rabit-gbdt`` does not
import scikit-learn).

Settings follow XGBoost's scikit-learn wrapper (``n_estimators``,
``learning_rate``, ``reg_lambda``, ``random_state``...). ``fit`` trains on the
rows of all ranks, as :func:`trainers.gbdt.train` does; NaN is a missing
value; predictions need no MPI. ``booster_`` is the trained
:class:`trainers.gbdt.Booster` (``booster_.save_model(path,
format="xgboost")`` writes it for XGBoost).
"""

from __future__ import annotations

import numbers
from typing import Any, Dict

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from . import gbdt
from ._common import DataError
from ._sklearn import checked, global_classes

__all__ = ["GBDTClassifier", "GBDTRegressor"]


class _GBDT(BaseEstimator):
    def __init__(self, n_estimators: int = 100, learning_rate: float = 0.3, max_depth: int = 6,
                 min_child_weight: float = 1.0, reg_lambda: float = 1.0, gamma: float = 0.0,
                 max_bin: int = 256, subsample: float = 1.0, colsample_bytree: float = 1.0,
                 random_state: int = 0, verbose: bool = False) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.min_child_weight = min_child_weight
        self.reg_lambda = reg_lambda
        self.gamma = gamma
        self.max_bin = max_bin
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.random_state = random_state
        self.verbose = verbose

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    def _params(self) -> Dict[str, Any]:
        if not isinstance(self.n_estimators, numbers.Integral) or self.n_estimators < 0:
            raise ValueError(f"n_estimators={self.n_estimators!r} must be an integer >= 0")
        seed = self.random_state
        if not isinstance(seed, numbers.Integral):
            # A RandomState (scikit-learn's convention) gives a fixed draw.
            seed = int(np.random.RandomState(seed).randint(2 ** 31 - 1)) if seed is not None \
                else 0
        return {"eta": self.learning_rate, "max_depth": self.max_depth,
                "min_child_weight": self.min_child_weight, "lambda": self.reg_lambda,
                "gamma": self.gamma, "max_bin": self.max_bin, "subsample": self.subsample,
                "colsample_bytree": self.colsample_bytree, "seed": int(seed)}

    def _margin_input(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return validate_data(self, X, reset=False, dtype=np.float64,
                             ensure_all_finite="allow-nan")


class GBDTRegressor(RegressorMixin, _GBDT):
    """Gradient-boosted trees for regression (``reg:squarederror``), fitted
    across all ranks; a scikit-learn regressor."""

    def fit(self, X: Any, y: Any) -> "GBDTRegressor":
        """Train on the rows of all ranks (``X``, ``y``: this rank's shard).

        Raises:
            ValueError: bad settings. DataError: bad data on some rank.
        """
        gbdt.ensure_init()
        params = {**self._params(), "objective": "reg:squarederror"}
        X, y = checked(self, X, y, allow_nan=True)
        self.booster_ = gbdt.train(params, X, y, num_boost_round=int(self.n_estimators),
                                   verbose_eval=bool(self.verbose))
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Predicted values (no MPI needed)."""
        X = self._margin_input(X)
        return self.booster_.predict(X)


class GBDTClassifier(ClassifierMixin, _GBDT):
    """Gradient-boosted trees for classification (``binary:logistic`` for two
    classes, ``multi:softprob`` for more; labels of any type), fitted across
    all ranks; a scikit-learn classifier."""

    def fit(self, X: Any, y: Any) -> "GBDTClassifier":
        """Train on the rows of all ranks (``X``, ``y``: this rank's shard).

        Raises:
            ValueError: bad settings, or one class only. DataError: bad data
                on some rank.
        """
        gbdt.ensure_init()
        params = self._params()
        X, y = checked(self, X, y, classification=True, allow_nan=True)
        classes = global_classes(y)
        if len(classes) < 2:
            raise DataError(f"the data of all ranks has one class only ({classes.tolist()}); "
                            f"a classifier needs two")
        self.classes_ = classes
        index = np.searchsorted(classes, y).astype(np.float64)
        if len(classes) == 2:
            params["objective"] = "binary:logistic"
        else:
            params.update(objective="multi:softprob", num_class=len(classes))
        self.booster_ = gbdt.train(params, X, index, num_boost_round=int(self.n_estimators),
                                   verbose_eval=bool(self.verbose))
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_`` (no MPI)."""
        X = self._margin_input(X)
        p = self.booster_.predict(X)
        return np.column_stack([1.0 - p, p]) if p.ndim == 1 else p

    def predict(self, X: Any) -> np.ndarray:
        """Most probable class of each row (from ``classes_``)."""
        best = self.predict_proba(X).argmax(axis=1)
        return self.classes_[best]
