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

# Note [one failure, read once]
One failure should read once, however many ranks raise it. An error that
every rank raises with the same meaning -- the outcome of an agreement: a
mismatch found by the signature check, ranks started with different
settings, a bad setting, a checkpoint folder or a durable checkpoint that
cannot be used -- is marked ``every_rank`` where it is made (not a timeout:
ranks stuck elsewhere may never raise it). Rank 0 prints it and reports it to
rabit-run; the other ranks wait for its notice (as secondary errors do) and
end quietly; if none comes (rank 0 caught the error), they print and report
it themselves. An error that rabit_py raised is printed as the program's own
frames and the message (rabit_py's frames, and the MPI errors under them,
tell a user nothing); an error of the program's own code as Python prints
it. ``RABIT_LOG_LEVEL=DEBUG`` prints every traceback of every rank; an
excepthook that the program installed is called instead of ours. rabit-run's
verdict names the earliest report (the cause), once.

An error of ``init`` that every rank raises comes before the engine and its
notices (:func:`print_once`): there the other ranks stay a moment before
they exit, since mpirun ends the whole job at the first rank that exits with
an error, which can kill rank 0 before it has printed (rabit-run would
then say "its error is above" and nothing would be).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, List, Optional, Tuple

from .._status import BUG, RESTART, Reporter
from ..errors import CollectiveTimeoutError, RabitError

__all__ = ["install_excepthook", "end_job_on_uncaught", "abort_job", "abort_init",
           "is_restartable", "is_secondary", "is_every_rank", "mark_every_rank",
           "user_traceback", "cause_text", "print_once", "raised_by_rabit_py",
           "SECONDARY_GRACE_S", "kill_self"]

SECONDARY_GRACE_S = 5.0     # an uncaught secondary error waits this long for the cause

Hook = Callable[[Any, BaseException, bool], None]


def install_excepthook(end_job: Hook, rank: int, verbose: bool = False,
                       wait_for_notice: Optional[Callable[[float], Any]] = None
                       ) -> Tuple[Any, Any]:
    """Make ``sys.excepthook`` print the error (:func:`error_printer`) and
    call ``end_job(exc_type, exc, told)``. An error raised on every rank is
    printed and reported by rank 0 only (Note [one failure, read once]): the
    other ranks wait up to ``SECONDARY_GRACE_S`` for its notice
    (``wait_for_notice``) and end quietly (``told`` True); without it (rank
    0 caught the error) they print and report it themselves. Returns the
    hook it replaced (to restore) and the printer alone (for after the
    engine ended)."""
    previous = sys.excepthook
    printer = error_printer(previous, rank, verbose)

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        if (not verbose and rank != 0 and wait_for_notice is not None and is_every_rank(exc)
                and wait_for_notice(SECONDARY_GRACE_S) is not None):
            if previous is not sys.__excepthook__:
                previous(exc_type, exc, tb)     # the program's own hook runs everywhere
            end_job(exc_type, exc, True)
            return
        printer(exc_type, exc, tb)
        end_job(exc_type, exc, False)

    sys.excepthook = hook
    return previous, printer


def error_printer(previous: Any, rank: int, verbose: bool = False) -> Any:
    """An excepthook that prints what a user needs of an uncaught error on
    ``rank`` (Note [one failure, read once]): a secondary error as one line
    naming the rank that stopped the job; a fault (a lost peer, a timeout: a
    ``RabitError`` that a restart may cure) as one line with where the
    program was; any other error that rabit_py raised as a traceback of the
    program's own frames and the message once ("on every rank" when every
    rank raised it); an error of the program's own code as Python prints it.
    ``verbose`` (``RABIT_LOG_LEVEL=DEBUG``): every traceback in full. A
    program that installed an excepthook of its own gets it called instead."""

    def printer(exc_type: Any, exc: Any, tb: Any) -> None:
        if verbose or previous is not sys.__excepthook__:
            previous(exc_type, exc, tb)     # everything, or the program's own hook
        elif is_secondary(exc):
            sys.stderr.write(f"rabit_py: {_first_line(_without_rank(str(exc), rank))} (this is "
                             f"rank {rank}; RABIT_LOG_LEVEL=DEBUG prints its traceback)\n")
        elif isinstance(exc, RabitError) and is_restartable(exc):
            sys.stderr.write(f"rabit_py: {_ranks_word(exc, rank)}: {exc_type.__name__}: "
                             f"{_without_rank(str(exc), rank)}{_where(tb)}\n")
        elif _raised_by_rabit_py(tb):
            sys.stderr.write(user_traceback(exc_type, exc, tb, rank))
        else:
            previous(exc_type, exc, tb)

    return printer


# Seconds the ranks that print nothing stay after an every-rank error of
# init, so that rank 0's print is not cut short by the job's teardown.
_QUIET_EXIT_DELAY = 2.0


def print_once(exc: BaseException, rank: int) -> None:
    """``exc`` is on its way out of ``init`` on every rank (a bad setting,
    ranks started with different settings, an unusable checkpoint folder),
    before an engine (and its excepthook) exists: if it is left uncaught,
    rank 0 prints it as :func:`user_traceback`, the other ranks nothing
    (Note [one failure, read once]). Any other error is printed as before."""
    previous = sys.excepthook
    verbose = os.environ.get("RABIT_LOG_LEVEL", "").upper() == "DEBUG"

    def hook(exc_type: Any, value: Any, tb: Any) -> None:
        if value is not exc or verbose or previous is not sys.__excepthook__:
            previous(exc_type, value, tb)
        elif rank == 0:
            sys.stderr.write(user_traceback(exc_type, value, tb, rank))
            sys.stderr.flush()
        else:
            time.sleep(_QUIET_EXIT_DELAY)    # rank 0 prints first (see the Note)

    sys.excepthook = hook


