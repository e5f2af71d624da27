"""A worker's side of the link to the servers: one progress thread that
sends requests in priority order and receives the answers (Note [sending
order]).

# Note [sending order]
Requests wait in a queue until the progress thread sends them; among those
waiting, a higher priority goes first, then the earlier request, as MXNet
orders pushes and pulls, except that the requests of one key keep the order
they were made in (a pull never overtakes its key's push: one queue per key,
and only each key's oldest request competes on priority). The thread sends
whatever is waiting in that order, all of it each time it wakes, with
nonblocking sends; it owns every MPI call on the link, so a worker's
``push`` never waits for the network and its ``pull`` waits only for its
answer. While answers are due it polls the link (Note [polling] in
``_protocol.py``), so that servers and workers sharing cores are not starved
by a busy wait.

``sent`` records the keys in the order they were sent (the last 1000): what
priority ordering produced. ``hold()`` keeps the thread from sending, for
tests that queue requests first.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import sys
import threading
import time
from typing import Any, Deque, Dict, Hashable, Iterator, List, Optional, Tuple

from .._servers import HELLO_TAG, MOVED_TAG, acknowledge_failures, say_goodbye
from ._protocol import PULL, PUSH, REPLY_TAG, REQUEST_TAG, idle_pause, unfinished

__all__ = ["Client", "Pending"]

# Pushes of one part kept for a failover until an answer shows them applied
# (a store with replicas only): a worker that pulls the part at least once
# every this many pushes loses none to a failover.
_RESEND_LIMIT = 64


class Pending:
    """An answer to come."""

    __slots__ = ("event", "status", "payload")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.status: Optional[str] = None
        self.payload: Any = None

    def set(self, status: str, payload: Any) -> None:
        self.status, self.payload = status, payload
        self.event.set()


class Client:
    """The progress thread of one worker process (Note [sending order]).

    Args:
        link: the link communicator (Note [server processes]), or a
            replacement's connection to the servers (an intercommunicator).
        first_server: the servers' first rank on the link (0 on a
            replacement's connection).
        servers: the number of servers.
        rank: this worker's rank (told to a replacement server when it
            connects: Note [replaced servers] in ``server.py``).
    """

    def __init__(self, link: Any, first_server: int, servers: int, rank: int = 0) -> None:
        from mpi4py import MPI

        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise RuntimeError("server-backed stores need MPI_THREAD_MULTIPLE (the progress "
                               "thread uses MPI beside the program); mpi4py asks for it unless "
                               "mpi4py.rc.thread_level was changed")
        self._mpi = MPI
        self.link = link
        self.first_server = first_server
        self.servers = servers
        self.rank = rank
        #: servers replaced by a new process, reached on a connection of their
        #: own (Note [replaced servers] in server.py): index -> connection
        self.moved_to: Dict[int, Any] = {}
        self._known_failed: set = set()         # ranks of the link known dead
        self._cond = threading.Condition()
        self._heads: List[Tuple[int, int, Hashable]] = []       # (-priority, seq, key)
        self._queues: Dict[Hashable, Deque[Tuple[int, int, int, tuple]]] = {}
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._due: Dict[int, Pending] = {}
        self._sends: List[Any] = []
        self._held = False
        self._stopping = False
        self.error: Optional[BaseException] = None
        #: which server holds each server's parts now (Note [server replicas]
        #: in server.py), the servers known dead, and what a failover resends
        self.route: List[int] = list(range(servers))
        self.dead_servers: set = set()
        self._unacked: Dict[tuple, Deque[Tuple[int, int, tuple]]] = {}
        self._inflight: Dict[int, Tuple[int, int, tuple]] = {}
        #: the stores that keep replicas (whose pushes a failover resends)
        self.replicated: set = set()
        #: server-backed stores made in this process (their default names)
        self.opened = 0
        #: (key, op) of each request in the order sent (the last 1000)
        self.sent: Deque[Tuple[Hashable, str]] = collections.deque(maxlen=1000)
        self._thread = threading.Thread(target=self._run, name="rabit_py-kvstore-link",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ callers
    def next_id(self) -> int:
        return next(self._ids)

    def send(self, server: int, key: Hashable, priority: int, request: tuple,
             rid: Optional[int] = None) -> Optional[Pending]:
        """Queue ``request`` for server ``server`` (index among the servers);
        with ``rid``, the answer is awaited as that id."""
        pending = None
        with self._cond:
            if self.error is not None:
                raise self.error
            if rid is not None:
                pending = self._due[rid] = Pending()
            item = (-int(priority), next(self._seq), server, request)
            queue = self._queues.get(key)
            if queue is None:
                self._queues[key] = collections.deque([item])
                heapq.heappush(self._heads, (item[0], item[1], key))
            else:
                queue.append(item)
            self._cond.notify()
        return pending

    def wait(self, pending: Pending, timeout: Optional[float]) -> Tuple[str, Any]:
        """The answer's ``(status, payload)``.

        Raises:
            TimeoutError: none came within ``timeout`` seconds.
            the thread's error, if it failed.
        """
        if not pending.event.wait(timeout):
            if self.error is not None:
                raise self.error
            raise TimeoutError
        if pending.status == "failed":
            raise pending.payload
        return pending.status, pending.payload  # type: ignore[return-value]

    def flush(self, timeout: Optional[float]) -> bool:
        """Wait until every queued request has been sent and its send
        completed. Returns False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._heads or self._sends) and self.error is None:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.notify()
                self._cond.wait(min(0.01, left) if left is not None else 0.01)
            if self.error is not None:
                raise self.error
        return True

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Send nothing inside the block (tests: queue first, then compare
        the order of ``sent`` with the priorities)."""
        with self._cond:
            self._held = True
        try:
            yield
        finally:
            with self._cond:
                self._held = False
                self._cond.notify()

    def close(self, timeout: float = 60.0) -> None:
        """Send what is queued, then stop the thread. A replacement's own
        connection also says goodbye to the servers here (the job's link
        does at ``finalize``: Note [server processes])."""
        try:
            if self.error is None:
                self.flush(timeout)
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify()
            self._thread.join(timeout)
            if self.link.Is_inter():
                say_goodbye(self.link, self.servers)
            for connection in self.moved_to.values():
                say_goodbye(connection, 1)

    def _peer_failed(self, exc: Any, comm: Any = None) -> None:
        """A process of the link (or of ``comm``, a replaced server's
        connection) died: a worker's death is only acknowledged (the job's
        recovery replaces it: Note [replaced workers] in ``server.py``), a
        server's fails its parts over (Note [server replicas]); any other
        error fails the link."""
        if comm is not None and comm is not self.link:
            acknowledge_failures(comm, exc)
            index = next(i for i, c in self.moved_to.items() if c is comm)
            del self.moved_to[index]
            self._server_died(index, exc)
            return
        for rank in acknowledge_failures(self.link, exc, self._known_failed):
            if rank >= self.first_server:
                self._server_died(rank - self.first_server, exc)

    def _dest(self, holder: int) -> Tuple[Any, int]:
        """Where server ``holder`` is reached: (communicator, rank)."""
        moved = self.moved_to.get(holder)
        return (moved, 0) if moved is not None else (self.link, self.first_server + holder)

    # ------------------------------------------------------------ failover
    def applied(self, part: Tuple[Any, int, Hashable, int], count: int) -> None:
        """An answer showed that ``part`` (store, server, key, part) holds
        this worker's first ``count`` pushes: they need no resending."""
        with self._cond:
            kept = self._unacked.get(part)
            while kept and kept[0][1] < count:
                kept.popleft()

    def _track(self, seq: int, server: int, request: tuple) -> None:
        """Keep what a failover may have to send again (Note [server
        replicas] in ``server.py``): pushes until an answer shows them
        applied, requests until answered."""
        with self._cond:
            if request[0] == PUSH:
                _, sid, owner, key, part, _, _, index = request
                if sid not in self.replicated:
                    return
                kept = self._unacked.setdefault((sid, owner, key, part),
                                                collections.deque(maxlen=_RESEND_LIMIT))
                kept.append((seq, owner, request))
                return
            rid = request[6] if request[0] == PULL else request[-1]
            if rid in self._due:
                self._inflight[rid] = (seq, server, request)

    def _transmit(self, server: int, request: tuple) -> None:
        """One nonblocking send to ``server``'s current holder; a dead
        holder is failed over and the request sent to the next."""
        MPI = self._mpi
        for _ in range(self.servers):
            comm, rank = self._dest(self.route[server])
            try:
                self._sends.append(comm.isend(request, dest=rank, tag=REQUEST_TAG))
                return
            except MPI.Exception as exc:
                self._peer_failed(exc, comm)
        raise RuntimeError("no server left to send to")

    def _server_died(self, index: int, exc: BaseException) -> None:
        """Server ``index`` died: its parts (and those it served for others)
        go to the next living server, with what may not have reached it."""
        if index in self.dead_servers:
            return
        self.dead_servers.add(index)
        moved = [owner for owner, holder in enumerate(self.route) if holder == index]
        for owner in moved:
            holder = (index + 1) % self.servers
            if holder in self.dead_servers or holder == index:
                raise exc               # no copy left: the job cannot go on
            self.route[owner] = holder
        with self._cond:
            again = [item for part, kept in self._unacked.items() if part[1] in moved
                     for item in kept]
            again += [item for item in self._inflight.values() if item[1] in moved]
        sys.stderr.write(f"rabit_py: server {index} died; its parts go to server "
                         f"{self.route[moved[0]] if moved else '-'} (which holds their "
                         f"replica where the store keeps one), {len(again)} request(s) sent "
                         f"there again\n")
        sys.stderr.flush()
        # In their first order: a part's pushes before its pulls. A request
        # for a server as a whole (sync, close, ...) goes to its successor,
        # where it changes nothing twice.
        for _, target, request in sorted(again, key=lambda item: item[0]):
            comm, rank = self._dest(self.route[target])
            self._sends.append(comm.isend(request, dest=rank, tag=REQUEST_TAG))

    def _moved(self, index: int, port: str) -> None:
        """Server ``index`` was replaced by a new process (Note [replaced
        servers] in ``server.py``): connect to it on ``port``, and send it
        what may have been lost on the way (the pushes of its parts not seen
        applied, the requests not answered), as after a failover."""
        MPI = self._mpi
        connection = MPI.COMM_SELF.Connect(port, root=0)
        connection.Set_errhandler(MPI.ERRORS_RETURN)
        connection.send(self.rank, dest=0, tag=HELLO_TAG)
        with self._cond:
            # The process it replaced, on the link, is dead whether or not
            # this worker saw it die (Note [replaced servers]).
            self._known_failed.add(self.first_server + index)
            self.moved_to[index] = connection
            self.dead_servers.discard(index)
            self.route[index] = index
            again = [item for part, kept in self._unacked.items() if part[1] == index
                     for item in kept]
            again += [item for item in self._inflight.values() if item[1] == index]
        for _, _, request in sorted(again, key=lambda item: item[0]):
            self._sends.append(connection.isend(request, dest=0, tag=REQUEST_TAG))
        sys.stderr.write(f"rabit_py: worker {self.rank} connected to the new server {index}; "
                         f"{len(again)} request(s) sent there again\n")
        sys.stderr.flush()

    # ------------------------------------------------------------ the thread
    def _take(self) -> List[Tuple[int, int, tuple, Hashable]]:
        """Everything sendable, in sending order (Note [sending order])."""
        batch = []
        while self._heads:
            _, _, key = heapq.heappop(self._heads)
            queue = self._queues[key]
            _, seq, server, request = queue.popleft()
            batch.append((seq, server, request, key))
            if queue:
                head = queue[0]
                heapq.heappush(self._heads, (head[0], head[1], key))
            else:
                del self._queues[key]
        return batch

    def _run(self) -> None:
        MPI = self._mpi
        status = MPI.Status()
        idle = 0
        try:
            while True:
                with self._cond:
                    while not self._due and not self._sends and \
                            (self._held or not self._heads) and not self._stopping:
                        self._cond.wait()
                    if self._stopping and not self._heads and not self._sends:
                        return
                    batch = [] if self._held else self._take()
                busy = bool(batch)
                for seq, server, request, key in batch:
                    self._track(seq, server, request)
                    self._transmit(server, request)
                    self.sent.append((key, request[0]))
                if self._sends:
                    # A send to a dead server is resent by _server_died.
                    left = unfinished(self._sends, MPI.Exception)
                    if len(left) != len(self._sends):
                        with self._cond:
                            self._sends = left
                            self._cond.notify_all()
                for comm in [self.link, *self.moved_to.values()]:
                    try:
                        message = comm.improbe(MPI.ANY_SOURCE, MOVED_TAG, status)
                    except MPI.Exception as exc:
                        self._peer_failed(exc, comm)
                        break
                    if message is not None:
                        self._moved(*message.recv())
                        busy = True
                        break
                while self._due:
                    message = None
                    for comm in [self.link, *self.moved_to.values()]:
                        try:
                            message = comm.improbe(MPI.ANY_SOURCE, REPLY_TAG, status)
                        except MPI.Exception as exc:
                            self._peer_failed(exc, comm)    # another worker: go on
                            break
                        if message is not None:
                            break
                    else:
                        break
                    if message is None:
                        continue
                    rid, answer, payload = message.recv()
                    busy = True
                    with self._cond:
                        pending = self._due.pop(rid, None)
                        self._inflight.pop(rid, None)
                    if pending is not None:     # None: answered twice, around a failover
                        pending.set(answer, payload)
                if busy:
                    idle = 0
                else:
                    idle += 1
                    pause = idle_pause(idle)     # Note [polling] in _protocol.py
                    if pause:
                        time.sleep(pause)
        except BaseException as exc:  # noqa: BLE001 - every waiter learns it
            with self._cond:
                self.error = exc
                due, self._due = self._due, {}
                self._cond.notify_all()
            for pending in due.values():
                pending.set("failed", exc)
