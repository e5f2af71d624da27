"""Optimizers for :class:`rabit_py.kvstore.KVStore` (MXNet's ``mx.optimizer``).

An optimizer updates a weight in place from its aggregated gradient. The
store runs the same update on every rank after each push is reduced, so every
rank holds the same weights and the same optimizer state without
communicating them. The updates are plain NumPy element-wise arithmetic in a
fixed order, so equal inputs give equal bits on every rank.

``Updater`` wraps an optimizer into MXNet's updater signature
``updater(key, grad, weight)`` and owns the per-key state (momentum, Adam's
moments and step count), which it can export for checkpoints and
``save_optimizer_states``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Hashable, Optional

import numpy as np

__all__ = ["Optimizer", "SGD", "Adam", "Updater", "get_updater", "create"]


class Optimizer:
    """Base class: ``create_state`` makes a key's state, ``update`` applies one
    step in place.

    Args:
        learning_rate: step size.
        wd: L2 weight decay, added to the gradient as ``wd * weight``.
        rescale_grad: the aggregated gradient is multiplied by it first
            (e.g. ``1 / global_batch_size``).
        clip_gradient: clip the rescaled gradient to ``[-c, c]`` (None: no clip).

    Raises:
        ValueError: a negative learning rate, weight decay or clip bound.
    """

    def __init__(self, learning_rate: float = 0.01, wd: float = 0.0, rescale_grad: float = 1.0,
                 clip_gradient: Optional[float] = None) -> None:
        if learning_rate < 0 or wd < 0:
            raise ValueError(f"learning_rate={learning_rate} and wd={wd} must be >= 0")
        if clip_gradient is not None and clip_gradient <= 0:
            raise ValueError(f"clip_gradient={clip_gradient} must be > 0 (or None)")
        self.learning_rate = float(learning_rate)
        self.wd = float(wd)
        self.rescale_grad = float(rescale_grad)
        self.clip_gradient = None if clip_gradient is None else float(clip_gradient)

    def config(self) -> Dict[str, Any]:
        """The optimizer's name and hyper-parameters (saved with its states)."""
        return {"name": type(self).__name__.lower(), **vars(self)}

    def create_state(self, key: Hashable, weight: np.ndarray) -> Any:
        """The initial state of ``key`` (None when stateless)."""
        return None

    def update(self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: Any,
               count: int) -> None:
        """Apply step number ``count`` (1, 2, ...) of ``key`` to ``weight`` in place."""
        raise NotImplementedError

    def _prepared(self, weight: np.ndarray, grad: np.ndarray) -> np.ndarray:
        g = grad * weight.dtype.type(self.rescale_grad)
        if self.clip_gradient is not None:
            np.clip(g, -self.clip_gradient, self.clip_gradient, out=g)
        if self.wd:
            g += weight.dtype.type(self.wd) * weight
        return g


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (MXNet's ``sgd``):
    ``m = momentum * m - lr * g; w += m`` (``w -= lr * g`` without momentum),
    where ``g = clip(rescale_grad * grad) + wd * w``.

    Raises:
        ValueError: momentum outside [0, 1), or bad base arguments.
    """

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum} must be in [0, 1)")
        self.momentum = float(momentum)

    def create_state(self, key: Hashable, weight: np.ndarray) -> Any:
        return np.zeros_like(weight) if self.momentum else None

    def update(self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: Any,
               count: int) -> None:
        g = self._prepared(weight, grad)
        lr = weight.dtype.type(self.learning_rate)
        if state is None:
            weight -= lr * g
        else:
            state *= weight.dtype.type(self.momentum)
            state -= lr * g
            weight += state


class Adam(Optimizer):
    """Adam (Kingma & Ba; MXNet's ``adam``): ``m = b1 m + (1-b1) g``,
    ``v = b2 v + (1-b2) g^2``, ``w -= lr_t m / (sqrt(v) + eps)`` with
    ``lr_t = lr sqrt(1-b2^t) / (1-b1^t)`` at the key's step ``t``.

    Raises:
        ValueError: betas outside [0, 1), epsilon <= 0, or bad base arguments.
    """

    def __init__(self, learning_rate: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0) or epsilon <= 0:
            raise ValueError(f"beta1={beta1}, beta2={beta2} must be in [0, 1) and "
                             f"epsilon={epsilon} > 0")
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def create_state(self, key: Hashable, weight: np.ndarray) -> Any:
        return np.zeros_like(weight), np.zeros_like(weight)

    def update(self, key: Hashable, weight: np.ndarray, grad: np.ndarray, state: Any,
               count: int) -> None:
        g = self._prepared(weight, grad)
        mean, var = state
        t = weight.dtype.type
        mean *= t(self.beta1)
        mean += t(1.0 - self.beta1) * g
        var *= t(self.beta2)
        var += t(1.0 - self.beta2) * g * g
        lr_t = (self.learning_rate * math.sqrt(1.0 - self.beta2 ** count)
                / (1.0 - self.beta1 ** count))
        weight -= t(lr_t) * mean / (np.sqrt(var) + t(self.epsilon))


_OPTIMIZERS = {"sgd": SGD, "adam": Adam}


def create(name: str, **kwargs: Any) -> Optimizer:
    """An optimizer by name (``"sgd"`` or ``"adam"``) with its hyper-parameters.

    Raises:
        ValueError: an unknown name.
    """
    try:
        cls = _OPTIMIZERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}: use one of {sorted(_OPTIMIZERS)}") from None
    return cls(**kwargs)


class Updater:
    """``updater(key, grad, weight)``: one optimizer step for ``key``, with the
    per-key state kept here (MXNet's ``mx.optimizer.Updater``)."""

    def __init__(self, optimizer: Optimizer) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"expected a rabit_py.optimizer.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.states: Dict[Hashable, Any] = {}
        self.counts: Dict[Hashable, int] = {}

    def __call__(self, key: Hashable, grad: np.ndarray, weight: np.ndarray) -> None:
        if key not in self.states:
            self.states[key] = self.optimizer.create_state(key, weight)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.optimizer.update(key, weight, grad, self.states[key], self.counts[key])

    def get_states(self) -> Dict[str, Any]:
        """The optimizer's config, each key's state and step count (picklable;
        arrays are copies)."""
        return {"optimizer": self.optimizer.config(),
                "states": {k: _copy(v) for k, v in self.states.items()},
                "counts": dict(self.counts)}

    def set_states(self, saved: Dict[str, Any]) -> None:
        """Restore what :meth:`get_states` returned.

        Raises:
            ValueError: the states were saved by a different optimizer.
        """
        name = saved.get("optimizer", {}).get("name")
        if name != self.optimizer.config()["name"]:
            raise ValueError(f"the optimizer states were saved by {name!r}, this store uses "
                             f"{self.optimizer.config()['name']!r}: set the same optimizer "
                             f"before loading them")
        self.states = {k: _copy(v) for k, v in saved["states"].items()}
        self.counts = dict(saved["counts"])


def get_updater(optimizer: Optimizer) -> Updater:
    """An :class:`Updater` for ``optimizer`` (MXNet's ``mx.optimizer.get_updater``)."""
    return Updater(optimizer)


def _copy(state: Any) -> Any:
    if isinstance(state, np.ndarray):
        return state.copy()
    if isinstance(state, tuple):
        return tuple(_copy(s) for s in state)
    return state
