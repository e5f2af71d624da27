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
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

__all__ = ["Watchdog", "exchange_positions", "Position"]

# (version, seqno, kind, timed_out)
Position = Tuple[int, int, int, int]
_TAG = 7311


class Watchdog:
    """Fires ``on_timeout(token)`` when one call lasts longer than ``timeout``.

    Args:
        timeout: seconds (> 0).
        on_timeout: called once, from the watchdog thread, with the token of the
            call that overstayed. The watchdog stops after firing.
    """

    def __init__(self, timeout: float, on_timeout: Callable[[Any], None]) -> None:
        self.timeout = float(timeout)
        self._on_timeout = on_timeout
        self._current: Optional[Tuple[Any, float]] = None
        self._stop = threading.Event()
        self.fired: Optional[Any] = None
        self._thread = threading.Thread(target=self._run, name="rabit-watchdog", daemon=True)
        self._thread.start()

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
        while True:
            current = self._current
            if current is None:
                wait = self.timeout
            else:
                wait = current[1] + self.timeout - time.monotonic()
                if wait <= 0:
                    if self._current is current:
                        self.fired = current[0]
                        self._on_timeout(current[0])
                        return
                    continue
            if self._stop.wait(wait):
                return


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
        sends = [comm.Isend(sendbuf, dest=p, tag=_TAG) for p in recvbufs]
        recvs = {p: comm.Irecv(buf, source=p, tag=_TAG) for p, buf in recvbufs.items()}
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
