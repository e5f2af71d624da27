"""The call frame: what every collective of both engines goes through once.

A collective is *framed*: numbered (its token ``(kind, version, seqno)``),
watched (Note [timeouts] in ``_watchdog.py``), checked (Note [signature check]
in ``_signature.py``), and an MPI error raised inside it becomes a rabit_py
exception here, in :meth:`CallFrame.failure`, the one place that decides
what an MPI error means. The frame also holds what every part of an engine
reads: the communicators, this rank, the world size, the version and call
number, and whether the engine is broken or finalized.

The two engines differ in one decision, made at construction: whether a lost
peer is recovered (``recovers``: the failure is a ``PeerFailure``, for the
robust engine's repair loop) or ends the job (``RecoveryError``, and rabit-run
is told that a restart may help).

# Note [revoked success]
Under ULFM a collective that a peer's revoke interrupts can return success
on the ranks still inside it, with part of the data (for pickles, an
``UnpicklingError`` on one rank while the others raise ``RecoveryError``). A
call's result is trusted only if its communicator was not revoked when it
returned (:meth:`CallFrame.check_revoked`, 0.1 us, local); otherwise it counts
as interrupted, as if it had raised. Communicators of our own beside the
engine's (the shared-memory path's node and leaders communicators) are
checked the same way.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from ._mpistart import ERR_PROC_FAILED, ERR_REVOKED, MPI

from .._status import ABORT, RESTART, Reporter
from ..config import Config
from ..errors import (CollectiveMismatchError, CollectiveTimeoutError, PeerFailure, RabitError,
                      RecoveryError)
from ._lifecycle import abort_job, end_job_on_uncaught, mark_every_rank
from . import _control as control
from ._signature import (Call, CheckVector, Kind, call_signature, describe_mismatch,
                         mismatched_fields)
from ._watchdog import (FATAL_NOTICE_TAG, TIMEOUT_NOTICE_TAG, Position, Watchdog, announce,
                        exchange_positions, find_notice, timeout_message)

__all__ = ["CallFrame"]

log = logging.getLogger("rabit_py")


class CallFrame:
    """Numbering, watchdog, signature check and MPI-error translation of an
    engine's collectives, and the state they share.

    Args:
        config: the job's settings.
        ulfm: whether the job runs with MPI fault tolerance.
        recovers: whether a lost peer is recovered in the job (the robust
            engine) rather than ending it.

    Fields (read by the engines; set where noted):
        comm, ctrl, rank, size: the data and control communicators and this
            rank's place in them (:meth:`use`).
        check: whether calls are signature-checked (``config.check`` and
            more than one rank; set by the engine).
        version, seqno: the committed version and the number of the next
            call since it; token: ``(kind, version, seqno)`` of the current call.
        broken: why the engine cannot be used any more, or None.
        finalized: whether ``finalize`` ran.
        membership: bumped each time the communicators are replaced.
        watchdog, reporter: the timeout watchdog (None without timeouts or
            status folder) and the status reporter (set by the engine).
    """

    def __init__(self, config: Config, ulfm: bool, recovers: bool) -> None:
        self.config = config
        self.ulfm = ulfm
        self.recovers = recovers
        self.comm: Any = None
        self.ctrl: Any = None
        self.rank = 0
        self.size = 1
        self.check = False
        self.version = 0
        self.seqno = 0
        self.token: Tuple[int, int, int] = (0, 0, 0)
        self.broken: Optional[str] = None
        self.finalized = False
        self.membership = 0
        self.watchdog: Optional[Watchdog] = None
        self.preparing = False      # inside the program's prepare_fun (run_prepare)
        self.reporter = Reporter(None, "")
        self._check_vector = CheckVector()
        # The check's MPI message with its datatype given: spares mpi4py's
        # look-up of it (0.2 us a call; Note [small allreduce] in robust.py).
        self._check_message = [self._check_vector.vec, MPI.INT64_T]
        # Note [check on the node] in _shm.py: the node reducer's exchange, or
        # None for MPI's Allreduce.
        self._check_exchange: Optional[Callable[[np.ndarray], None]] = None

    def use(self, comm: Any, ctrl: Any) -> None:
        """Run on ``comm``, with ``ctrl`` for control traffic."""
        self.comm, self.ctrl = comm, ctrl
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._check_exchange = None

    @property
    def checks_on_node(self) -> bool:
        """Whether the signature check runs on the node's memory, where its
        outcome is uniform (Note [uniform check] in ``_shm.py``)."""
        return self.check and self._check_exchange is not None

    def use_check_exchange(self, exchange: Optional[Callable[[np.ndarray], None]]) -> None:
        """Exchange the signature check's vector with ``exchange(vec)`` (it
        leaves every rank's elementwise maximum in ``vec``, collectively, and
        raises ``MPI.Exception`` as MPI would) from the next call on; None:
        with MPI's ``Allreduce`` (Note [check on the node] in ``_shm.py``)."""
        self._check_exchange = exchange

    # The numbering of calls and versions is written here only (the engines
    # read ``version``, ``seqno`` and ``membership``; tests/unit/test_layout.py
    # checks that no other module assigns them).
    def next_version(self) -> None:
        """A checkpoint committed: the next version, its calls numbered from 0."""
        self.version += 1
        self.seqno = 0

    def number_from(self, seqno: int) -> None:
        """The next call is ``seqno`` of this version (a load, a replay, a
        recovery round that resumes the count)."""
        self.seqno = seqno

    def adopt_version(self, version: int) -> None:
        """This rank now holds ``version`` (loaded from disk, or served by the
        survivors to a replacement)."""
        self.version = version

    def repaired(self) -> None:
        """The communicators were replaced: transports made for the old ones
        must be made again (``membership`` changes)."""
        self.membership += 1

    @property
    def timed_out(self) -> bool:
        """Whether the watchdog fired for the current call."""
        return self.watchdog is not None and self.watchdog.fired is not None

    # ---------------------------------------------------------------- framing
    def enter(self, kind: int, error: Optional[BaseException], numbered: bool,
              call: Optional[Call]) -> None:
        """Start a collective: number it, arm the watchdog, run the signature
        check. Raises the input's refusal (``error``) or a mismatch on every rank."""
        if self.broken is not None or self.finalized:
            raise RabitError(self.broken or f"rank {self.rank}: the engine was finalized; "
                                            f"call init() again")
        if error is not None:
            error.args = (f"rank {self.rank}: {error.args[0]}",) + error.args[1:]
        # Calls are numbered from 0 after each checkpoint; a checkpoint (or
        # finalize) carries the number of calls made before it.
        self.token = (kind, self.version, self.seqno)
        if numbered:
            self.seqno += 1
        if error is not None and not self.check:
            raise error
        if self.watchdog is not None:
            self.watchdog.enter(self.token)
        if not self.check:
            return
        try:
            self._agree(kind, call, error)
        except MPI.Exception as exc:
            self.leave()
            raise self.failure(exc) from exc
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        """End the current collective (disarm the watchdog)."""
        if self.watchdog is not None:
            self.watchdog.leave()

    def sync(self, kind: int, error: Optional[BaseException]) -> None:
        """A call with no data of its own (checkpoint, finalize): only the check."""
        self.enter(kind, error, False, None)
        self.leave()

    def guarded(self, kind: int, fn: Callable[[], Any], agreement: bool = False) -> Any:
        """Run MPI work of the current call under the watchdog, with MPI errors
        turned into exceptions (:meth:`failure`), and its outcome trusted only
        if the communicator was not revoked meanwhile (Note [revoked
        success]); ``agreement``: ``fn`` is an ``Agree``, whose outcome is
        uniform even on a revoked communicator and must stand."""
        self.token = (kind, self.version, self.seqno)
        if self.watchdog is not None:
            self.watchdog.enter(self.token)
        try:
            result = fn()
            if not agreement:
                self.check_revoked()
            return result
        except MPI.Exception as exc:
            raise self.failure(exc) from exc
        except (RabitError, PeerFailure):
            raise
        except Exception as exc:
            # mpi4py unpickles inside its call: a half-filled message from a
            # revoked collective (Note [revoked success]) raises before
            # check_revoked can run.
            if not agreement and self.ulfm and self._interrupted_by_failure():
                raise self.failure(MPI.Exception(ERR_REVOKED)) from exc
            raise
        finally:
            self.leave()

    def _agree(self, kind: int, call: Optional[Call], error: Optional[BaseException]) -> None:
        """See Note [signature check]."""
        seq = self.token[2]
        check = self._check_vector
        sent = check.fill(self.version, seq, kind, call, error)
        vec = check.vec
        exchange = self._check_exchange
        if exchange is None:
            self.comm.Allreduce(MPI.IN_PLACE, self._check_message, op=MPI.MAX)
        else:
            exchange(vec)
        if not check.agreed(sent):
            fields = mismatched_fields(vec)
            mine = call_signature(self.version, seq, kind, call, error)
            # Note [mismatch exchange]
            # The descriptions go on the control communicator. A rank
            # that raised first may revoke the data communicator (its uncaught
            # exception ends the job) while slower ranks are still here; under
            # ULFM their collective then returns "success" with half-filled
            # buffers (Note [revoked success]).
            everyone = control.allgather(self.ctrl, mine.describe(), "check.mismatch")
            message = describe_mismatch(self.rank, mine, fields, everyone)
            if any(d["kind"] == "finalize" for d in everyone):
                # A rank that finalized is gone: nothing more can be agreed with it.
                self.broken = message
            if error is not None:
                raise error
            mismatch = CollectiveMismatchError(message)
            if "status" in fields:
                # Another rank's input was refused: that rank raises and
                # prints its own error; this one only repeats it.
                mismatch.secondary = True
            else:
                mark_every_rank(mismatch)       # the same agreed outcome everywhere
            raise mismatch
        if error is not None:
            raise error

    # --------------------------------------------------------------- failures
    def failure(self, exc: "MPI.Exception") -> BaseException:
        """What an MPI error raised inside a collective means, as the
        exception to raise: a timeout, a rank that stopped the job, a lost
        peer (``PeerFailure`` when this engine ``recovers``, else
        ``RecoveryError``), or a plain MPI error (the engine is then broken)."""
        error_class = exc.Get_error_class()
        fired = self.timed_out
        if (self.ulfm and error_class not in (ERR_PROC_FAILED, ERR_REVOKED) and not fired
                and self._interrupted_by_failure()):
            # Open MPI's nonblocking-schedule collectives (libnbc) report a
            # peer's death as MPI_ERR_OTHER ("NBC_Progress: an error 75 was
            # found during schedule", 75 being MPI_ERR_PROC_FAILED). A peer
            # is gone: it is that, not a bug.
            error_class = ERR_REVOKED if self.comm.Is_revoked() else ERR_PROC_FAILED
        lost = error_class in (ERR_PROC_FAILED, ERR_REVOKED)
        if lost and not fired and self.ulfm:
            notice = self.notice(wait=0.05 if error_class == ERR_REVOKED else 0.0)
            tag, sender = notice if notice is not None else (None, None)
            if tag == FATAL_NOTICE_TAG:
                # Both engines: the revoke came from a rank that ends the job.
                self.broken = (f"rank {self.rank}: rank {sender} stopped the job with an "
                               f"uncaught exception (see its traceback)"
                               + ("; a replacement would repeat the bug, so the job is not "
                                  "recovered" if self.recovers else ""))
                error = RabitError(self.broken)
                error.secondary = True      # that rank reports it
                return error
        else:
            tag = None
        if self.recovers and lost and not fired:
            if tag != TIMEOUT_NOTICE_TAG:
                if error_class == ERR_PROC_FAILED:
                    try:
                        self.comm.Revoke()  # wake the ranks blocked in later calls
                    except MPI.Exception:
                        pass
                return PeerFailure(f"rank {self.rank}: a peer process failed "
                                   f"({exc.Get_error_string()})", error_class)
        if fired or error_class == ERR_REVOKED:
            watched = self.watchdog.fired if self.watchdog is not None else None
            token = (watched if fired else None) or self.token
            positions = exchange_positions(self.ctrl, self.rank, self.size,
                                           (token[1], token[2], token[0], int(fired)),
                                           self._grace())
            if fired or any(p[3] for p in positions.values()):
                self.broken = self._timeout_message(token, positions)
                # Not marked every_rank: ranks stuck elsewhere (a repair) may
                # never raise it.
                return CollectiveTimeoutError(self.broken)
        if lost:
            failure = PeerFailure(
                f"rank {self.rank}: a peer process failed during "
                f"{Kind.NAMES.get(self.token[0], '?')} #{self.token[2]} "
                f"(version {self.version}): {exc.Get_error_string()}", error_class)
            return failure if self.recovers else self._no_recovery(failure)
        self.broken = (f"rank {self.rank}: MPI error in collective #{self.token[2]} "
                       f"(version {self.version}): {exc.Get_error_string()}")
        return RabitError(self.broken)

    def _no_recovery(self, failure: PeerFailure) -> BaseException:
        """A dead peer under an engine that does not recover: the job must end."""
        self.broken = (f"{failure} -- the 'mpi' engine cannot recover from a failed rank. "
                       f"Run under rabit-run with engine='robust' (RABIT_ENGINE=robust) for "
                       f"in-job recovery, or restart the job from a durable checkpoint.")
        # The job cannot go on, whatever the program does next: tell rabit-run
        # now. A program that catches the error, or meets it at finalize
        # (where the excepthook is gone), would otherwise leave the job to
        # ranks that may never return: survivors blocked inside a library's
        # own communication, while this rank waits for them in MPI_Finalize.
        self.reporter.fatal(RESTART, self.broken)
        return RecoveryError(self.broken)

    def check_revoked(self) -> None:
        """Raise the failure of an interrupted call if the communicator was
        revoked (Note [revoked success])."""
        if self.ulfm and self.comm.Is_revoked():
            raise self.failure(MPI.Exception(ERR_REVOKED))

    def _interrupted_by_failure(self, wait: float = 1.0) -> bool:
        """After a collective raised outside MPI (mpi4py unpickling half a
        message): whether a peer failed or the communicator was revoked. The
        revoke can come a moment after the call returned (milliseconds after
        the others raised ``MPI_ERR_REVOKED``), so this waits up to ``wait`` s
        for either; only this error path pays it."""
        deadline = time.monotonic() + wait
        while True:
            if self.comm.Is_revoked():
                return True
            try:
                failed = self.comm.Get_failed()
                count = failed.Get_size()
                failed.Free()
            except MPI.Exception:
                return True
            if count > 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    # ----------------------------------------------------- timeouts, notices
    def _grace(self) -> float:
        return min(1.0, max(0.1, self.config.timeout / 2))

    def on_timeout(self, token: tuple) -> None:
        """Watchdog thread: a call overstayed (see Note [timeouts])."""
        if self.ulfm:
            self.announce(TIMEOUT_NOTICE_TAG)
            return
        positions = exchange_positions(self.ctrl, self.rank, self.size,
                                       (token[1], token[2], token[0], 1), self._grace())
        sys.stderr.write(
            f"rabit_py: CollectiveTimeoutError: {self._timeout_message(token, positions)}\n"
            f"rabit_py: rank {self.rank}: aborting the job: without MPI fault tolerance a "
            f"blocked collective cannot be interrupted. Launch with rabit-run (or mpirun "
            f"--with-ft ulfm) to get a CollectiveTimeoutError exception instead.\n")
        sys.stderr.flush()
        self.reporter.fatal(RESTART, self._timeout_message(token, positions))
        abort_job(self.comm, self.reporter)

    def run_prepare(self, prepare_fun: Callable[[Any], None], data: Any) -> None:
        """Run the program's ``prepare_fun(data)`` inside a call: the
        heartbeat says ``prepare`` meanwhile, the program's own code (Note
        [hung ranks] in ``_watchdog.py``)."""
        self.preparing = True
        try:
            prepare_fun(data)
        finally:
            self.preparing = False

    def on_overdue(self, token: tuple, waited: float) -> bool:
        """Watchdog thread: a call overstayed; where the job recovers in
        place under rabit-run, ask it to end the ranks that hold the call
        (Note [hung ranks] in ``_watchdog.py``) and give the call more time."""
        if not (self.recovers and self.ulfm and self.size > 1 and
                self.reporter.folder is not None):
            return False
        if self.preparing:
            return True     # this rank holds the call: the others ask for it to be ended
        self.reporter.overdue(token[1], token[2], token[0], waited)
        log.warning("rank %d: call #%d of version %d has waited %.1f s (RABIT_TIMEOUT=%g); "
                    "asked rabit-run to end the ranks that have not reached it, so that the "
                    "job replaces them", self.rank, token[2], token[1], waited,
                    self.config.timeout)
        return True

    def announce(self, tag: int) -> None:
        """Tell every peer that this rank ends the job (``tag``: why)."""
        if self.ulfm and self.size > 1:
            announce(self.ctrl, self.comm, self.rank, self.size, tag)

    def notice(self, wait: float = 0.05) -> Optional[Tuple[int, int]]:
        """A peer's notice that it ends the job: (tag, its rank), or None."""
        return find_notice(self.ctrl, wait)

    def end_job_on_uncaught(self, exc_type: Any, exc: BaseException, told: bool = False) -> None:
        """The excepthook's end of the job (Note [uncaught errors] in _lifecycle.py)."""
        end_job_on_uncaught(exc_type, exc, self.rank, self.reporter, self.notice,
                            lambda: self.announce(FATAL_NOTICE_TAG), self.comm, told)

    def abort(self, reason: str) -> None:
        """End the job on purpose (``rabit.abort``): rabit-run is told it is
        not to be restarted, the peers why they end; does not return."""
        message = f"rank {self.rank}: {reason}"
        sys.stderr.write(f"rabit_py: {message}; aborting the job\n")
        sys.stderr.flush()
        self.reporter.fatal(ABORT, message)
        if self.size == 1:
            self.reporter.exited(False)
            os._exit(1)             # MPI_Abort of a job of one only adds Open MPI's banner
        self.announce(FATAL_NOTICE_TAG)
        abort_job(self.comm, self.reporter)

    def _timeout_message(self, token: tuple, positions: Dict[int, Position]) -> str:
        return timeout_message(self.rank, self.size, self.config.timeout, token, positions)
