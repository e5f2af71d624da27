"""How a rank ends a job that cannot go on: uncaught exceptions, aborts.

# Note [uncaught errors]
An uncaught exception on one rank would leave the others waiting (with ULFM
a non-zero exit is not even detected), so the engine's excepthook ends the
whole job at once, after the traceback. The rank whose error is the cause
reports it to rabit-run (``fatal``: ``restart`` if a restart from the durable
checkpoint may cure it -- a lost peer, a timeout, an I/O error -- else
``bug``), tells its peers (a notice on the control communicator, then a
revoke; Note [timeouts] in ``_watchdog.py``) and aborts.

A rank whose error only reports another rank's (``secondary``: "rank N
stopped the job", or ``TrainingError`` on the ranks that did not fail) does
not report, and waits up to ``SECONDARY_GRACE_S`` for the causing rank's
notice before it aborts: revoking first would break the calls of ranks still
on their way to raising (they would report a nameless failure), aborting
first could kill the causing rank before rabit-run hears the cause, and
announcing after the cause did would make the peers name this rank instead.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from typing import Any, Callable, List, Optional, Tuple

from .._status import BUG, RESTART, Reporter
from ..errors import CollectiveTimeoutError, RabitError

__all__ = ["install_excepthook", "end_job_on_uncaught", "abort_job", "abort_init",
           "is_restartable", "is_secondary", "SECONDARY_GRACE_S"]

SECONDARY_GRACE_S = 5.0     # an uncaught secondary error waits this long for the cause

Hook = Callable[[Any, BaseException], None]


def install_excepthook(end_job: Hook, rank: int, verbose: bool = False) -> Tuple[Any, Any]:
    """Make ``sys.excepthook`` print the error (:func:`error_printer`), then
    call ``end_job(exc_type, exc)``. Returns the hook it replaced (to
    restore) and the printer alone (for after the engine ended)."""
    previous = sys.excepthook
    printer = error_printer(previous, rank, verbose)

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        printer(exc_type, exc, tb)
        end_job(exc_type, exc)

    sys.excepthook = hook
    return previous, printer


def error_printer(previous: Any, rank: int, verbose: bool = False) -> Any:
    """An excepthook that prints what a user needs of an uncaught error on
    ``rank``: a bug's traceback (with ``previous``); for a secondary error
    (Note [uncaught errors]) one line naming the rank that stopped the job;
    for a fault (a lost peer, a timeout: a ``RabitError`` that a restart may
    cure) one line with where the program was, not rabit_py's frames and the
    MPI errors under them. ``verbose`` (``RABIT_LOG_LEVEL=DEBUG``): every
    traceback in full."""

    def printer(exc_type: Any, exc: Any, tb: Any) -> None:
        if verbose:
            previous(exc_type, exc, tb)
        elif is_secondary(exc):
            sys.stderr.write(f"rabit_py: {_without_rank(str(exc), rank)} (this is rank "
                             f"{rank}; RABIT_LOG_LEVEL=DEBUG prints its traceback)\n")
        elif isinstance(exc, RabitError) and is_restartable(exc):
            sys.stderr.write(f"rabit_py: rank {rank}: {exc_type.__name__}: "
                             f"{_without_rank(str(exc), rank)}{_where(tb)}\n")
        else:
            previous(exc_type, exc, tb)

    return printer


def end_job_on_uncaught(exc_type: Any, exc: BaseException, rank: int, reporter: Reporter,
                        find_notice: Callable[[float], Optional[Tuple[int, int]]],
                        announce: Callable[[], None], comm: Any) -> None:
    """End the job after an uncaught ``exc`` on ``rank`` (Note [uncaught
    errors]): report or wait for the cause, tell the peers, abort ``comm``."""
    told = None
    if is_secondary(exc):
        told = find_notice(SECONDARY_GRACE_S)
    else:
        reporter.fatal(RESTART if is_restartable(exc) else BUG,
                       f"rank {rank}: uncaught {exc_type.__name__}: {exc}")
    if not is_secondary(exc):
        sys.stderr.write(f"rabit_py: rank {rank}: uncaught {exc_type.__name__}; "
                         f"aborting the job so the other ranks do not wait for it\n")
    sys.stderr.flush()
    if told is None:
        announce()
    abort_job(comm, reporter)


def _where(tb: Any) -> str:
    """" (at FILE:LINE, in FUNCTION)" for the program's innermost frame of a
    traceback (the last one outside rabit_py), or ""."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = ""
    for frame in traceback.extract_tb(tb):
        if not os.path.abspath(frame.filename).startswith(package + os.sep):
            found = f" (at {frame.filename}:{frame.lineno}, in {frame.name})"
    return found


def _without_rank(message: str, rank: int) -> str:
    """``message`` without its leading "rank N: " (said once, at the end)."""
    prefix = f"rank {rank}: "
    return message[len(prefix):] if message.startswith(prefix) else message


def causes(exc: BaseException) -> List[BaseException]:
    """``exc`` and what it was raised from (wrappers such as KVStoreError)."""
    chain: List[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__      # type: ignore[assignment]
    return chain


def is_restartable(exc: BaseException) -> bool:
    """Whether a restart from the durable checkpoint may cure what ended a rank:
    a lost peer, a timeout or an I/O error may not happen again; any other
    uncaught exception is a bug that a restart repeats."""
    return any(isinstance(e, (CollectiveTimeoutError, OSError))
               or getattr(e, "restartable", False) for e in causes(exc))


def is_secondary(exc: BaseException) -> bool:
    """Whether ``exc`` only says that another rank ended the job (that rank
    reports the cause)."""
    return any(getattr(e, "secondary", False) for e in causes(exc))


def abort_init(comm: Any, reporter: Reporter, rank: int, timeout: float) -> None:
    """``init()`` overstayed ``timeout``: report it and abort the job."""
    message = (f"rank {rank}: init() did not complete within {timeout:g} s: some rank of "
               f"the communicator did not call rabit.init() (it failed or is stuck before "
               f"it). Aborting the job.")
    sys.stderr.write(f"rabit_py: {message}\n")
    sys.stderr.flush()
    reporter.fatal(RESTART, message)
    abort_job(comm, reporter)


def abort_job(comm: Any, reporter: Optional[Reporter], code: int = 1,
              fallback_s: float = 10.0) -> None:
    """``MPI_Abort`` on ``comm``, made sure to end this process.

    With ULFM, ``MPI_Abort`` can block for good when the job is recovering or
    already revoked (seen in CI); the process then ends itself after
    ``fallback_s`` seconds, leaving rabit-run a ``failed`` mark first
    (``os._exit`` skips the atexit hook that writes it)."""
    if reporter is not None:
        reporter.exited(False)
    timer = threading.Timer(fallback_s, os._exit, (code,))
    timer.daemon = True
    timer.start()
    comm.Abort(code)
