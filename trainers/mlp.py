"""Data-parallel training of a multi-layer perceptron (NumPy), with the
gradients reduced by :class:`rabit_py.ddp.bucket.GradientBucketer` while the
backward pass is still running.

Every step takes a global batch of ``batch_size`` rows, drawn from a seeded
permutation of the global row order; each rank computes the gradient of the
rows of the batch that it holds, the layers' gradients are handed to the
bucketer as soon as the backward pass produces them (last layer first), and
every rank applies the same Adam (or SGD) update to the summed gradient. So
the model is the one a single process would train on the same global
batches, for any number of ranks (up to floating-point summation order). The
parameters and optimizer state are the global checkpoint every
``checkpoint_every`` steps.
"""

from __future__ import annotations

import json
import numbers
import sys
from typing import Any, List, Optional, Sequence

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

import rabit_py as rabit
from rabit_py.ddp.bucket import GradientBucketer

from ._common import cli_parser
from ._common import (data_fingerprint, ensure_init, global_offset, progress, resume_state,
                      state_key)
from ._common import DataError
from ._sklearn import checked, global_classes
from .data import check_features, load_shard

__all__ = ["MLPClassifier", "main"]


class MLPClassifier(ClassifierMixin, BaseEstimator):
    """Softmax classifier with ReLU hidden layers; a scikit-learn classifier.

    Args:
        hidden: sizes of the hidden layers.
        n_classes: number of classes, the labels being 0..n_classes-1; None
            (the default): the classes found in the data of all ranks, of any
            label type.
        steps: optimizer steps.
        batch_size: rows per global batch (split over the ranks by where the
            rows live).
        learning_rate: step size.
        optimizer: ``"adam"`` or ``"sgd"``.
        checkpoint_every: steps between checkpoints.
        bucket_cap_mb, first_bucket_mb: the bucketer's bucket sizes.
        seed: initial weights and batch order.
        verbose: progress bar on rank 0.
        device: ``"cpu"`` (NumPy) or ``"cuda"`` (CuPy: the same code on the
            current GPU; gradients reduced through rabit_py's device path,
            NCCL where chosen; checkpoints hold host copies).

    After :meth:`fit`: ``classes_``, ``params_`` (list of NumPy arrays: W0,
    b0, W1, b1, ...), ``loss_`` (the last batch's mean loss),
    ``n_features_in_``. As scikit-learn asks, the constructor only stores the
    settings; :meth:`fit` checks them (ValueError; ImportError for
    ``device="cuda"`` without CuPy).
    """

    def __init__(self, hidden: Sequence[int] = (64,), n_classes: Optional[int] = None,
                 steps: int = 200, batch_size: int = 256, learning_rate: float = 1e-3,
                 optimizer: str = "adam", checkpoint_every: int = 10,
                 bucket_cap_mb: float = 25.0, seed: int = 0, verbose: bool = False,
                 device: str = "cpu", first_bucket_mb: float = 1.0) -> None:
        self.hidden = hidden
        self.n_classes = n_classes
        self.steps = steps
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.optimizer = optimizer
        self.checkpoint_every = checkpoint_every
        self.bucket_cap_mb = bucket_cap_mb
        self.seed = seed
        self.verbose = verbose
        self.device = device
        self.first_bucket_mb = first_bucket_mb

    def _check_settings(self) -> None:
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer={self.optimizer!r}: use 'adam' or 'sgd'")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: use 'cpu' or 'cuda'")
        for name, low in (("steps", 0), ("batch_size", 1), ("checkpoint_every", 1)):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or value < low:
                raise ValueError(f"{name}={value!r} must be an integer >= {low}")
        if self.n_classes is not None and (not isinstance(self.n_classes, numbers.Integral)
                                           or self.n_classes < 2):
            raise ValueError(f"n_classes={self.n_classes!r} must be None or an integer >= 2")
        if not all(isinstance(h, numbers.Integral) and h >= 1 for h in self.hidden):
            raise ValueError(f"hidden={self.hidden!r} must be layer sizes >= 1")

    def _init_params(self, n_features: int) -> List[np.ndarray]:
        rng = np.random.default_rng(int(self.seed))
        sizes = [n_features] + [int(h) for h in self.hidden] + [len(self.classes_)]
        params = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            params.append(rng.normal(scale=np.sqrt(2.0 / fan_in), size=(fan_in, fan_out)))
            params.append(np.zeros(fan_out))
        return params

    def fit(self, X: Any, y: Any) -> "MLPClassifier":
        """Train on the rows of all ranks (``X``, ``y``: this rank's shard).

        Raises:
            ValueError: bad settings, or fewer than two classes.
            DataError: on every rank, when any rank's data is bad.
        """
        ensure_init()
        self._check_settings()
        X, y = checked(self, X, y, classification=True)
        X = check_features(X, allow_nan=False)
        found = global_classes(y)
        if self.n_classes is not None:
            classes = np.arange(int(self.n_classes))
            if not np.isin(found, classes).all():
                raise DataError(f"class labels must be integers in [0, {self.n_classes}) "
                                f"(n_classes={self.n_classes}); found {found[:5].tolist()}")
        else:
            classes = found
        if len(classes) < 2:
            raise DataError(f"the data of all ranks has one class only ({classes.tolist()}); "
                            f"a classifier needs two")
        self.classes_ = classes
        y = np.searchsorted(classes, y).astype(np.int64)
        offset, n_total = global_offset(X.shape[0])
        batch_size, steps = int(self.batch_size), int(self.steps)
        key = [X.shape[1], n_total, [int(h) for h in self.hidden], len(classes), steps,
               batch_size, float(self.learning_rate), self.optimizer, int(self.seed),
               data_fingerprint(X, y)]
        state = resume_state("mlp", key)
        if state is None:
            params = self._init_params(X.shape[1])
            state = {"trainer": "mlp", "key": state_key(key), "step": 0, "params": params,
                     "m": [np.zeros_like(p) for p in params],
                     "v": [np.zeros_like(p) for p in params], "loss": float("nan")}
        xp = self._xp()
        params = [xp.array(p) for p in state["params"]]
        m = [xp.array(a) for a in state["m"]]
        v = [xp.array(a) for a in state["v"]]
        loss = state["loss"]
        X, y = xp.asarray(X), xp.asarray(y)
        bucketer = GradientBucketer(params, bucket_cap_mb=self.bucket_cap_mb,
                                    first_bucket_mb=self.first_bucket_mb, average=False)
        order = np.random.default_rng([int(self.seed), 1]).permutation(n_total)
        per_epoch = max(1, n_total // batch_size)
        try:
            bar = progress(range(state["step"], steps), steps - state["step"], "mlp",
                           self.verbose)
            for step in bar:
                start = (step % per_epoch) * batch_size
                batch = order[start:start + batch_size]
                mine = xp.asarray(batch[(batch >= offset) & (batch < offset + X.shape[0])]
                                  - offset)
                local_loss = self._backward(params, X[mine], y[mine], bucketer)
                grads = bucketer.wait()
                loss_sum = rabit.allreduce(np.array([local_loss]), rabit.Op.SUM)[0]
                loss = float(loss_sum / batch.size)
                self._update(params, [g / batch.size for g in grads], m, v, step + 1)
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(loss=f"{loss:.4f}")
                if (step + 1) % self.checkpoint_every == 0 or step + 1 == steps:
                    rabit.checkpoint({**state, "step": step + 1, "params": self._host(params),
                                      "m": self._host(m), "v": self._host(v), "loss": loss})
        finally:
            bucketer.close()
        self.params_, self.loss_ = self._host(params), loss
        return self

    def _xp(self):  # type: ignore[no-untyped-def]
        """The array module of ``device``: numpy or cupy."""
        if self.device == "cpu":
            return np
        import cupy  # noqa: PLC0415 - optional, for device="cuda" only

        return cupy

    def _host(self, arrays: List[np.ndarray]) -> List[np.ndarray]:
        """NumPy copies of device arrays (NumPy arrays as they are)."""
        return arrays if self.device == "cpu" else [a.get() for a in arrays]

    def _backward(self, params: List[np.ndarray], X: np.ndarray, y: np.ndarray,
                  bucketer: GradientBucketer) -> float:
        """Forward and backward over this rank's rows of the batch; each layer's
        gradients (sums over the rows) go to the bucketer as soon as they
        exist. Returns the summed loss."""
        xp = self._xp()
        activations = [X]
        n_layers = len(params) // 2
        for layer in range(n_layers):
            z = activations[-1] @ params[2 * layer] + params[2 * layer + 1]
            activations.append(xp.maximum(z, 0.0) if layer < n_layers - 1 else z)
        logits = activations[-1]
        shifted = logits - logits.max(axis=1, keepdims=True) if logits.size else logits
        log_p = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        rows = xp.arange(y.size)
        loss = float(-log_p[rows, y].sum())
        delta = xp.exp(log_p)
        delta[rows, y] -= 1.0
        for layer in reversed(range(n_layers)):
            bucketer.mark_ready(2 * layer, activations[layer].T @ delta)
            bucketer.mark_ready(2 * layer + 1, delta.sum(axis=0))
            if layer:
                delta = (delta @ params[2 * layer].T) * (activations[layer] > 0)
        return loss

    def _update(self, params: List[np.ndarray], grads: List[np.ndarray], m: List[np.ndarray],
                v: List[np.ndarray], t: int) -> None:
        xp = self._xp()
        lr = self.learning_rate
        for p, g, mi, vi in zip(params, grads, m, v):
            if self.optimizer == "sgd":
                p -= lr * g
                continue
            mi *= 0.9
            mi += 0.1 * g
            vi *= 0.999
            vi += 0.001 * g * g
            p -= lr * (mi / (1 - 0.9 ** t)) / (xp.sqrt(vi / (1 - 0.999 ** t)) + 1e-8)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_`` (no MPI).

        Raises:
            NotFittedError: before :meth:`fit`.
            ValueError: ``X`` is not a 2-D array of the fitted width.
        """
        check_is_fitted(self)
        a = validate_data(self, X, reset=False, dtype=np.float64)
        n_layers = len(self.params_) // 2
        for layer in range(n_layers):
            a = a @ self.params_[2 * layer] + self.params_[2 * layer + 1]
            if layer < n_layers - 1:
                a = np.maximum(a, 0.0)
        e = np.exp(a - a.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """Most probable class of each row (from ``classes_``)."""
        best = self.predict_proba(X).argmax(axis=1)
        return self.classes_[best]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m trainers.mlp --train data.npy --classes 2 --out model.json``"""
    parser = cli_parser("rabit-mlp", __doc__)
    parser.add_argument("--train", required=True, help="training data (see trainers.data)")
    parser.add_argument("--label-column", type=int, default=0, help="column of the label")
    parser.add_argument("--classes", type=int, default=2, help="number of classes (labels 0..n-1)")
    parser.add_argument("--hidden", default="64", help="hidden sizes, e.g. 128,64")
    parser.add_argument("--steps", type=int, default=200, help="training steps (global batches)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per global batch")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="NumPy on the CPU, or CuPy on GPU rank %% GPU count")
    parser.add_argument("--out", help="write the parameters as JSON here (rank 0; default: not "
                        "written)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or log")
    args = parser.parse_args(argv)
    with rabit.session():
        if args.device == "cuda":
            import rabit_py.gpu  # noqa: PLC0415 - GPU runs only

            rabit_py.select_device()
        X, y = load_shard(args.train, args.label_column)
        model = MLPClassifier([int(h) for h in args.hidden.split(",") if h], args.classes,
                              args.steps, args.batch_size, args.lr,
                              verbose=not args.quiet, device=args.device).fit(X, y)
        if rabit.get_rank() == 0:
            print(f"loss {model.loss_:.6f} after {args.steps} steps", flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"params": [p.tolist() for p in model.params_],
                               "loss": model.loss_}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
