"""Collective timeouts: a watchdog thread, and the exchange that names who is late.

# Note [timeouts]
A blocked MPI call cannot be interrupted from Python, and nonblocking
collectives polled with ``Test`` cost 1.5-2.5x the blocking ones here. So calls
stay blocking and one daemon thread per engine watches them: entering a call
stores ``(token, start)`` in an attribute (no lock, no syscall: ~100 ns), and the
thread sleeps until the current call's deadline. When a call overstays, the
thread fires ``on_timeout``: with ULFM it revokes the communicator, so every
blocked rank's call returns ``ERR_REVOKED`` and raises
``CollectiveTimeoutError``; without ULFM nothing can unblock the call, so the job
is aborted with the message (better than a silent hang).

To name the ranks that did not arrive, each rank that stops (timed out, or saw
the revoke) sends where it is to every peer over a separate control
communicator, and listens for a short grace period. A peer that sends nothing
never reached a collective.

# Note [hung ranks]
A rank stuck in its own code (a deadlock, a read that never returns) holds
every rank that waits for it in a collective. Where the job replaces lost
ranks in place (the robust engine under ULFM) and runs under rabit-run (a
status folder), a call that reaches the collective timeout does not end the
job at once: the watchdog first writes an ``overdue`` request naming the call
(Note [status folder]) and gives the call ``overdue_grace`` more seconds.
rabit-run kills the ranks that are in their own code and behind that call,
or inside it in its ``prepare_fun`` (the heartbeat's ``prepare`` state; such a
rank's own watchdog asks nothing and takes the grace too): rule (f) of Note
[supervision], on other hosts through the launch agent. The waiting call
then fails as for any dead peer (no timeout was declared, so it is a
``PeerFailure``), and the job recovers and replays as after a crash:
bitwise the same results. If nothing ends the call within the grace (no
rank to end, a host that does not answer the launch agent, a rank that
arrived just then and holds the call for another reason), the timeout
fires as before, with the same message. A replacement that hangs at the
same place again is ended again, until the engine's crash-loop rule
(``RABIT_CRASH_LOOP``) ends the job as a bug. Without rabit-run nothing can
end another process, and the timeout fires at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from ._signature import Kind
from ._tags import FATAL_NOTICE_TAG, POSITIONS_TAG, TIMEOUT_NOTICE_TAG

log = logging.getLogger("rabit_py")

__all__ = ["Watchdog", "deadline", "exchange_positions", "Position", "announce", "find_notice",
           "timeout_message", "TIMEOUT_NOTICE_TAG", "FATAL_NOTICE_TAG"]

# (version, seqno, kind, timed_out)
Position = Tuple[int, int, int, int]


class Watchdog:
    """Fires ``on_timeout(token)`` when one call lasts longer than ``timeout``.

    Args:
        timeout: seconds; 0 = calls never time out (the thread then only
            beats, if it has a ``heartbeat``).
        on_timeout: called once, from the watchdog thread, with the token of the
            call that overstayed. The watchdog stops after firing.
        heartbeat: called from the watchdog thread about every ``period``
            seconds (the status report to rabit-run, Note [status folder]),
            so that reporting costs the calls nothing.
        period: seconds between heartbeats.
        on_overdue: called first, once per call that overstays, with its
            token and how long it lasted; if it returns True (the ranks that
            hold the call are being ended: Note [hung ranks]), the call gets
            ``overdue_grace`` more seconds before ``on_timeout`` fires, and
            the watchdog goes on if it ends meanwhile.
        overdue_grace: seconds, see ``on_overdue``.
    """

    def __init__(self, timeout: float, on_timeout: Callable[[Any], None],
                 heartbeat: Optional[Callable[[], None]] = None, period: float = 1.0,
                 on_overdue: Optional[Callable[[Any, float], bool]] = None,
                 overdue_grace: float = 10.0) -> None:
        self.timeout = float(timeout)
        self._on_timeout = on_timeout
        self._on_overdue = on_overdue
        self._overdue_grace = overdue_grace
        self._overdue: Optional[Tuple[Any, float]] = None     # the call given the grace
        self._heartbeat = heartbeat
        self._period = period
        self._current: Optional[Tuple[Any, float]] = None
        self._stop = threading.Event()
        self.fired: Optional[Any] = None
        self._thread = threading.Thread(target=self._run, name="rabit-watchdog", daemon=True)
        self._thread.start()

    @property
    def in_call(self) -> bool:
        """Whether a call is in progress."""
        return self._current is not None

    def enter(self, token: Any) -> None:
        """A call starts now."""
        self._current = (token, time.monotonic())

    def leave(self) -> None:
        """The current call ended."""
        self._current = None

    def stop(self) -> None:
        """End the thread (idempotent)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        next_beat = time.monotonic()
        while True:
            now = time.monotonic()
            if self._heartbeat is not None and now >= next_beat:
                try:
                    self._heartbeat()
                except Exception:  # noqa: BLE001 - a report must not stop the watchdog
                    log.debug("heartbeat failed", exc_info=True)
                next_beat = now + self._period
            wait = next_beat - now if self._heartbeat is not None else 3600.0
            current = self._current
            if current is not None and self.timeout > 0:
                graced = current is self._overdue
                left = current[1] + self.timeout + (self._overdue_grace if graced else 0) - now
                if left <= 0:
                    if self._current is not current:
                        continue
                    if (not graced and self._on_overdue is not None
                            and self._on_overdue(current[0], now - current[1])):
                        self._overdue = current
                        continue
                    self.fired = current[0]
                    self._on_timeout(current[0])
                    return
                wait = min(wait, left)
            elif self.timeout > 0:
                wait = min(wait, self.timeout)
            if self._stop.wait(max(wait, 0.0)):
                return


