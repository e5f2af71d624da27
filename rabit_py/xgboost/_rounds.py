"""The boosting rounds of one checkpoint interval for :mod:`rabit_py.xgboost`,
and the state that a checkpoint keeps between intervals.

The loop is ``xgboost.train``'s own (``Booster.update`` between the callbacks'
``before_iteration``/``after_iteration``), cut into intervals so that the
state after each one can be checkpointed and resumed bitwise (Note [xgboost
intervals]).

# Note [xgboost intervals]
Every interval starts from the checkpointed bytes, never from a live
``Booster``: XGBoost's random sampling (``subsample``, ``colsample_*``, dart)
draws from a generator that is seeded when a booster is configured and is not
saved with the model, so a booster that trained on would not be reproducible
by one rebuilt after a failure (measured with XGBoost 3.2: 3+3 rounds differ
from 6 from tree 3 on, ``seed_per_iteration`` or not). Rebuilt at every
interval, the model depends only on the interval length. So that intervals do
not all draw the same samples, interval ``k`` trains with seed ``seed +
start_round`` (``seed`` at round 0, as ``xgboost.train``); the seed is set
back before the model is saved. Without sampling the trees equal those of one
``xgboost.train`` call. Callbacks (early stopping, the evaluation log) are
pickled with the model, and ``before_training`` runs once, at round 0, so
that they see one uninterrupted run; the history is the evaluation log of
every round so far.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import xgboost
from xgboost.callback import CallbackContainer, TrainingCallback

from ..errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class BoostState:
    """What a checkpoint keeps: identical on every rank.

    Attributes:
        next_round: rounds done so far.
        model: the booster's raw UBJSON bytes (None before round 1).
        callbacks: the pickled callbacks.
        history: evaluation log (``{set: {metric: [scores]}}``).
        stopped: a callback ended training.
    """

    next_round: int
    model: Optional[bytes]
    callbacks: bytes
    history: Dict[str, Dict[str, List[Any]]]
    stopped: bool = False

    def finished(self, num_boost_round: int) -> bool:
        """Whether training is over."""
        return self.stopped or self.next_round >= num_boost_round


def initial_state(callbacks: Sequence[TrainingCallback]) -> BoostState:
    """The state before round 0.

    Raises:
        CheckpointError: a callback cannot be pickled.
    """
    return BoostState(0, None, _pickle_callbacks(list(callbacks)), {})


def _pickle_callbacks(callbacks: List[TrainingCallback]) -> bytes:
    try:
        return pickle.dumps(callbacks, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any pickling failure
        raise CheckpointError(
            f"rabit_py.xgboost checkpoints the training callbacks with the model, and "
            f"one cannot be pickled ({type(exc).__name__}: {exc}); give callbacks that "
            f"pickle (module-level classes, no open files or locks)") from exc


@dataclasses.dataclass
class Interval:
    """The fixed settings of every interval of one training."""

    params: Dict[str, Any]
    num_boost_round: int
    rounds_per_interval: int
    obj: Optional[Callable[..., Any]]
    custom_metric: Optional[Callable[..., Any]]
    seed: int

    def booster(self, state: BoostState, train: xgboost.DMatrix,
                evals: Sequence[Tuple[xgboost.DMatrix, str]]) -> xgboost.Booster:
        """The model of ``state``, ready to train its next interval."""
        model = None if state.model is None else bytearray(state.model)
        booster = xgboost.Booster(self.params, [train] + [d for d, _ in evals],
                                  model_file=model)
        booster.set_param({"seed": self.seed + state.next_round})
        return booster

    def run(self, state: BoostState, train: xgboost.DMatrix,
            evals: Sequence[Tuple[xgboost.DMatrix, str]]) -> BoostState:
        """Train from ``state`` to the end of its interval (or until a
        callback stops) and return the new state. Collective inside XGBoost.

        Raises:
            XGBoostError: XGBoost failed (a lost peer, or a genuine error).
        """
        callbacks: List[TrainingCallback] = pickle.loads(state.callbacks)
        booster = self.booster(state, train, evals)
        container = CallbackContainer(callbacks, metric=self.custom_metric,
                                      output_margin=callable(self.obj))
        container.history = copy.deepcopy(state.history)
        if state.next_round == 0:
            booster = container.before_training(booster)
        stop = state.next_round + self.rounds_per_interval
        end, stopped = min(stop, self.num_boost_round), False
        done = state.next_round
        for i in range(state.next_round, end):
            if container.before_iteration(booster, i, train, list(evals)):
                stopped = True
                break
            booster.update(train, iteration=i, fobj=self.obj)
            done = i + 1
            if container.after_iteration(booster, i, train, list(evals)):
                stopped = True
                break
        booster.set_param({"seed": self.seed})
        return BoostState(done, bytes(booster.save_raw("ubj")), _pickle_callbacks(callbacks),
                          container.history, stopped)

    def finish(self, state: BoostState) -> xgboost.Booster:
        """The trained booster: the callbacks' ``after_training`` applied (as
        ``xgboost.train`` does; early stopping's ``save_best`` slices)."""
        booster = (xgboost.Booster(self.params) if state.model is None else
                   xgboost.Booster(self.params, model_file=bytearray(state.model)))
        callbacks: List[TrainingCallback] = pickle.loads(state.callbacks)
        container = CallbackContainer(callbacks, metric=self.custom_metric,
                                      output_margin=callable(self.obj))
        container.history = copy.deepcopy(state.history)
        return container.after_training(booster)
