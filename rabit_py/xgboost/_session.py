"""One XGBoost communication session for :mod:`rabit_py.xgboost`: rank 0's
``RabitTracker``, every rank's ``CommunicatorContext`` and the matrices built
inside it. A session lives until a failure or the end of training; after a
failure every rank closes its session and opens a new one (Note [xgboost
sessions] in ``rabit_py/xgboost/__init__.py``).

# Note [xgboost hang]
XGBoost 3.2 can leave a worker waiting forever after a peer is lost: its
communication thread (``collective::Loop``) records the peer's error and
exits, and the caller, in ``Loop::Block``, waits on futures of operations
still queued, which nobody will complete or destroy (the main thread in
``Loop::Block`` -> ``std::future::get`` and no ``Loop::Process`` thread),
while the other survivors time out and wait in the repair for this rank,
until the repair deadline ends the job. No Python
exception can reach a thread blocked in C, and the rank cannot be told apart
from a slow one by its peers. So :class:`HangGuard` watches the threads that
XGBoost's communicator started: if one of them ends while the rank is inside
an XGBoost call, and the call has not returned ``grace`` seconds later, the
process ends itself with SIGKILL (after saying why), and the robust engine
replaces it like any lost rank. Linux only (``/proc/self/task``).
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

import xgboost
from xgboost import collective
from xgboost.core import XGBoostError
from xgboost.tracker import RabitTracker

log = logging.getLogger("rabit_py.xgboost")

DataFn = Callable[[], Any]

# Seconds an XGBoost call may go on after its communication thread ended
# (Note [xgboost hang]); a call that fails returns within milliseconds.
GRACE = 3.0


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


_TASK_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\] Task (\S+) got rank \d+$")


class _WithoutRepeatedTaskLines(io.TextIOBase):
    """``sys.stdout`` while a worker trains: XGBoost's "[time] Task T got
    rank R" line (printed through Python as the worker joins a session,
    whatever XGBoost's verbosity) is passed on once per task, not again at
    each session that a recovery opens. Everything else passes through; a
    line that may be one of them (it starts with "[") is held until it ends."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self._out = out
        self._seen: set = set()
        self._held = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._held = (self._held + text).split("\n")
            kept = []
            for line in lines:
                task = _TASK_LINE.match(line)
                if task is not None:
                    if task.group(1) in self._seen:
                        continue
                    self._seen.add(task.group(1))
                kept.append(line + "\n")
            if self._held and not self._held.startswith("["):
                kept.append(self._held)
                self._held = ""
            if kept:
                self._out.write("".join(kept))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def release(self) -> None:
        """Pass on what is held (at the end of training)."""
        with self._lock:
            held, self._held = self._held, ""
        if held:
            self._out.write(held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)     # fileno, isatty, encoding, ...


@contextlib.contextmanager
def without_repeated_task_lines() -> Iterator[None]:
    """Around a training run: see :class:`_WithoutRepeatedTaskLines`."""
    out = sys.stdout
    sys.stdout = wrapper = _WithoutRepeatedTaskLines(out)
    try:
        yield
    finally:
        wrapper.release()
        if sys.stdout is wrapper:
            sys.stdout = out


