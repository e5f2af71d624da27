"""Fault-tolerant real XGBoost: :func:`train` runs ``xgboost``'s own
distributed ``hist`` training on every rank of a rabit_py job and survives
lost ranks (optional: needs ``xgboost``, ``pip install -e ".[xgboost]"``).

    import rabit_py as rabit
    import rabit_py.xgboost as rxgb

    with rabit.session():                       # under rabit-run / mpirun
        X, y = load_my_rows(rabit.get_rank())   # this rank's rows
        booster = rxgb.train({"objective": "binary:logistic", "max_depth": 6},
                             X, y, num_boost_round=100)

XGBoost gave up recovering a lost worker inside the job (dmlc/xgboost#4250,
#5978, #6265): a dead worker makes its peers raise, and the job starts over.
Here the model is a rabit_py checkpoint every ``checkpoint_every`` rounds;
under the robust engine a lost rank is replaced inside the job, every rank
opens a new XGBoost session, and training goes on from the last checkpoint,
ending with the same model bytes as a run without failures. Under the plain
``"mpi"`` engine a lost peer ends the job within seconds with
:class:`~rabit_py.RecoveryError`, and ``rabit-run --max-restarts`` resumes
from the durable checkpoint (``checkpoint_dir``).

# Note [xgboost sessions]
A session is rank 0's ``RabitTracker`` plus every rank's
``CommunicatorContext`` and matrices; it lasts until a failure. Rabit's rule
-- a replacement makes the same rabit_py calls as the survivors did since the
checkpoint, and gets their results from the survivors' cache -- shapes each
attempt at an interval (Note [xgboost intervals] in ``_rounds.py``):

  A. allreduce: how many ranks hold a session (and each rank's host);
  B. (A short of every rank) broadcast of a new tracker's address from rank 0;
  R. then a roll call: an allreduce where each rank adds a random number of
     its own at its own slot; a rank whose number is missing from the result
     is a replacement replaying B and R from the cache, whose tracker the
     survivors already joined (or lost): it must not connect to it. Without
     this it did connect, to a tracker past its start-up;
  -- the interval's rounds, inside XGBoost, if this rank holds a session;
  C. allreduce of every rank's outcome (done, XGBoost failed, no session,
     another error);
  D. (all done) broadcast of the new state from rank 0, then
     ``lazy_checkpoint`` of it. A replacement that replays C and D from the
     cache gets the interval's result this way: it cannot train it alone.

Otherwise every rank closes its session and the attempt starts again at A,
in the same version, from the same state. Every decision depends only on
results of rabit_py calls (which replay), never on what happened locally, so
a replacement takes the survivors' path; locally it only learns "no session",
which C reports. The robust engine notices the lost rank at the first
rabit_py call after XGBoost raised (C) and replaces it there.

Failures that are not a lost peer end the job instead of looping: an error
other than XGBoost's, at once; XGBoost failing ``max_failed_attempts`` times
in a row with no replacement among the ranks (bad parameters, say). Both
raise :class:`~rabit_py.TrainingError` on every rank (the failing rank
re-raises its own error), after E, a broadcast of the error's text from the
failing rank, and F, an allreduce that holds the failing rank back until
every rank has that text.

Tier T3 of DESIGN.md ("Tiers"): a feature on the public API. It uses
``rabit_py.api`` and tier T0 only, never an engine; its ``_rounds`` and
``_session`` are used only here (``tests/unit/test_layout.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

try:
    import xgboost
    from xgboost.callback import EarlyStopping, EvaluationMonitor, TrainingCallback
    from xgboost.core import XGBoostError
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"rabit_py.xgboost needs XGBoost, which cannot be imported ({_exc}); "
                      f"install it: pip install -e \".[xgboost]\"") from _exc

from .. import api
from ._rounds import BoostState, Interval, callback_names, initial_state
from ._session import DataFn, Session, Tracker, host_address, without_repeated_task_lines
from ..errors import TrainingError
from ..ops import Op

__all__ = ["train"]

log = logging.getLogger("rabit_py.xgboost")

# Outcomes of one attempt on one rank, exchanged at call C.
_DONE, _FAILED, _NO_SESSION, _ERROR = 0, 1, 2, 3
_OUTCOMES = 4

EvalSpec = Union[Tuple[Any, Any, str], Tuple[DataFn, str]]


def train(params: Mapping[str, Any], X: Any, y: Any = None, num_boost_round: int = 10, *,
          evals: Optional[Sequence[EvalSpec]] = None,
          obj: Optional[Callable[..., Any]] = None,
          maximize: Optional[bool] = None,
          early_stopping_rounds: Optional[int] = None,
          evals_result: Optional[Dict[str, Any]] = None,
          verbose_eval: Union[bool, int] = True,
          callbacks: Optional[Sequence[TrainingCallback]] = None,
          custom_metric: Optional[Callable[..., Any]] = None,
          checkpoint_every: int = 1,
          dmatrix_kwargs: Optional[Mapping[str, Any]] = None,
          timeout: int = 30,
          max_failed_attempts: int = 3,
          tracker_host: Optional[str] = None) -> xgboost.Booster:
    """Train an XGBoost booster on every rank's rows, surviving lost ranks.

    Collective: every rank calls it with its own rows and the same settings,
    after ``rabit.init()``. The arguments from ``obj`` to ``custom_metric``
    mean what they mean for ``xgboost.train``.

    Args:
        params: XGBoost parameters (``tree_method`` defaults to ``hist``).
        X: this rank's features (anything ``xgboost.DMatrix`` takes), or a
            function without arguments that returns this rank's
            ``xgboost.DMatrix``/``QuantileDMatrix``; it is called again in
            every new session. Not a ready ``DMatrix``: its cached sketch
            would not be rebuilt with a replacement's.
        y: this rank's labels when ``X`` is data; None when it is a function.
        num_boost_round: rounds in all.
        evals: ``(X, y, name)`` or ``(function, name)`` per evaluation set.
        checkpoint_every: rounds per checkpoint (a lost rank costs at most
            this many rounds; with row or column sampling each checkpoint
            also rebuilds the booster from its bytes, Note [kept booster]).
        dmatrix_kwargs: more arguments for ``xgboost.DMatrix`` (``weight``,
            ``missing``, ...) when ``X`` and the evaluation sets are data.
        timeout: seconds XGBoost waits for a peer (its ``dmlc_timeout``, and
            the tracker's wait for workers): a hung or unreachable peer is an
            error after this long; a killed one at once.
        max_failed_attempts: XGBoost failures in a row, with no lost rank,
            before the job gives up.
        tracker_host: address of rank 0 that the other ranks reach; default
            ``127.0.0.1`` when all ranks share a host, else the address that
            rank 0's host name resolves to, if it is one of that host's own
            (Note [tracker address]), else XGBoost's choice (a route to the
            outside). XGBoost's tracker and workers listen on ports the
            system picks: the job's hosts must reach each other on TCP.

    Returns:
        The trained ``xgboost.Booster``, with the same saved bytes on every
        rank and in every run, with or without failures.

    Raises:
        TypeError, ValueError: bad arguments (before any communication).
        TrainingError: training failed for another reason than a lost peer.
        RecoveryError: a peer was lost and the engine cannot recover in place.
        CheckpointError: a callback cannot be pickled.
        NotInitializedError: before ``init()``.
    """
    plan = _Plan.checked(params, X, y, num_boost_round, evals, obj, maximize,
                         early_stopping_rounds, verbose_eval, callbacks, custom_metric,
                         checkpoint_every, dmatrix_kwargs, timeout, max_failed_attempts,
                         tracker_host)
    info = api.engine_info()
    plan.interval = dataclasses.replace(
        plan.interval, trust_callbacks=info.trust_checkpoints,
        callbacks_may_name=callback_names(plan.callbacks, info.checkpoint_classes))
    state = _Trainer(plan).run()
    booster = plan.interval.finish(state)
    if evals_result is not None:
        evals_result.update(state.history)
    return booster


class _Plan:
    """The checked arguments of one :func:`train` call."""

    def __init__(self, interval: Interval, callbacks: List[TrainingCallback],
                 build_train: DataFn, build_evals: List[Tuple[str, DataFn]],
                 timeout: int, max_failed_attempts: int,
                 tracker_host: Optional[str]) -> None:
        self.interval = interval
        self.callbacks = callbacks
        self.build_train = build_train
        self.build_evals = build_evals
        self.timeout = timeout
        self.max_failed_attempts = max_failed_attempts
        self.tracker_host = tracker_host

    @classmethod
    def checked(cls, params: Mapping[str, Any], X: Any, y: Any, num_boost_round: int,
                evals: Optional[Sequence[EvalSpec]], obj: Any, maximize: Optional[bool],
                early_stopping_rounds: Optional[int], verbose_eval: Union[bool, int],
                callbacks: Optional[Sequence[TrainingCallback]], custom_metric: Any,
                checkpoint_every: int, dmatrix_kwargs: Optional[Mapping[str, Any]],
                timeout: int, max_failed_attempts: int,
                tracker_host: Optional[str]) -> "_Plan":
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of XGBoost parameters, not "
                            f"{type(params).__name__}")
        for name, value, least in (("num_boost_round", num_boost_round, 0),
                                   ("checkpoint_every", checkpoint_every, 1),
                                   ("timeout", timeout, 1),
                                   ("max_failed_attempts", max_failed_attempts, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
        kwargs = dict(dmatrix_kwargs or {})
        build_train = _builder(X, y, kwargs, "X")
        build_evals = []
        for i, spec in enumerate(evals or ()):
            if not isinstance(spec, tuple) or len(spec) not in (2, 3) \
                    or not isinstance(spec[-1], str):
                raise TypeError(f"evals[{i}] must be (X, y, name) or (function, name), "
                                f"not {spec!r:.80}")
            build_evals.append((spec[-1], _builder(spec[0], spec[1] if len(spec) == 3 else None,
                                                   kwargs, f"evals[{i}]")))
        if early_stopping_rounds and not build_evals:
            raise ValueError("early_stopping_rounds needs at least one evaluation set in evals "
                             "(the last one decides)")
        params = dict(params)
        params.setdefault("tree_method", "hist")
        seed = params.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"params['seed']={seed!r} must be an integer")
        cbs = list(callbacks or ())
        if verbose_eval:
            cbs.append(EvaluationMonitor(period=1 if verbose_eval is True else int(verbose_eval)))
        if early_stopping_rounds:
            cbs.append(EarlyStopping(rounds=int(early_stopping_rounds), maximize=maximize))
        interval = Interval(params, int(num_boost_round), int(checkpoint_every), obj,
                            custom_metric, int(seed))
        return cls(interval, cbs, build_train, build_evals, int(timeout),
                   int(max_failed_attempts), tracker_host)


def _builder(data: Any, label: Any, kwargs: Dict[str, Any], what: str) -> DataFn:
    if isinstance(data, xgboost.DMatrix):
        raise TypeError(f"{what} is a ready xgboost.DMatrix: pass the data (and labels), or a "
                        f"function that builds the DMatrix, so that it can be built again in "
                        f"a new session after a failure")
    if callable(data):
        if label is not None:
            raise TypeError(f"{what} is a function that builds the DMatrix: give its labels "
                            f"there, not as y")
        return data
    if data is None:
        raise TypeError(f"{what} is None: pass this rank's rows")
    return lambda: xgboost.DMatrix(data, label=label, **kwargs)


class _Trainer:
    """One rank's side of Note [xgboost sessions]."""

    def __init__(self, plan: _Plan) -> None:
        self._plan = plan
        self._rank = api.get_rank()
        self._size = api.get_world_size()
        self._host = zlib.crc32(api.get_processor_name().encode())
        self._session: Optional[Session] = None
        self._tracker: Optional[Tracker] = None
        self._failed_attempts = 0
        self._connect_error: Optional[BaseException] = None

    def run(self) -> BoostState:
        version, state = api.load_checkpoint()
        state = self._resumed(version, state)
        # Each worker prints "Task T got rank R" as it joins a session: once
        # is enough, not again at each session that a recovery opens.
        with without_repeated_task_lines():
            try:
                while not state.finished(self._plan.interval.num_boost_round):
                    state = self._attempt(state)
            finally:
                self._close()
        return state

    def _resumed(self, version: int, state: Any) -> BoostState:
        if version == 0 or state is None:
            return initial_state(self._plan.callbacks)
        if not isinstance(state, BoostState):
            raise TypeError(f"rank {self._rank}: the checkpoint (version {version}) holds "
                            f"{type(state).__name__}, not rabit_py.xgboost's training state: "
                            f"was it written by another program? Use another checkpoint_dir")
        self._plan.interval.callbacks_of(state, self._rank)     # Note [callbacks are data]
        return state

    # ------------------------------------------------------------ one attempt
    def _attempt(self, state: BoostState) -> BoostState:
        status = np.zeros(1 + self._size, dtype=np.int64)                 # A
        status[0] = self._session is not None
        status[1 + self._rank] = self._host
        api.allreduce(status, Op.SUM)
        if status[0] < self._size:
            self._close()
            self._open(single_host=bool(np.all(status[1:] == status[1])))
        outcome, result = self._train(state)
        counts = np.zeros(_OUTCOMES + self._size, dtype=np.int64)         # C
        counts[outcome] = 1
        counts[_OUTCOMES + self._rank] = outcome
        api.allreduce(counts, Op.SUM)
        if counts[_DONE] == self._size:
            new = api.broadcast(result if self._rank == 0 else None, 0)   # D
            api.lazy_checkpoint(new)
            self._failed_attempts = 0
            return new
        self._close()
        self._after_failure(state, counts, result)
        return state

    def _open(self, single_host: bool) -> None:
        """B, R and the connection (Note [xgboost sessions])."""
        plan = self._plan
        mine = None
        if self._rank == 0:
            # Note [tracker address] in _session.py
            host = plan.tracker_host or ("127.0.0.1" if single_host else host_address())
            try:
                self._tracker = Tracker(self._size, host, plan.timeout)
                mine = self._tracker.args
            except Exception as exc:  # noqa: BLE001 - reported at C like any failure
                self._connect_error = exc
        args = api.broadcast(mine, 0)                                     # B
        if self._tracker is not None and args != mine:
            self._close()       # a replacement's own tracker: the job uses an older one
        nonce = int.from_bytes(os.urandom(7), "little") | 1
        roll = np.zeros(self._size, dtype=np.int64)                       # R
        roll[self._rank] = nonce
        api.allreduce(roll, Op.SUM)
        if roll[self._rank] != nonce:
            self._close()
            self._connect_error = None
            log.info("rank %d: replaying a session the others already joined; "
                     "waiting for the next one", self._rank)
            return
        if args is None:
            if self._connect_error is None:
                self._connect_error = XGBoostError(
                    "rank 0 could not start XGBoost's tracker (see its error)")
            return
        try:
            self._session = Session(args, self._rank, plan.timeout, 1,
                                    plan.build_train, plan.build_evals)
        except Exception as exc:  # noqa: BLE001 - reported at C, raised after it
            self._connect_error = exc

    def _train(self, state: BoostState) -> Tuple[int, Any]:
        """This rank's outcome of the interval, and the new state or the error."""
        error, self._connect_error = self._connect_error, None
        if self._session is not None:
            try:
                session = self._session
                with session.guard.inside(f"the training from round {state.next_round}"):
                    new, session.booster = self._plan.interval.run(
                        state, session.train, session.evals, session.booster)
                    return _DONE, new
            except Exception as exc:  # noqa: BLE001 - sorted below
                error = exc
                log.info("rank %d: XGBoost failed at round %d: %s", self._rank,
                         state.next_round, _gist(exc))
                # Closed at once, so that the peers waiting on this rank in
                # XGBoost's ring see the connection end instead of waiting
                # for XGBoost's timeout (they did: 10 s).
                started = time.monotonic()
                self._close()
                log.info("rank %d: XGBoost session closed in %.2f s", self._rank,
                         time.monotonic() - started)
        if error is None:
            return _NO_SESSION, None
        return (_FAILED if isinstance(error, XGBoostError) else _ERROR), error

    def _after_failure(self, state: BoostState, counts: np.ndarray,
                       error: Optional[BaseException]) -> None:
        """A failed attempt: give up (on every rank) or go on to the next."""
        outcomes = counts[_OUTCOMES:]
        if counts[_ERROR] == 0:
            if counts[_NO_SESSION] > 0:
                log.info("rank %d: a replaced rank joins; new XGBoost session at round %d",
                         self._rank, state.next_round)
                return
            self._failed_attempts += 1
            if self._failed_attempts < self._plan.max_failed_attempts:
                log.info("rank %d: every rank is still there; new XGBoost session at round "
                         "%d (failed attempt %d of %d)", self._rank, state.next_round,
                         self._failed_attempts, self._plan.max_failed_attempts)
                return
        kind = _ERROR if counts[_ERROR] else _FAILED
        root = int(np.flatnonzero(outcomes == kind)[0])
        text = f"{type(error).__name__}: {_gist(error)}" if self._rank == root else None
        text = api.broadcast(text, root)                                   # E
        # F: the root returns from its broadcast before the others have the
        # text; if it raised at once, its abort could revoke the broadcast
        # under them and they would report a nameless failure.
        api.allreduce(np.zeros(1, np.int8), Op.SUM)                        # F
        if self._rank == root and kind == _ERROR and error is not None:
            raise error
        times = "" if kind == _ERROR else f" {self._failed_attempts} times in a row"
        raise TrainingError(
            f"rank {self._rank}: training stopped at round {state.next_round}: rank {root} "
            f"failed{times}, not because a peer was lost: {text}", root,
            secondary=self._rank != root) from (error if self._rank == root else None)

    def _close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.close()


def _gist(error: Optional[BaseException]) -> str:
    """An error's message without XGBoost's stack trace."""
    text = str(error).split("Stack trace:")[0]
    lines = [line.strip(" -") for line in text.splitlines() if line.strip(" -")]
    return " | ".join(lines[-3:]) if lines else type(error).__name__