@contextlib.contextmanager
def deadline(timeout: float, on_timeout: Callable[[Any], None],
             token: Any = "deadline") -> Iterator[None]:
    """Run the block under a watchdog of its own: ``on_timeout(token)`` fires
    (from the watchdog thread) if the block lasts longer than ``timeout``
    seconds; 0 means no limit. For steps no revoke can interrupt (a
    communicator's start or repair), which must end the job, not hang it."""
    guard = Watchdog(timeout, on_timeout) if timeout > 0 else None
    if guard is not None:
        guard.enter(token)
    try:
        yield
    finally:
        if guard is not None:
            guard.leave()
            guard.stop()


def exchange_positions(comm: Any, rank: int, size: int, mine: Position,
                       grace: float) -> Dict[int, Position]:
    """Tell every peer where this rank stopped, and hear where they stopped.

    Uses point-to-point messages on ``comm`` (a control communicator that was
    not revoked) and waits at most ``grace`` seconds. Never raises.

    Returns:
        ``{rank: position}`` for this rank and every peer heard from.
    """
    heard: Dict[int, Position] = {rank: mine}
    try:
        sendbuf = np.array(mine, dtype=np.int64)
        recvbufs = {p: np.zeros(4, dtype=np.int64) for p in range(size) if p != rank}
        sends = [comm.Isend(sendbuf, dest=p, tag=POSITIONS_TAG) for p in recvbufs]
        recvs = {p: comm.Irecv(buf, source=p, tag=POSITIONS_TAG) for p, buf in recvbufs.items()}
        deadline = time.monotonic() + grace
        while recvs and time.monotonic() < deadline:
            for p, req in list(recvs.items()):
                if req.Test():
                    heard[p] = tuple(int(x) for x in recvbufs[p])  # type: ignore[assignment]
                    del recvs[p]
            time.sleep(0.001)
        for req in recvs.values():
            req.Cancel()
        for req in sends:
            # Eager sends have completed; a send to a peer that never listens
            # is left behind: the engine is unusable after this anyway.
            req.Test()
    except Exception:  # noqa: BLE001 - best effort, the caller raises the real error
        pass
    return heard


def announce(ctrl: Any, comm: Any, rank: int, size: int, tag: int) -> None:
    """Tell every peer why this rank is about to break the job (a timeout, or
    an uncaught exception), then revoke ``comm`` to wake them (ULFM only).

    With ULFM, MPI_Abort does not reliably end a job whose ranks are busy
    recovering: the peers must learn, while this rank is still alive, that
    this is not a failure to recover from (they look with :func:`find_notice`).
    """
    try:
        notice = np.array([rank], dtype=np.int64)
        for peer in range(size):
            if peer != rank:
                ctrl.Isend(notice, dest=peer, tag=tag)
        comm.Revoke()
        if tag == FATAL_NOTICE_TAG:
            time.sleep(1.0)     # let the peers see the revoke while we are alive
    except Exception:  # noqa: BLE001 - best effort on a job that is ending
        log.exception("rank %d: announcing the end of the job failed", rank)


def find_notice(ctrl: Any, wait: float) -> Optional[Tuple[int, int]]:
    """A peer's notice (fatal first) as (tag, the rank that sent it), looking
    for ``wait`` seconds."""
    from mpi4py import MPI

    deadline = time.monotonic() + wait
    status = MPI.Status()
    while True:
        for tag in (FATAL_NOTICE_TAG, TIMEOUT_NOTICE_TAG):
            try:
                if ctrl.Iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status):
                    return tag, status.Get_source()
            except MPI.Exception:   # a dead peer on the control communicator
                return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.002)


def timeout_message(rank: int, size: int, timeout: float, token: tuple,
                    positions: Dict[int, Position]) -> str:
    """The text of a ``CollectiveTimeoutError``: the call, who timed out, who
    did not arrive, who waited elsewhere, and what to do."""
    kind, version, seqno = token
    call = f"{Kind.NAMES.get(kind, kind)} #{seqno} (version {version})"
    here = (version, seqno, kind)
    waiting = sorted(r for r, p in positions.items() if p[:3] == here)
    elsewhere = sorted((r, p) for r, p in positions.items() if p[:3] != here)
    missing = sorted(set(range(size)) - set(positions))
    timed_out = sorted(r for r, p in positions.items() if p[3])
    if rank in timed_out:
        head = f"rank {rank}: {call} did not complete within {timeout:g} s."
    else:
        head = (f"rank {rank}: {call} was aborted: rank(s) {_list(timed_out)} timed out "
                f"after {timeout:g} s.")
    parts = [head]
    if len(positions) > 1 or missing:
        if missing:
            parts.append(f"Rank(s) {_list(missing)} did not arrive "
                         f"({'rank' if len(waiting) == 1 else 'ranks'} {_list(waiting)} "
                         f"{'was' if len(waiting) == 1 else 'were'} waiting in it).")
        for r, p in elsewhere:
            parts.append(f"Rank {r} was waiting in {Kind.NAMES.get(p[2], p[2])} "
                         f"#{p[1]} (version {p[0]}) instead.")
    else:
        parts.append("Which ranks did not arrive is unknown (no peer answered).")
    parts.append("A rank that stops calling collectives (an exception, an early return, "
                 "a long computation) leaves the others waiting; if the work between two "
                 "collectives is legitimately long, raise RABIT_TIMEOUT / "
                 "init(timeout=...). This engine cannot be used any more: end the job.")
    return " ".join(parts)


def _list(ranks: Any) -> str:
    return ",".join(str(r) for r in ranks) or "none"