def thread_ids() -> FrozenSet[int]:
    """This process's threads (empty where ``/proc`` is missing)."""
    try:
        return frozenset(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return frozenset()


def _end_this_process(message: str) -> None:
    print(f"rabit_py: {message}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


class HangGuard:
    """Note [xgboost hang]: ends the process when one of ``watched`` (the
    threads XGBoost's communicator started) has ended while the rank is
    inside an XGBoost call that does not return within ``grace`` seconds.

    Args:
        watched: the thread ids to watch.
        grace: seconds a call may still take after such a thread ended.
        rank: for the message.
        end: what to do (tests replace it); default: SIGKILL this process.
    """

    def __init__(self, watched: FrozenSet[int], grace: float, rank: int,
                 end: Callable[[str], None] = _end_this_process) -> None:
        self._watched = watched
        self._grace = grace
        self._rank = rank
        self._end = end
        self._call: Optional[str] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if watched:
            self._thread = threading.Thread(target=self._run, name="rabit-xgboost-guard",
                                            daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def inside(self, call: str) -> Iterator[None]:
        """Mark the calling thread as inside an XGBoost call named ``call``;
        the watched threads are those still alive now."""
        with self._lock:
            self._call = call
            self._watched = self._watched & thread_ids()
        try:
            yield
        finally:
            with self._lock:
                self._call = None

    def close(self) -> None:
        """Stop watching (before the communicator's own threads end)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        ended_at: Optional[float] = None
        while not self._stop.wait(0.25):
            with self._lock:
                call, watched = self._call, self._watched
            if call is None or watched <= thread_ids():
                ended_at = None
                continue
            now = time.monotonic()
            if ended_at is None:
                ended_at = now
            elif now - ended_at > self._grace:
                self._end(f"rank {self._rank}: XGBoost's communication thread ended while "
                          f"{call} waits on it, and the call has not returned in "
                          f"{self._grace:.0f} s (an XGBoost {xgboost.__version__} hang after "
                          f"a lost peer, Note [xgboost hang]); ending this process so that "
                          f"a replacement takes its place")
                return


# Note [tracker address]
# XGBoost's tracker, given no address, takes the source address of a route to
# the outside (a UDP "connect" to a public address): on a cluster's private
# network, which has no such route, it fails before the first round ("Failed
# to find IP address ... Network is unreachable"), and where it has one, the
# address may be one that the other hosts do not reach. The job's hosts reach
# each other by their names (a hostfile, Slurm's node list, ssh all use
# them), so rank 0's tracker listens on the address its host name resolves
# to, if that address is this host's own (it can be bound) and not loopback
# (Debian maps a host's name to 127.0.1.1); else XGBoost's guess, whose
# failure then names ``tracker_host``.

def host_address() -> Optional[str]:
    """The IPv4 address this host's name resolves to, if it is one of this
    host's own addresses and not a loopback one; None if there is none
    (Note [tracker address])."""
    try:
        found = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET,
                                   socket.SOCK_STREAM)
    except OSError:
        return None
    for *_, (address, _port) in found:
        if ipaddress.ip_address(address).is_loopback:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((address, 0))
        except OSError:
            continue            # not an address of this host (a stale name entry)
        return address
    return None


class Tracker:
    """Rank 0's XGBoost tracker for one session."""

    def __init__(self, n_workers: int, host: Optional[str], timeout: int) -> None:
        try:
            self._tracker: Optional[RabitTracker] = RabitTracker(
                n_workers=n_workers, host_ip=host, port=0, sortby="task", timeout=timeout)
        except XGBoostError as exc:
            if host is not None:
                raise
            raise XGBoostError(
                f"{str(exc).strip()}\nXGBoost found no address for its tracker: rank 0's host "
                f"name ({socket.gethostname()}) does not resolve to an address of this host "
                f"(Note [tracker address]); pass tracker_host= the address of rank 0 that the "
                f"other hosts reach") from exc
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
        self.guard: Optional[HangGuard] = None
        #: The booster that trains this session's next interval, None to
        #: rebuild it from the checkpoint (Note [kept booster] in _rounds.py).
        self.booster: Optional[xgboost.Booster] = None
        context = collective.CommunicatorContext(
            **args, dmlc_task_id=task_id(rank), dmlc_timeout=timeout, dmlc_retry=retry)
        before = thread_ids()
        with quiet_xgboost():
            context.__enter__()
        self._context = context
        self.guard = HangGuard(thread_ids() - before, grace=GRACE, rank=rank)
        try:
            if collective.get_rank() != rank:
                raise RuntimeError(
                    f"rank {rank}: XGBoost numbered this worker {collective.get_rank()}; "
                    f"rabit_py.xgboost needs XGBoost's ranks to equal rabit_py's")
            with self.guard.inside("the building of the data"):
                self.train: xgboost.DMatrix = _checked(build_train(), "the training data")
                self.evals: List[Tuple[xgboost.DMatrix, str]] = [
                    (_checked(build(), f"evaluation set {name!r}"), name)
                    for name, build in build_evals]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Leave XGBoost's communicator; errors from lost peers are only logged."""
        guard, self.guard = self.guard, None
        context, self._context = self._context, None
        self.booster = None
        try:
            if context is not None:
                with quiet_xgboost(), (guard.inside("leaving XGBoost's communicator")
                                       if guard is not None else contextlib.nullcontext()):
                    context.__exit__(None, None, None)
        except XGBoostError as exc:
            log.debug("xgboost communicator closed: %s", str(exc).splitlines()[0])
        finally:
            if guard is not None:
                guard.close()


def _checked(matrix: Any, what: str) -> xgboost.DMatrix:
    if not isinstance(matrix, xgboost.DMatrix):
        raise TypeError(f"the function that builds {what} returned "
                        f"{type(matrix).__name__}, not an xgboost.DMatrix")
    return matrix
