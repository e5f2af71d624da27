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

# Note [kept booster]
Rebuilding the booster from bytes at every interval is not free: XGBoost
predicts every tree of the model again on the training and evaluation rows
(its prediction cache belongs to the old booster), so with
``checkpoint_every=1`` the rebuilds alone grow with the square of the rounds
(scripts/bench_xgboost.py). Where the parameters draw no random numbers
(``gbtree`` with no ``subsample`` or ``colsample_*`` below 1: nothing for an
unsaved generator to change), the booster that trained an interval trains
the next one of the same session as it is, as one ``xgboost.train`` call
would; the checkpoint's bytes are still saved at every interval. After a
failure (a new session) it is rebuilt from the checkpoint, as before, and
without sampling a rebuilt booster grows the same trees. With sampling,
every interval is rebuilt (the note above).

# Note [callbacks are data]
The callbacks' pickle is part of the checkpoint, so a planted checkpoint
file could name any function in it (Note [checkpoints are data] in
``rabit_py/_unpickle.py``). It is loaded as data with the names that the
program's own callbacks can name: XGBoost's callback classes and the printer
that ``EvaluationMonitor`` holds (``xgboost.collective.communicator_print``),
every global that the pickle of the callbacks given to ``train`` names
(recorded from that pickle, made in this process), and the program's
``checkpoint_classes``; with ``trust_checkpoints`` any pickle loads. Anything
else is refused with ``CheckpointError`` when the checkpoint is resumed, on
every rank, before anything of it ran.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import xgboost
from xgboost.callback import CallbackContainer, TrainingCallback

from .._unpickle import NotData, load_data
from ..errors import CheckpointError

#: What XGBoost's own callbacks' pickles name (Note [callbacks are data]).
XGBOOST_CALLBACK_NAMES: FrozenSet[str] = frozenset(
    [f"xgboost.callback.{name}" for name in ("EarlyStopping", "EvaluationMonitor",
                                             "LearningRateScheduler", "TrainingCheckPoint")]
    + ["xgboost.collective.communicator_print"])


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


def callback_names(callbacks: Sequence[TrainingCallback], allowed: Iterable[str] = ()
                   ) -> FrozenSet[str]:
    """What a checkpoint's callbacks may name (Note [callbacks are data]):
    XGBoost's, every global named by the pickle of ``callbacks`` (the
    program's own), and ``allowed``.

    Raises:
        CheckpointError: a callback cannot be pickled.
    """
    named: set = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            named.add(f"{module}.{name}")
            return super().find_class(module, name)

    Recorder(io.BytesIO(_pickle_callbacks(list(callbacks)))).load()   # this process's bytes
    return XGBOOST_CALLBACK_NAMES | frozenset(named) | frozenset(allowed)


@dataclasses.dataclass
class Interval:
    """The fixed settings of every interval of one training."""

    params: Dict[str, Any]
    num_boost_round: int
    rounds_per_interval: int
    obj: Optional[Callable[..., Any]]
    custom_metric: Optional[Callable[..., Any]]
    seed: int
    #: Note [callbacks are data]: what the callbacks' pickle may name, and
    #: whether any pickle is loaded (``trust_checkpoints``).
    callbacks_may_name: FrozenSet[str] = XGBOOST_CALLBACK_NAMES
    trust_callbacks: bool = False

    def callbacks_of(self, state: BoostState, rank: int = -1) -> List[TrainingCallback]:
        """The callbacks of ``state``, loaded as data (Note [callbacks are data]).

        Raises:
            CheckpointError: the pickle names something else; nothing of it ran.
        """
        if self.trust_callbacks:
            return pickle.loads(state.callbacks)
        try:
            return load_data(state.callbacks, self.callbacks_may_name)
        except NotData as exc:
            where = f"rank {rank}: " if rank >= 0 else ""
            raise CheckpointError(
                f"{where}the training callbacks in rabit_py.xgboost's checkpoint (round "
                f"{state.next_round}) {exc.advice()}") from None

    @property
    def keeps_booster(self) -> bool:
        """Whether a booster trains on from one interval to the next (Note
        [kept booster]): the parameters draw no random numbers."""
        params = self.params
        if str(params.get("booster", "gbtree")) != "gbtree":
            return False
        return all(float(params.get(name, 1.0)) >= 1.0
                   for name in ("subsample", "colsample_bytree", "colsample_bylevel",
                                "colsample_bynode"))

    def booster(self, state: BoostState, train: xgboost.DMatrix,
                evals: Sequence[Tuple[xgboost.DMatrix, str]]) -> xgboost.Booster:
        """The model of ``state``, ready to train its next interval."""
        model = None if state.model is None else bytearray(state.model)
        booster = xgboost.Booster(self.params, [train] + [d for d, _ in evals],
                                  model_file=model)
        booster.set_param({"seed": self.seed + state.next_round})
        return booster

    def run(self, state: BoostState, train: xgboost.DMatrix,
            evals: Sequence[Tuple[xgboost.DMatrix, str]],
            kept: Optional[xgboost.Booster] = None
            ) -> Tuple[BoostState, Optional[xgboost.Booster]]:
        """Train from ``state`` to the end of its interval (or until a
        callback stops) and return the new state, and the booster to train
        the next interval of this session with (Note [kept booster]; None:
        rebuild it). Collective inside XGBoost.

        Args:
            kept: what the previous interval of this session returned.

        Raises:
            XGBoostError: XGBoost failed (a lost peer, or a genuine error).
        """
        callbacks = self.callbacks_of(state)
        keep = self.keeps_booster
        rebuilt = not (keep and kept is not None
                       and kept.num_boosted_rounds() == state.next_round)
        booster = self.booster(state, train, evals) if rebuilt else kept
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
        if rebuilt:                     # its seed was moved for the interval
            booster.set_param({"seed": self.seed})
        new = BoostState(done, bytes(booster.save_raw("ubj")), _pickle_callbacks(callbacks),
                         container.history, stopped)
        return new, (booster if keep else None)

    def finish(self, state: BoostState) -> xgboost.Booster:
        """The trained booster: the callbacks' ``after_training`` applied (as
        ``xgboost.train`` does; early stopping's ``save_best`` slices)."""
        booster = (xgboost.Booster(self.params) if state.model is None else
                   xgboost.Booster(self.params, model_file=bytearray(state.model)))
        container = CallbackContainer(self.callbacks_of(state), metric=self.custom_metric,
                                      output_margin=callable(self.obj))
        container.history = copy.deepcopy(state.history)
        return container.after_training(booster)