def user_traceback(exc_type: Any, exc: BaseException, tb: Any, rank: int) -> str:
    """The traceback of an error that rabit_py raised, as the program's
    frames (rabit_py's own are left out) and the message without its
    leading "rank N: ", naming the rank (or "every rank")."""
    frames = [f for f in traceback.extract_tb(tb) if not _in_package(f.filename)]
    name = f"{exc_type.__module__}.{exc_type.__qualname__}" \
        if exc_type.__module__ not in ("builtins", "__main__") else exc_type.__qualname__
    text = ["Traceback (most recent call last):\n"] if frames else []
    text += traceback.format_list(frames)
    text.append(f"{name} ({_ranks_word(exc, rank)}): {_without_rank(str(exc), rank)}\n")
    return "".join(text)


def cause_text(exc_type: Any, exc: BaseException, rank: int) -> str:
    """One line for rabit-run's verdict: the error, where, and its first line."""
    return (f"{exc_type.__name__} on {_ranks_word(exc, rank)}: "
            f"{_first_line(_without_rank(str(exc), rank)).rstrip(':')}")


def end_job_on_uncaught(exc_type: Any, exc: BaseException, rank: int, reporter: Reporter,
                        find_notice: Callable[[float], Optional[Tuple[int, int]]],
                        announce: Callable[[], None], comm: Any, told: bool = False) -> None:
    """End the job after an uncaught ``exc`` on ``rank`` (Note [uncaught
    errors]): report or wait for the cause, tell the peers, abort ``comm``.
    ``told``: the rank that reports the cause has told us already (an
    every-rank error that rank 0 reported)."""
    notice: Any = True if told else None
    if told:
        pass
    elif is_secondary(exc):
        notice = find_notice(SECONDARY_GRACE_S)
    else:
        reporter.fatal(RESTART if is_restartable(exc) else BUG, cause_text(exc_type, exc, rank))
        if is_every_rank(exc):
            sys.stderr.write(f"rabit_py: every rank raised this {exc_type.__name__}; ending "
                             f"the job\n")
        elif not (isinstance(exc, RabitError) and is_restartable(exc)):
            sys.stderr.write(f"rabit_py: rank {rank}: uncaught {exc_type.__name__}; "
                             f"aborting the job so the other ranks do not wait for it\n")
    sys.stderr.flush()
    if notice is None:
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
    """``message`` without its leading "rank N: " (said once, elsewhere)."""
    prefix = f"rank {rank}: "
    return message[len(prefix):] if message.startswith(prefix) else message


def _first_line(message: str) -> str:
    return message.split("\n", 1)[0]


def _ranks_word(exc: BaseException, rank: int) -> str:
    return "every rank" if is_every_rank(exc) else f"rank {rank}"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB = os.path.dirname(os.path.abspath(os.__file__))


def _in_package(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE + os.sep)


def _raised_by_rabit_py(tb: Any) -> bool:
    """Whether the innermost frame of a traceback is rabit_py's (the error is
    rabit_py's: a refused input, a mismatch; not the program's own)."""
    frames = traceback.extract_tb(tb)
    return bool(frames) and _in_package(frames[-1].filename)


def raised_by_rabit_py(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in rabit_py's own code (or in a library it
    called), not in the program's: its innermost frame outside the standard
    library and site-packages is rabit_py's."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        name = frame.filename
        if name.startswith("<frozen ") or (not name.startswith("<") and (
                not os.path.isfile(name)                # a compiled module's (mpi4py's .pyx)
                or os.path.abspath(name).startswith(_STDLIB)
                or "-packages" + os.sep in name)):     # site- or dist-packages
            continue                                    # a library's frame: look further
        return _in_package(name)                        # rabit_py's, or the program's own
    return False


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


def is_every_rank(exc: BaseException) -> bool:
    """Whether ``exc`` was raised on every rank with the same meaning (an
    agreement's outcome: a mismatch, different settings): one
    rank prints it (Note [one failure, read once])."""
    return any(getattr(e, "every_rank", False) for e in causes(exc))


def mark_every_rank(exc: BaseException) -> BaseException:
    """Mark ``exc`` as raised on every rank (:func:`is_every_rank`); returns it.
    A ``RabitError`` has the field; a bad setting's ``TypeError`` or
    ``ValueError`` gets the attribute."""
    exc.every_rank = True       # type: ignore[attr-defined]
    return exc


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


def kill_self(message: str) -> None:
    """Say ``message`` on stderr, then end this process with SIGKILL: the
    others see a lost rank, which the robust engine replaces (no exit
    handler runs, no MPI call is made: either could block here)."""
    sys.stdout.flush()
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def abort_job(comm: Any, reporter: Optional[Reporter], code: int = 1,
              fallback_s: float = 10.0) -> None:
    """``MPI_Abort`` on ``comm``, made sure to end this process.

    With ULFM, ``MPI_Abort`` can block for good when the job is recovering or
    already revoked; the process then ends itself after
    ``fallback_s`` seconds, leaving rabit-run a ``failed`` mark first
    (``os._exit`` skips the atexit hook that writes it)."""
    if reporter is not None:
        reporter.exited(False)
    timer = threading.Timer(fallback_s, os._exit, (code,))
    timer.daemon = True
    timer.start()
    comm.Abort(code)
