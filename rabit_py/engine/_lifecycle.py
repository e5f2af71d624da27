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
from typing import Any, Callable, List, Optional, Tuple

from .._status import BUG, RESTART, Reporter
from ..errors import CollectiveTimeoutError

__all__ = ["install_excepthook", "end_job_on_uncaught", "abort_job", "abort_init",
           "is_restartable", "is_secondary", "SECONDARY_GRACE_S"]

SECONDARY_GRACE_S = 5.0     # an uncaught secondary error waits this long for the cause

Hook = Callable[[Any, BaseException], None]


def install_excepthook(end_job: Hook) -> Any:
    """Make ``sys.excepthook`` print the traceback, then call
    ``end_job(exc_type, exc)``. Returns the hook it replaced (to restore)."""
    previous = sys.excepthook

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        previous(exc_type, exc, tb)
        end_job(exc_type, exc)

    sys.excepthook = hook
    return previous


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
    sys.stderr.write(f"rabit_py: rank {rank}: uncaught {exc_type.__name__}; "
                     f"aborting the job so the other ranks do not wait for it\n")
    sys.stderr.flush()
    if told is None:
        announce()
    abort_job(comm, reporter)


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
