"""The engine's one communication thread.

Collectives must come in the same order on every rank. Work that overlaps the
caller's own (the bucketer's allreduces, the torch adapter's, the KVStore's
pushes) is therefore run by one thread per engine, in submission order: with
two threads (there were two, one for bucketers and one per KVStore), a
program using both could issue its collectives in a different order on
different ranks. The thread is attached to the current engine and stops at
``finalize``.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

from .. import api

__all__ = ["CommThread", "comm_thread"]



class CommThread:
    """Runs tasks one at a time, in submission order, on one thread.

    A caller that is about to wait for a task's result anyway may run it on
    its own thread instead (:meth:`inline`): when nothing is queued, a task
    submitted from inside ``inline()`` by that caller runs at once, which
    keeps the order of the collectives and saves two thread hand-offs.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rabit-comm")
        # Held while an inline task runs: a submission from another thread
        # then waits, so that the order of the collectives stays the same.
        self._lock = threading.RLock()
        self._last: Optional[Future] = None
        self._inline = threading.local()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` after every task submitted before; returns its Future."""
        with self._lock:
            if getattr(self._inline, "on", False) and (self._last is None or self._last.done()):
                future: Future = Future()
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                    future.set_exception(exc)
            else:
                future = self._pool.submit(fn, *args)
            self._last = future
        return future

    @contextlib.contextmanager
    def inline(self) -> Iterator[None]:
        """Within this block, this thread's submissions run on it when nothing
        is queued (see the class)."""
        self._inline.on = True
        try:
            yield
        finally:
            self._inline.on = False

    def close(self) -> None:
        """Stop the thread; queued tasks that have not started are cancelled."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def comm_thread() -> CommThread:
    """The current engine's communication thread (made at first use).

    Raises:
        NotInitializedError: before ``rabit_py.init()``.
    """
    resources = api.resources()
    if resources.comm_thread is None:
        resources.comm_thread = CommThread()
    return resources.comm_thread
