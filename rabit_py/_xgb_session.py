"""One XGBoost communication session for :mod:`rabit_py.xgboost`: rank 0's
``RabitTracker``, every rank's ``CommunicatorContext`` and the matrices built
inside it. A session lives until a failure or the end of training; after a
failure every rank closes its session and opens a new one (Note [xgboost
sessions] in ``rabit_py/xgboost.py``).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import xgboost
from xgboost import collective
from xgboost.core import XGBoostError
from xgboost.tracker import RabitTracker

log = logging.getLogger("rabit_py.xgboost")

DataFn = Callable[[], Any]


@contextlib.contextmanager
def quiet_xgboost() -> Iterator[None]:
    """XGBoost reports each connection retry as a Python warning; a recovery
    makes several on purpose, so they go to the debug log instead."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                log.debug("xgboost: %s", str(w.message).strip())


class Tracker:
    """Rank 0's XGBoost tracker for one session."""

    def __init__(self, n_workers: int, host: str, timeout: int) -> None:
        self._tracker: Optional[RabitTracker] = RabitTracker(
            n_workers=n_workers, host_ip=host, port=0, sortby="task", timeout=timeout)
        self._tracker.start()
        self.args: Dict[str, Any] = dict(self._tracker.worker_args())

    def close(self) -> None:
        """Stop the tracker. XGBoost raises when a worker of the session was
        lost or never came; that is expected here and only logged."""
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return
        try:
            tracker.free()
        except XGBoostError as exc:
            log.debug("xgboost tracker closed: %s", str(exc).splitlines()[0])


def task_id(rank: int) -> str:
    """XGBoost's task id for a rank: zero-padded so that the tracker's sort by
    task gives XGBoost rank ``rank`` (ids are compared as strings)."""
    return f"{rank:09d}"


class Session:
    """This rank's communicator and matrices for one session.

    Args:
        args: the tracker's worker arguments (from rank 0).
        rank: this rank (XGBoost must give it the same number).
        timeout: XGBoost's ``dmlc_timeout`` (seconds a collective may wait).
        retry: XGBoost's ``dmlc_retry`` (connection attempts). 1 in
            rabit_py.xgboost: leaving a session whose tracker died (rank 0
            lost) retried the tracker for 2-4 s with more, while the peers
            waited on this rank's open sockets.
        build_train: returns the training ``DMatrix``.
        build_evals: ``(name, builder)`` of the evaluation sets.

    Raises:
        XGBoostError: XGBoost could not connect (a lost peer or tracker).
        RuntimeError: XGBoost numbered the rank differently.
        Exception: whatever the user's data functions raise.
    """

    def __init__(self, args: Dict[str, Any], rank: int, timeout: int, retry: int,
                 build_train: DataFn,
                 build_evals: Sequence[Tuple[str, DataFn]]) -> None:
        self._context: Optional[collective.CommunicatorContext] = None
        context = collective.CommunicatorContext(
            **args, dmlc_task_id=task_id(rank), dmlc_timeout=timeout, dmlc_retry=retry)
        with quiet_xgboost():
            context.__enter__()
        self._context = context
        try:
            if collective.get_rank() != rank:
                raise RuntimeError(
                    f"rank {rank}: XGBoost numbered this worker {collective.get_rank()}; "
                    f"rabit_py.xgboost needs XGBoost's ranks to equal rabit_py's")
            self.train: xgboost.DMatrix = _checked(build_train(), "the training data")
            self.evals: List[Tuple[xgboost.DMatrix, str]] = [
                (_checked(build(), f"evaluation set {name!r}"), name)
                for name, build in build_evals]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Leave XGBoost's communicator; errors from lost peers are only logged."""
        context, self._context = self._context, None
        if context is None:
            return
        try:
            with quiet_xgboost():
                context.__exit__(None, None, None)
        except XGBoostError as exc:
            log.debug("xgboost communicator closed: %s", str(exc).splitlines()[0])


def _checked(matrix: Any, what: str) -> xgboost.DMatrix:
    if not isinstance(matrix, xgboost.DMatrix):
        raise TypeError(f"the function that builds {what} returned "
                        f"{type(matrix).__name__}, not an xgboost.DMatrix")
    return matrix
