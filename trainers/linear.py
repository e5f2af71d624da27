"""Distributed L2-regularized logistic regression, optimized by L-BFGS.

Every rank holds a shard of rows. The objective and its gradient are sums
over rows, so each evaluation is one ``allreduce`` of ``[loss, gradient]``;
every rank then takes the same L-BFGS step. The optimizer state (weights,
curvature pairs) is the global checkpoint after each iteration, so a
replaced worker resumes at the last iteration.

Objective (scikit-learn's, up to a constant factor)::

    C * sum_i log(1 + exp(-s_i * (x_i . w + b))) + 0.5 * ||w||^2,   s_i = 2 y_i - 1
"""

from __future__ import annotations

import json
import numbers
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

import rabit_py as rabit

from ._common import cli_parser
from ._common import DataError, data_fingerprint, ensure_init, progress, resume_state, state_key
from ._sklearn import checked, global_classes
from .data import check_features, load_shard

__all__ = ["LogisticRegression", "DataError", "main"]


def _log1pexp(z: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, z)


class LogisticRegression(ClassifierMixin, BaseEstimator):
    """Binary logistic regression with an L2 penalty, fitted across all ranks;
    a scikit-learn classifier (two classes, of any label type).

    Args:
        C: inverse regularization strength (as in scikit-learn).
        max_iter: L-BFGS iterations at most.
        tol: stop when the largest gradient component is below
            ``tol * max(1, C * rows)`` or the objective stops decreasing
            (relative change below ``tol * 1e-4``).
        fit_intercept: learn an unpenalized intercept.
        memory: L-BFGS curvature pairs kept.
        verbose: progress bar on rank 0.

    After :meth:`fit`: ``classes_`` (the two labels; ``coef_`` is for the
    second), ``coef_`` (1, n_features), ``intercept_`` (1,), ``objective_``
    (final objective value), ``n_iter_``, ``n_features_in_``. As
    scikit-learn asks, the constructor only stores the settings; :meth:`fit`
    checks them.
    """

    def __init__(self, C: float = 1.0, max_iter: int = 100, tol: float = 1e-8,
                 fit_intercept: bool = True, memory: int = 10, verbose: bool = False) -> None:
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.fit_intercept = fit_intercept
        self.memory = memory
        self.verbose = verbose

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags

    def _check_settings(self) -> None:
        if not isinstance(self.C, numbers.Real) or not self.C > 0:
            raise ValueError(f"C={self.C!r} must be a number > 0")
        if not isinstance(self.max_iter, numbers.Integral) or self.max_iter < 0:
            raise ValueError(f"max_iter={self.max_iter!r} must be an integer >= 0")
        if not isinstance(self.memory, numbers.Integral) or self.memory < 1:
            raise ValueError(f"memory={self.memory!r} must be an integer >= 1")
        if not isinstance(self.tol, numbers.Real) or self.tol < 0:
            raise ValueError(f"tol={self.tol!r} must be a number >= 0")

    # ------------------------------------------------------------ fitting
    def fit(self, X: Any, y: Any) -> "LogisticRegression":
        """Fit on the rows of all ranks (``X``, ``y``: this rank's shard; two
        classes over all ranks, of any label type).

        Raises:
            ValueError: bad settings, or not exactly two classes.
            DataError: on every rank, when any rank's data is bad.
        """
        ensure_init()
        self._check_settings()
        X, y = checked(self, X, y, classification=True)
        X = check_features(X, allow_nan=False)
        classes = global_classes(y)
        if len(classes) > 2:
            raise DataError(f"Only binary classification is supported: the data of all ranks "
                            f"has {len(classes)} classes ({classes[:5].tolist()}...)")
        if len(classes) < 2:
            raise DataError(f"the data of all ranks has one class only ({classes.tolist()}); "
                            f"a classifier needs two")
        self.classes_ = classes
        y = (y == classes[1]).astype(np.float64)
        C, tol, memory = float(self.C), float(self.tol), int(self.memory)
        n_total = int(rabit.allreduce(np.array([X.shape[0]], dtype=np.int64), rabit.Op.SUM)[0])
        if n_total == 0:
            raise DataError("no rows on any rank")
        signs = 2.0 * y - 1.0
        d = X.shape[1] + (1 if self.fit_intercept else 0)

        def evaluate(w: np.ndarray) -> Tuple[float, np.ndarray]:
            coef, b = w[:X.shape[1]], (w[-1] if self.fit_intercept else 0.0)
            z = X @ coef + b
            buf = np.empty(d + 1)
            buf[0] = _log1pexp(-signs * z).sum()
            r = -signs * (1.0 / (1.0 + np.exp(signs * z)))          # d loss / d z
            buf[1:X.shape[1] + 1] = X.T @ r
            if self.fit_intercept:
                buf[-1] = r.sum()
            rabit.allreduce(buf, rabit.Op.SUM)
            f = C * buf[0] + 0.5 * coef @ coef
            g = C * buf[1:]
            g[:X.shape[1]] += coef
            return float(f), g

        key = [X.shape[1], n_total, C, bool(self.fit_intercept), memory, tol,
               data_fingerprint(X, y)]
        state = resume_state("logistic", key)
        if state is None:
            w = np.zeros(d)
            f, g = evaluate(w)
            state = {"trainer": "logistic", "key": state_key(key), "w": w, "f": f, "g": g, "s": [],
                     "y": [], "iter": 0, "done": False}
        gtol = tol * max(1.0, C * n_total)
        max_iter = int(self.max_iter)
        bar = progress(range(state["iter"], max_iter), max_iter - state["iter"],
                       "logistic", self.verbose)
        for _ in bar:
            if state["done"] or np.abs(state["g"]).max() <= gtol:
                break
            state = self._step(state, evaluate)
            rabit.checkpoint(state)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(objective=f"{state['f']:.8g}")
        w = state["w"]
        self.coef_ = w[:X.shape[1]].reshape(1, -1).copy()
        self.intercept_ = np.array([w[-1] if self.fit_intercept else 0.0])
        self.objective_ = float(state["f"])
        self.n_iter_ = int(state["iter"])
        return self

    def _step(self, state: Dict[str, Any], evaluate: Any) -> Dict[str, Any]:
        """One L-BFGS iteration with a backtracking (Armijo) line search."""
        w, f, g = state["w"], state["f"], state["g"]
        direction = -self._two_loop(g, state["s"], state["y"])
        slope = float(g @ direction)
        if slope >= 0:                        # not a descent direction: restart
            direction, slope = -g, -float(g @ g)
            state = {**state, "s": [], "y": []}
        step = 1.0 if state["s"] else min(1.0, 1.0 / max(np.abs(g).sum(), 1e-12))
        for _ in range(40):
            w_new = w + step * direction
            f_new, g_new = evaluate(w_new)
            if f_new <= f + 1e-4 * step * slope:
                break
            step *= 0.5
        else:
            return {**state, "done": True}
        s, yv = w_new - w, g_new - g
        pairs_s, pairs_y = list(state["s"]), list(state["y"])
        if s @ yv > 1e-12 * (yv @ yv):
            pairs_s.append(s)
            pairs_y.append(yv)
            if len(pairs_s) > self.memory:
                pairs_s.pop(0)
                pairs_y.pop(0)
        done = (f - f_new) <= self.tol * 1e-4 * max(abs(f), abs(f_new), 1.0)
        return {**state, "w": w_new, "f": f_new, "g": g_new, "s": pairs_s, "y": pairs_y,
                "iter": state["iter"] + 1, "done": bool(done)}

    @staticmethod
    def _two_loop(g: np.ndarray, pairs_s: list, pairs_y: list) -> np.ndarray:
        q = g.copy()
        alphas = []
        for s, y in zip(reversed(pairs_s), reversed(pairs_y)):
            rho = 1.0 / (y @ s)
            a = rho * (s @ q)
            q -= a * y
            alphas.append((rho, a))
        if pairs_s:
            q *= (pairs_s[-1] @ pairs_y[-1]) / (pairs_y[-1] @ pairs_y[-1])
        for (s, y), (rho, a) in zip(zip(pairs_s, pairs_y), reversed(alphas)):
            b = rho * (y @ q)
            q += (a - b) * s
        return q

    # ------------------------------------------------------------ prediction
    def decision_function(self, X: Any) -> np.ndarray:
        """``X @ coef + intercept``: the log-odds of ``classes_[1]`` (no MPI).

        Raises:
            NotFittedError: before :meth:`fit`.
            ValueError: ``X`` is not a 2-D array of the fitted width.
        """
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return X @ self.coef_[0] + self.intercept_[0]

    def predict_proba(self, X: Any) -> np.ndarray:
        """Probabilities of ``classes_[0]`` and ``classes_[1]``, shape (n, 2)."""
        p = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: Any) -> np.ndarray:
        """Predicted labels (from ``classes_``)."""
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(np.int64)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m trainers.linear --train data.npy --out model.json``"""
    parser = cli_parser("rabit-linear", __doc__)
    parser.add_argument("--train", required=True, help="training data (see trainers.data)")
    parser.add_argument("--label-column", type=int, default=0, help="column of the label")
    parser.add_argument("--C", type=float, default=1.0,
                        help="inverse regularization strength, as scikit-learn's C")
    parser.add_argument("--max-iter", type=int, default=100, help="L-BFGS iterations at most")
    parser.add_argument("--tol", type=float, default=1e-8,
                        help="stop when the largest gradient component is below "
                             "tol * max(1, C * rows)")
    parser.add_argument("--out", help="write coefficients as JSON here (rank 0; default: not "
                        "written)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or log")
    args = parser.parse_args(argv)
    with rabit.session():
        X, y = load_shard(args.train, args.label_column)
        model = LogisticRegression(C=args.C, max_iter=args.max_iter, tol=args.tol,
                                   verbose=not args.quiet).fit(X, y)
        if rabit.get_rank() == 0:
            print(f"objective {model.objective_:.10g} after {model.n_iter_} iterations",
                  flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"coef": model.coef_.tolist(),
                               "intercept": model.intercept_.tolist(),
                               "objective": model.objective_}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
