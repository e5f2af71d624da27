"""The parameter-server process: ``python -m rabit_py.kvstore.server``.

Started beside the workers (``rabit-run -n W --servers S python train.py``,
or ``mpirun -x RABIT_SERVERS=S -n W python train.py : -n S python -m
rabit_py.kvstore.server``; Note [server processes] in
``rabit_py/_servers.py``). It holds its parts of every key of the
server-backed stores (Note [key partition] in ``_protocol.py``), runs the
updater on each push it receives, and answers pulls as the store's
consistency model allows; it ends when every worker has left the job. It
serves the others while a dead worker is replaced (Note [replaced
workers]), keeps a copy of the previous server's parts and serves it when
that server dies (Note [server replicas]), starts a new process in the dead
server's place together with the other survivors (Note [replaced servers]),
and writes its parts to disk for a restarted job (Note [shard checkpoints]).

# Note [bounded delay]
A worker's *clock* for a key is the number of its pushes of that key so
far (a training loop that pushes each key once per iteration: its
iteration). Each part of a key on a server counts, per worker, the pushes
it has applied (``clocks``); pushes from one worker arrive in the order they
were sent (Note [server protocol]), so ``clocks[w] = n`` means that the
value holds exactly worker ``w``'s first ``n`` pushes. A pull made at clock
``c`` is answered:

- ``dist_async``: at once, with whatever the value holds;
- bounded delay with staleness ``tau`` (``dist_ssp``): once every worker
  still in the job has ``clocks[w] >= c - tau``, i.e. the value misses no
  update older than ``tau`` clocks; until then the pull waits here (the
  worker blocks in ``pull``), and each push that arrives re-examines the
  waiting pulls. ``tau = 0`` is BSP: a pull at clock ``c`` sees every
  worker's first ``c`` pushes.

The answer carries ``clocks``, so the worker can check the bound itself
(``ServerKVStore.pull_clocks``). A worker that has left (said goodbye) no
longer holds the others back, nor does a dead one until its replacement
connects (Note [replaced workers]), so that no pull waits for ever for the
pushes of a worker that is gone.

# Note [shard checkpoints]
With ``checkpoint_every=N`` (and a checkpoint folder, ``rabit-run
--checkpoint-dir``), each server writes its parts of the store (values,
clocks, the optimizer's state) every ``N`` pushes it applied, and when the
store is closed, to ``<folder>/kvstore/<store>/server-<i>-of-<S>.pkl``
(atomically: a temporary file, fsync, rename); a file is loaded as data only
(Note [checkpoints are data] in ``rabit_py/_unpickle.py``). When the job
starts again (``rabit-run --max-restarts`` after a worker or a server died),
the servers load their files as the workers open the store again: ``INIT``
keeps a restored part's value and answers with its clocks, so each worker
learns how many of its pushes of each part survived, resumes its clock
there (``ServerKVStore.clock``: the program resumes its data position from
it), and pushes again only to the parts that lack a step. A part loses at
most the pushes its server applied after its last checkpoint (fewer than
``N``), which the restored server reports; those steps are pushed again,
none twice.
"""

from __future__ import annotations

import collections
import glob
import os
import pickle
import queue
import sys
import threading
import time
import traceback
from typing import Any, Dict, Hashable, List, Optional, Tuple

import numpy as np

from .._servers import (BYE_TAG, HELLO_TAG, MOVED_TAG, SERVER, acknowledge_failures,
                        join_servers, port_service, publish_port, spawn_server, split_world)
from .._status import RESTART, Reporter
from .._unpickle import NotData, load_data
from ..config import Config
from ._protocol import (CLOCKS, CLOSE, INIT, OPEN, PULL, PUSH, REPLY_TAG, REQUEST_TAG, SYNC,
                        UPDATER, idle_pause, unfinished)

__all__ = ["Server", "main"]

_Slot = Tuple[Hashable, int]        # (key, part)


_SHARD_FORMAT = "rabit_py kvstore shard 1"


class _Store:
    """One store's parts on this server."""

    def __init__(self, staleness: Optional[int], workers: int, every: int = 0,
                 path: Optional[str] = None, owner: int = 0) -> None:
        self.staleness = staleness
        self.workers = workers
        #: the server whose parts these are; whether this server answers for
        #: them (False: a replica, Note [server replicas]); whether a copy of
        #: them is kept on the next server
        self.owner = owner
        self.serving = True
        self.replicated = False
        #: pushes that came before their predecessors: (slot, worker) -> {index: grad}
        self.early: Dict[Tuple[_Slot, int], Dict[int, np.ndarray]] = {}
        #: Note [shard checkpoints]: pushes between checkpoints (0: none), the file
        self.every = every
        self.path = path
        self.since = 0
        self.applied = 0
        self.restored_states: Any = None
        self.updater_blob: Optional[bytes] = None
        #: the workers that closed the store
        self.closed: set = set()
        self.updater: Any = None
        self.values: Dict[_Slot, np.ndarray] = {}
        self.clocks: Dict[_Slot, np.ndarray] = {}
        #: pulls waiting for the bound: slot -> [(worker, clock, id)]
        self.waiting: Dict[_Slot, List[Tuple[int, int, int]]] = {}
        #: an updater that raised breaks the store: every later answer is this
        self.error: Optional[str] = None


class Server:
    """One server process's loop (Note [bounded delay], Note [replaced
    workers], Note [server replicas], Note [shard checkpoints]).

    Args:
        link: the workers-and-servers communicator (Note [server processes]).
        workers: the number of workers (the link's first ranks).
        index: this server's index among the servers.
        config: the job's settings (the checkpoint folder).
        own: the servers' own communicator (replicas, accepting replacements).
        port: the MPI port replacement workers connect to ("": none can, as
            in a job without MPI fault tolerance).
        servers: the number of servers (default: the link's ranks after the
            workers'); a replacement server has no link (None): each worker
            connects to it (Note [replaced servers]).
        accept_own: a duplicate of ``own`` for accepting replacement workers
            (default: made here, collectively over ``own``).
    """

    def __init__(self, link: Any, workers: int, index: int,
                 config: Optional[Config] = None, own: Any = None, port: str = "",
                 servers: Optional[int] = None, accept_own: Any = None) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.link = link
        self.workers = workers
        self.index = index
        self.config = config or Config()
        self.servers = servers if servers is not None else link.Get_size() - workers
        self.stores: Dict[Any, _Store] = {}
        self.departed: set = set()
        #: workers dead and not replaced yet (Note [replaced workers])
        self.dead: set = set()
        #: how each worker is reached: (communicator, its rank there)
        self.routes: Dict[int, Tuple[Any, int]] = (
            {w: (link, w) for w in range(workers)} if link is not None else {})
        #: the channels polled: the link, then each replacement's
        self.channels: List[Any] = [link] if link is not None else []
        self._own, self._port = own, port
        #: servers known dead; the server that keeps the copy of this one's
        #: parts (Note [server replicas]), None once it died
        self.dead_servers: set = set()
        self._backup: Optional[int] = (index + 1) % self.servers if self.servers > 1 else None
        #: Note [replaced servers]: dead servers to replace, and those whose
        #: parts this server handed to their replacement
        self._to_replace: List[int] = []
        #: requests for parts handed over, dropped here (Note [replaced servers])
        self._dropped: Dict[int, Any] = {}
        #: per communicator (by id), the failed ranks already acted on
        self._known_failed: Dict[int, set] = {}
        self._handed: set = set()
        self._arrivals: "queue.Queue[Tuple[int, Any]]" = queue.Queue()
        self._to_accept = 0
        #: replacement workers not accepted yet (one may be under way)
        self._unaccepted = 0
        self._accepting: Optional[threading.Thread] = None
        self._accept_lock = threading.Condition()
        #: where the servers accept replacement workers together: a copy of
        #: ``own`` (two threads must not share a communicator's collectives)
        self._accept_own = accept_own if accept_own is not None else (
            own.Dup() if own is not None else None)
        #: Note [the servers' port]: server 0 was replaced and its new port
        #: cannot be found (not published): no replacement worker can connect
        self._port_lost = False
        #: Note [the servers' port] in _servers.py: the name server 0's port
        #: is published under ("" where the runtime publishes none), and how
        #: many times server 0 was replaced
        self.service = ""
        self.generation = 0
        #: Note [servers on several hosts]: whether a dead server may be
        #: replaced by a new process (else its replica serves its parts)
        self.replaceable = _on_one_host()
        self._sends: List[Any] = []
        #: where rabit-run learns how this server does (None: nowhere)
        self.reporter: Optional[Reporter] = None
        #: requests handled, by operation (for tests and the log)
        self.handled: Dict[str, int] = {}

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        """Serve until every worker has left the job."""
        MPI = self._mpi
        status = MPI.Status()
        idle = 0
        while len(self.departed) < self.workers:
            self._admit()
            if self._to_replace:
                self._replace_server(self._to_replace.pop(0))
            message = None
            for channel in self.channels + ([self._own] if self._own is not None else []):
                tag = _REPLICA_TAG if channel is self._own else MPI.ANY_TAG
                try:
                    message = channel.improbe(MPI.ANY_SOURCE, tag, status)
                except MPI.Exception as exc:
                    self._failed(channel, exc)
                    break
                if message is not None:
                    break
            if message is None:
                self._complete_sends()
                idle += 1
                pause = idle_pause(idle)     # Note [polling] in _protocol.py
                if pause:
                    time.sleep(pause)
                continue
            idle = 0
            try:
                request = message.recv()
            except MPI.Exception as exc:
                self._failed(channel, exc)
                continue
            if channel is self._own:
                self._replica_message(request)
                continue
            source, tag = status.Get_source(), status.Get_tag()
            worker = source if channel is self.link else self._worker_of(channel)
            if tag == BYE_TAG:
                self.departed.add(worker)
                self._release_all()
                for index in self._handed:      # it may never have reached the new one
                    self._send_server(index, ("bye", None, worker))
            elif tag == REQUEST_TAG:
                self._handle(worker, request)
        for request in self._sends:
            try:
                request.wait()
            except MPI.Exception:
                pass

    # ------------------------------------------------------------ failures
    # Note [replaced workers]
    # A worker that dies is noticed here as an error of the probe on the
    # link (ULFM: a receive from any source fails once a process of the
    # communicator failed, until the failure is acknowledged). A dead server
    # ends the job (its parts are gone; a restart resumes from the shard
    # checkpoints). A dead worker is acknowledged and set aside: its waiting
    # pulls are dropped, and until a replacement takes its place it holds
    # nobody back (the bound of dist_ssp counts the workers alive). The job's
    # in-job recovery starts the replacement when the other workers next
    # make a collective (the robust engine repairs inside a call); it runs
    # the program from its start, learns the servers' port from rank 0's
    # broadcast when it makes the store (replayed from the survivors'
    # results), connects (MPI_Comm_connect; a thread here accepts, all
    # servers together) and says which worker it is; from then on it is
    # reached on that connection, resumes at its clock (the pushes of the
    # dead worker that the servers applied), and is waited for again.
    def _failed(self, channel: Any, exc: BaseException) -> None:
        try:
            failed = acknowledge_failures(channel, exc,
                                          self._known_failed.setdefault(id(channel), set()))
        except self._mpi.Exception:
            self._lost(exc)
            return
        if channel is self._own:            # Note [server replicas]
            for index in failed:
                self._server_died(index)
            return
        if channel is self.link:
            for rank in failed:
                if rank >= self.workers:
                    self._server_died(rank - self.workers)
            lost = [w for w in failed if w < self.workers and w not in self.dead
                    and self.routes.get(w, (None,))[0] is self.link]
        else:
            lost = [self._worker_of(channel)]
            self.channels.remove(channel)
        self._workers_died(lost, exc)

    def _workers_died(self, lost: List[int], exc: BaseException) -> None:
        """Workers ``lost`` died: set them aside and expect their
        replacements (Note [replaced workers])."""
        if lost and not self._port:
            self._lost(exc)                 # no replacement can come (no fault tolerance)
        if lost and self._port_lost:
            self._lost(None, _NO_PORT.format(workers=sorted(lost)))
        for worker in lost:
            self.dead.add(worker)
            self.routes.pop(worker, None)
            for store in self.stores.values():
                for slot, waiting in store.waiting.items():
                    store.waiting[slot] = [item for item in waiting if item[0] != worker]
        if lost:
            sys.stderr.write(f"rabit_py server {self.index}: worker(s) {sorted(lost)} died; "
                             f"serving the others and waiting for the replacement(s)\n")
            sys.stderr.flush()
            self._release_all()
            self._expect_replacements(len(lost))
            for index in self._handed:
                # A new server sees only the workers that connected to it.
                self._send_server(index, ("dead", None, lost))

    def _expect_replacements(self, count: int) -> None:
        """``count`` more replacement workers to accept (in a thread)."""
        with self._accept_lock:
            self._to_accept += count
            self._unaccepted += count
            self._accept_lock.notify_all()
        if self._accepting is None:
            self._accepting = threading.Thread(target=self._accept_replacements,
                                               name="rabit_py-server-accept", daemon=True)
            self._accepting.start()

    def _accept_replacements(self) -> None:
        """A thread: accept each replacement's connection (collective over
        the servers, on a communicator of their own: the loop's shrink and
        spawn use ``_own`` meanwhile) and hand it to the loop."""
        while True:
            with self._accept_lock:
                while self._to_accept == 0:
                    self._accept_lock.wait()
                self._to_accept -= 1
                comm = self._accept_own
            try:
                channel = comm.Accept(self._port, root=0)
                channel.Set_errhandler(self._mpi.ERRORS_RETURN)
                worker = channel.recv(source=0, tag=HELLO_TAG)
            except self._mpi.Exception as exc:
                # A server died too: the servers cannot accept together.
                self._lost(exc, f"a server died while the servers were accepting the "
                                f"replacement of worker(s) {sorted(set(self.dead))} ({exc})")
                return
            with self._accept_lock:
                self._unaccepted -= 1
            self._arrivals.put((worker, channel, "the replacement of worker"))

    def _admit(self) -> None:
        """Replacements that connected (Note [replaced workers]), and workers
        that connected to this replacement server (Note [replaced servers])."""
        while not self._arrivals.empty():
            worker, channel, who = self._arrivals.get()
            self.routes[worker] = (channel, 0)
            self.channels.append(channel)
            self.dead.discard(worker)
            if who:
                sys.stderr.write(f"rabit_py server {self.index}: {who} {worker} connected\n")
                sys.stderr.flush()

    def _worker_of(self, channel: Any) -> int:
        for worker, (comm, _) in self.routes.items():
            if comm is channel:
                return worker
        raise RuntimeError("a channel of no worker")

    def _release_all(self) -> None:
        for store in self.stores.values():
            for slot in list(store.waiting):
                self._release(store, slot)

    def _handle(self, source: int, request: tuple) -> None:
        """One request of worker ``source`` (Note [server protocol] in
        ``_protocol.py``)."""
        op, sid = request[0], request[1]
        self.handled[op] = self.handled.get(op, 0) + 1
        if op in (PUSH, PULL, INIT, CLOCKS):
            owner = request[2]
            store = self.stores.get((sid, owner))
            if store is not None and not store.serving:
                if owner in self._handed and owner not in self.dead_servers:
                    # Sent before the worker moved to the replacement, where
                    # it sends this again (Note [replaced servers]); kept
                    # in case the replacement dies before that.
                    self._dropped.setdefault(owner, collections.deque(maxlen=4096)).append(
                        (source, request))
                    return
                # The worker saw the part's server die before this server did.
                self._server_died(owner)
            if store is None:
                why = (f"server {self.index} holds no part of server {owner} of store {sid!r} "
                       f"(closed, never opened, or server {owner} died and the store keeps no "
                       f"replicas: create it with replicas=1 to survive that)")
                if op == PUSH:
                    sys.stderr.write(f"rabit_py {why}; a push is dropped\n")
                else:
                    self._reply(source, request[6] if op == PULL else request[-1],
                                # A request for another server's parts comes
                                # after the worker saw that server die.
                                "lost" if owner != self.index else "error", why)
                return
        elif op != OPEN and not any(key[0] == sid for key in self.stores):
            if op == CLOSE:     # again: for a dead server's parts, closed here already
                self._reply(source, request[-1], "ok", None)
            else:
                self._reply(source, request[-1], "error",
                            f"server {self.index}: {op} for store {sid!r}, which is not open "
                            f"here")
            return
        if op == PUSH:
            _, _, _, key, part, grad, worker, index = request
            self._push(store, sid, key, part, grad, worker, index)
        elif op == PULL:
            _, _, _, key, part, clock, rid, worker = request
            slot = (key, part)
            if self._allowed(store, slot, clock):
                self._answer_pull(store, slot, source, rid)
            else:
                store.waiting.setdefault(slot, []).append((source, clock, rid))
        elif op == SYNC:
            self._reply(source, request[2], "ok", None)
        elif op == CLOCKS:
            _, _, _, key, part, rid = request
            self._reply(source, rid, "ok", store.clocks[(key, part)])
        elif op == OPEN:
            _, _, staleness, workers, every, replicas, rid = request
            try:
                if (sid, self.index) not in self.stores:    # again: a replacement's rank 0
                    own = self._open(sid, staleness, workers, every, self.index)
                    self.stores[(sid, self.index)] = own
                    if replicas and self.servers > 1:
                        # Note [server replicas]: the copy of the previous server's parts.
                        own.replicated = True
                        behind = (self.index - 1) % self.servers
                        replica = self._open(sid, staleness, workers, every, behind)
                        replica.serving = False
                        self.stores[(sid, behind)] = replica
            except _Refused as exc:
                self._reply(source, rid, "error", str(exc))
            else:
                self._reply(source, rid, "ok", None)
        elif op == INIT:
            _, _, _, key, part, value, rid = request
            problem = self._init(store, key, part, value)
            if problem is None:
                self._replicate(store, ("init", sid, key, part, value))
                self._reply(source, rid, "ok", store.clocks[(key, part)])
            else:
                self._reply(source, rid, "error", problem)
        elif op == UPDATER:
            _, _, blob, rid = request
            problem = None
            for key in [k for k in self.stores if k[0] == sid]:
                problem = problem or self._set_updater(self.stores[key], blob)
            if problem is None:
                self._reply(source, rid, "ok", None)
            else:
                self._reply(source, rid, "error", problem)
        elif op == CLOSE:
            # Every worker's close comes behind its own last requests (one
            # channel per worker): the store goes once all have come.
            _, _, rid = request
            for key in [k for k in self.stores if k[0] == sid]:
                store = self.stores[key]
                store.closed.add(source)
                if len(store.closed | self.departed) >= store.workers:
                    del self.stores[key]
                    if store.every and store.serving:
                        self._save(sid, store)
            self._reply(source, rid, "ok", None)
        else:
            raise RuntimeError(f"server {self.index}: unknown request {op!r} from worker {source}")

    def _push(self, store: _Store, sid: Any, key: Hashable, part: int, grad: np.ndarray,
              worker: int, index: int) -> None:
        """Apply worker's push number ``index`` of a part, in order: a push
        met again (resent after a failover, or replicated and resent) is
        dropped, one that came early waits for those before it."""
        slot = (key, part)
        clocks = store.clocks[slot]
        if index < clocks[worker]:
            return
        if index > clocks[worker]:
            store.early.setdefault((slot, worker), {})[index] = grad
            return
        while True:
            if store.error is None:
                try:
                    if store.updater is not None:
                        store.updater(key, grad, store.values[slot])
                    else:
                        store.values[slot] += grad
                except Exception:  # noqa: BLE001 - said to every later pull
                    store.error = (f"server {self.index}: the updater raised on a push of key "
                                   f"{key!r}:\n{traceback.format_exc()}")
            clocks[worker] += 1
            store.applied += 1
            self._replicate(store, ("push", sid, key, part, grad, worker, index))
            if store.every and store.serving:
                store.since += 1
                if store.since >= store.every:
                    self._save(sid, store)
            early = store.early.get((slot, worker))
            index += 1
            if not early or index not in early:
                break
            grad = early.pop(index)
        if store.waiting.get(slot):
            self._release(store, slot)

    def _init(self, store: _Store, key: Hashable, part: int, value: Any) -> Optional[str]:
        slot = (key, part)
        if slot not in store.values:        # restored parts keep their value
            store.values[slot] = np.array(value, copy=True)
            store.clocks[slot] = np.zeros(store.workers, dtype=np.int64)
            return None
        if store.values[slot].shape != np.shape(value) or \
                store.values[slot].dtype != np.asarray(value).dtype:
            return (f"server {self.index}: key {key!r} part {part} was restored from "
                    f"{store.path} with shape {store.values[slot].shape} and dtype "
                    f"{store.values[slot].dtype}, but init gives {np.shape(value)} "
                    f"{np.asarray(value).dtype}: the checkpoint is of another model; remove it "
                    f"or use another checkpoint folder")
        return None

    def _set_updater(self, store: _Store, blob: bytes) -> Optional[str]:
        if blob == store.updater_blob:          # again: a replacement's rank 0
            return None
        try:
            store.updater = pickle.loads(blob)
            store.updater_blob = blob
            if store.restored_states is not None and hasattr(store.updater, "set_states"):
                store.updater.set_states(store.restored_states)
                store.restored_states = None
        except Exception as exc:  # noqa: BLE001 - told to the worker
            return (f"server {self.index} cannot load the updater ({type(exc).__name__}: "
                    f"{exc}); an updater must be importable by the server process (a rabit_py "
                    f"optimizer, or a function in an importable module, not in __main__)")
        return None

    # ------------------------------------------------------------ replicas
    # Note [server replicas]
    # With replicas=1 (and two servers or more) each server keeps a copy of
    # the previous server's parts (server i's on server i + 1, the last's on
    # the first), as ps-lite's replication does: every push a server applies
    # to its own parts, and every init, it forwards to that next server on
    # the servers' own communicator (in order: one channel), which applies
    # it to the copy with an updater of its own, so that the copy holds the
    # same values, clocks and optimizer state. When a server dies, its next
    # server serves the copy (promoted when it learns of the death, from its
    # own probe or from a worker's request for those parts), and each worker
    # sends its requests for the dead server's parts there: its pulls that
    # were not answered, and its pushes whose application it had not seen in
    # an answer (the last 64 of each part: a worker that pulls a part at
    # least once every 64 pushes of it loses none). Pushes carry their
    # number, so one applied twice (replicated and resent) counts once:
    # nothing is lost and nothing applied twice. One failure per pair: a part whose server and
    # copy both die ends the job (a restart resumes from the shard
    # checkpoints).
    def _replicate(self, store: _Store, message: tuple) -> None:
        """Forward what changed one of this server's own parts to the copy."""
        if not store.replicated or store.owner != self.index or self._backup is None:
            return
        try:
            self._sends.append(self._own.isend(message, dest=self._backup, tag=_REPLICA_TAG))
        except self._mpi.Exception:
            self._backup = None             # it died: the probe of the servers' comm says so

    def _server_died(self, index: int) -> None:
        """Server ``index`` is dead: serve the copy of its parts held here."""
        if index in self.dead_servers:
            return
        self.dead_servers.add(index)
        self._handed.discard(index)
        if self.link is not None:
            # Learnt elsewhere first, the death of the job's server process
            # is reported on the link later: not a new one by then.
            self._known_failed.setdefault(id(self.link), set()).add(self.workers + index)
        if self._backup == index:
            self._backup = None
        replicated = all(store.replicated for key, store in self.stores.items()
                         if key[1] == self.index)
        if self._port and self._own is not None and replicated:
            if self.replaceable:
                self._to_replace.append(index)      # Note [replaced servers]
            else:
                sys.stderr.write(f"rabit_py server {self.index}: server {index} is not replaced "
                                 f"by a new process: the job runs on several hosts, where Open "
                                 f"MPI 5.0's connect/accept is not reliable (Note "
                                 f"[servers on several hosts]); its replica serves its parts "
                                 f"from here on\n")
        promoted = [key for key, store in self.stores.items()
                    if key[1] == index and not store.serving]
        for key in promoted:
            self.stores[key].serving = True
        sys.stderr.write(f"rabit_py server {self.index}: server {index} died; "
                         + (f"serving its parts of {len(promoted)} store(s) from the replica "
                            f"here\n" if promoted else "no replica of its parts here\n"))
        sys.stderr.flush()
        for source, request in self._dropped.pop(index, ()):
            self._handle(source, request)   # answered twice at worst: the worker keeps one

    def _replica_message(self, message: tuple) -> None:
        kind, sid = message[0], message[1]
        if kind == "bye":                   # Note [replaced servers]
            self.departed.add(message[2])
            self._release_all()
            return
        if kind == "dead":                  # the same: those not connected here
            unseen = [w for w in message[2] if w not in self.routes and w not in self.dead
                      and w not in self.departed]
            self._workers_died(unseen, RuntimeError(f"worker(s) {unseen} died"))
            return
        store = self.stores.get((sid, (self.index - 1) % self.servers))
        if store is None:
            return
        if kind == "init":
            _, _, key, part, value = message
            self._init(store, key, part, value)
        else:
            _, _, key, part, grad, worker, index = message
            self._push(store, sid, key, part, grad, worker, index)

    # ------------------------------------------------------------ replacing a server
    # Note [servers on several hosts]
    # A replacement server is reached by MPI_Comm_spawn and by each worker's
    # MPI_Comm_connect (Note [replaced servers]). Between processes on two
    # hosts, Open MPI 5.0.11's runtime (PRRTE) breaks in these: "PMIX ERROR:
    # PMIX_ERROR in file prted/pmix/pmix_server_dyn.c at line 1113" with an
    # unpack error, then a heap corruption ("corrupted size vs. prev_size",
    # "free(): invalid pointer") or a segfault, a daemon lost, and the
    # connects under way hang -- 3 runs of 5 and 4 of 6 of the namespace-host test
    # with one server frozen (the new process spawned on the survivor's host
    # or on the other, the workers' accepts one at a time or together), as
    # in open-mpi/ompi#12601 and openpmix/prrte#964. On one host they work.
    # So a server replaces a dead one only when the job runs on one host
    # (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE is the world's size; unknown
    # counts as several); on several hosts the replica serves the dead
    # server's parts for the rest of the job (Note [server replicas]), and a
    # second failure of a pair ends the job for a restart from the shard
    # checkpoints.

    # Note [replaced servers]
    # A dead server is replaced by a new process when every store keeps
    # replicas (its parts then live on in the copy its next server holds)
    # and the job has MPI fault tolerance. Each surviving server, once it
    # learned of the death, (1) shrinks the servers' own communicator and,
    # collectively, spawns the new process and merges it in, ranked by
    # server index (``spawn_server`` in ``_servers.py``); (2) sends it a
    # handover: the server that served the copy (the next one) sends the
    # dead server's parts (values, clocks, optimizer state) and stops
    # serving them -- from then its copy is the replica again, kept by the
    # new server's pushes -- and the server before the dead one sends its
    # own parts, of which the new server keeps the copy from then on; (3)
    # the next server, the *relay*, gets a port per live worker from the new
    # server and sends each worker its own (``MOVED_TAG``); each worker
    # connects, says which it is, and sends the new server what it may have
    # lost on the way: its pulls not answered and its pushes of those parts
    # not seen applied (numbered, so none counts twice). The new server
    # accepts each worker in a thread of its own: a worker that died unseen
    # never connects and holds no other. Requests for the parts that reach
    # the relay after the handover are dropped there (the worker sends them
    # again to the new server; kept, and served, should the new server die
    # first). MPI reports a communicator's old failures with each new one,
    # so each server acts on a failed rank once (``acknowledge_failures``'s
    # ``known``).
    #
    # The new server sees only the workers that connected to it: the relay
    # forwards each worker's goodbye and each worker death it sees, and the
    # new server takes part in accepting their replacements with the others
    # (on a duplicate of the servers' communicator: the loop shrinks and
    # spawns on the other meanwhile). A server that dies while the servers
    # accept a replacement worker (a burst) ends the job, which says so: the
    # accept under way includes the dead server and fails only once the
    # worker connects, which it then loses. A replacement worker connects to
    # the port of server 0, which dies with it: a new server 0 publishes its
    # own (Note [the servers' port] in _servers.py), so a worker that dies
    # after the replacement is replaced too, and one that dies with server 0
    # (before the new port is published) ends the job. A restart resumes
    # from the shard checkpoints. A second failure during the replacement
    # (its spawn, its handover) is not replaced: the job goes on without the
    # new process where it can, as after a failover.
    def _replace_server(self, index: int) -> None:
        """Note [replaced servers], on a surviving server."""
        MPI = self._mpi
        started = time.perf_counter()
        with self._accept_lock:
            unaccepted = self._unaccepted
        if index == 0 and (unaccepted or self.dead):
            self._lost(None, _NO_PORT.format(workers=sorted(self.dead)))
        if unaccepted:
            # The accept under way includes the dead server, and it fails only
            # once the replacement worker connects, which it then loses.
            self._lost(None, f"server {index} died while the servers were accepting the "
                             f"replacement of worker(s) {sorted(self.dead)}")
        try:
            own = spawn_server(self._own.Shrink(), index, self.index)
            accept_own = own.Dup()
        except MPI.Exception as exc:
            sys.stderr.write(f"rabit_py server {self.index}: could not start a new server in "
                             f"place of server {index} ({exc}); going on without it\n")
            sys.stderr.flush()
            return
        relay = (index + 1) % self.servers == self.index
        with self._accept_lock:
            self._own, self._accept_own = own, accept_own
            # Note [the servers' port]: the new server 0 publishes its own.
            self._port_lost = self._port_lost or (index == 0 and not self.service)
        if index == 0:
            self.generation += 1
        self.dead_servers.discard(index)
        handover: Dict[str, Any] = {"parts": [], "copies": [], "departed": sorted(self.departed),
                                    "dead": sorted(self.dead), "config": self.config,
                                    "workers": self.workers, "ft": bool(self._port),
                                    "relay": relay, "port_lost": self._port_lost,
                                    "service": self.service, "generation": self.generation}
        moved = []
        for (sid, owner), store in self.stores.items():
            if owner == index and store.serving:
                handover["parts"].append((sid, _snapshot(store)))
                moved.append(store)
            elif owner == self.index and store.replicated and \
                    (self.index + 1) % self.servers == index:
                handover["copies"].append((sid, _snapshot(store)))
        try:
            own.send(handover, dest=index, tag=_JOIN_TAG)
            if relay:
                ports = own.recv(source=index, tag=_JOIN_TAG)
        except MPI.Exception as exc:
            # It died joining: this server goes on serving the copy.
            self.dead_servers.add(index)
            sys.stderr.write(f"rabit_py server {self.index}: the new server {index} failed "
                             f"while joining ({exc})\n")
            sys.stderr.flush()
            return
        for store in moved:
            store.serving = False               # the replica again
            store.waiting.clear()               # the workers ask the new server
            store.early.clear()
        if (self.index + 1) % self.servers == index:
            self._backup = index
        self._handed.add(index)
        if relay:
            for worker, port in sorted(ports.items()):
                route = self.routes.get(worker)
                if route is not None:
                    try:
                        self._sends.append(route[0].isend((index, port), dest=route[1],
                                                          tag=MOVED_TAG))
                    except MPI.Exception:
                        pass                # it died: its replacement asks the servers
            sys.stderr.write(f"rabit_py server {self.index}: a new process took the place of "
                             f"server {index} ({time.perf_counter() - started:.2f} s); its "
                             f"parts of {len(handover['parts'])} store(s) moved there\n")
            sys.stderr.flush()

    def _send_server(self, index: int, message: tuple) -> None:
        try:
            self._sends.append(self._own.isend(message, dest=index, tag=_REPLICA_TAG))
        except self._mpi.Exception:
            pass                            # it died: the probe of the servers' comm says so

    def _adopt(self, handovers: List[Dict[str, Any]]) -> Dict[int, str]:
        """A replacement server's start (Note [replaced servers]): take the
        parts and copies the survivors sent, open a port for each live
        worker and accept their connections in a thread. Returns the ports
        (for the relay)."""
        MPI = self._mpi
        for handover in handovers:
            self.departed.update(handover["departed"])
            self.dead.update(handover["dead"])
            for sid, shard in handover["parts"]:
                self.stores[(sid, self.index)] = _restore(shard, serving=True)
            for sid, shard in handover["copies"]:
                owner = (self.index - 1) % self.servers
                self.stores[(sid, owner)] = _restore(shard, serving=False)
        for store in self.stores.values():
            if store.updater_blob is not None:
                blob, store.updater_blob = store.updater_blob, None
                self._set_updater(store, blob)
        live = [w for w in range(self.workers) if w not in self.departed and w not in self.dead]
        ports = {worker: MPI.Open_port() for worker in live}
        # One thread per worker, each on a communicator of its own: a worker
        # that died unseen never connects, and must not hold the others.
        for worker, port in ports.items():
            threading.Thread(target=self._accept_worker,
                             args=(worker, port, MPI.COMM_SELF.Dup()),
                             name=f"rabit_py-server-join-{worker}", daemon=True).start()
        return ports

    def _accept_worker(self, worker: int, port: str, comm: Any) -> None:
        MPI = self._mpi
        try:
            channel = comm.Accept(port, root=0)
            channel.Set_errhandler(MPI.ERRORS_RETURN)
            said = channel.recv(source=0, tag=HELLO_TAG)
        except MPI.Exception as exc:
            sys.stderr.write(f"rabit_py server {self.index}: worker {worker} could not "
                             f"connect ({exc})\n")
            sys.stderr.flush()
            return
        finally:
            try:
                MPI.Close_port(port)
            except MPI.Exception:
                pass
        self._arrivals.put((said, channel, ""))

    # ------------------------------------------------------------ checkpoints
    def _open(self, sid: Any, staleness: Optional[int], workers: int, every: int,
              owner: int) -> _Store:
        """A new store of server ``owner``'s parts, restored from its shard
        checkpoint where one exists (Note [shard checkpoints])."""
        if not every:
            return _Store(staleness, workers, owner=owner)
        folder = self.config.checkpoint_dir
        if not folder:
            raise _Refused(f"server {self.index}: checkpoint_every={every} needs a checkpoint "
                           f"folder: start the job with rabit-run --checkpoint-dir DIR (or "
                           f"RABIT_CHECKPOINT_DIR for every process)")
        path = os.path.join(folder, "kvstore", str(sid),
                            f"server-{owner}-of-{self.servers}.pkl")
        store = _Store(staleness, workers, every, path, owner)
        if not os.path.exists(path):
            others = glob.glob(os.path.join(os.path.dirname(path), "server-*-of-*.pkl"))
            if others:
                raise _Refused(f"server {self.index}: the checkpoint of store {sid!r} in "
                               f"{os.path.dirname(path)} was written by another number of "
                               f"servers ({os.path.basename(others[0])}); start the job with "
                               f"as many servers as before, or remove it")
            return store
        try:
            with open(path, "rb") as f:
                blob = f.read()
            saved = pickle.loads(blob) if self.config.trust_checkpoints else \
                load_data(blob, self.config.allowed_checkpoint_classes)
            if not isinstance(saved, dict) or saved.get("format") != _SHARD_FORMAT:
                raise ValueError("not a rabit_py KVStore shard checkpoint")
        except NotData as exc:
            raise _Refused(f"server {self.index}: {path} {exc.advice()}") from None
        except Exception as exc:  # noqa: BLE001 - a corrupt file is refused, said
            raise _Refused(f"server {self.index}: cannot load {path} ({type(exc).__name__}: "
                           f"{exc}); remove it to start the store afresh") from None
        if saved["workers"] != workers:
            raise _Refused(f"server {self.index}: {path} holds a store of {saved['workers']} "
                           f"workers, this job has {workers}")
        store.values, store.clocks = saved["values"], saved["clocks"]
        store.restored_states, store.applied = saved["updater"], saved["applied"]
        sys.stderr.write(f"rabit_py server {self.index}: store {sid!r} restored from its "
                         f"checkpoint ({store.applied} pushes applied); the pushes this server "
                         f"applied after it (fewer than checkpoint_every={every}) were lost, "
                         f"and the workers push those steps again from their clocks\n")
        sys.stderr.flush()
        return store

    def _save(self, sid: Any, store: _Store) -> None:
        states = store.updater.get_states() if hasattr(store.updater, "get_states") else \
            store.restored_states
        shard = {"format": _SHARD_FORMAT, "store": sid, "server": self.index,
                 "servers": self.servers, "workers": store.workers, "values": store.values,
                 "clocks": store.clocks, "updater": states, "applied": store.applied}
        assert store.path is not None
        os.makedirs(os.path.dirname(store.path), exist_ok=True)
        tmp = f"{store.path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            pickle.dump(shard, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, store.path)
        store.since = 0

    # ------------------------------------------------------------ pulls
    def _allowed(self, store: _Store, slot: _Slot, clock: int) -> bool:
        if store.staleness is None:
            return True
        clocks = store.clocks[slot]
        live = [w for w in range(store.workers) if w not in self.departed and w not in self.dead]
        return not live or int(clocks[live].min()) >= clock - store.staleness

    def _release(self, store: _Store, slot: _Slot) -> None:
        still = []
        for worker, clock, rid in store.waiting.get(slot, []):
            if self._allowed(store, slot, clock):
                self._answer_pull(store, slot, worker, rid)
            else:
                still.append((worker, clock, rid))
        if still:
            store.waiting[slot] = still
        else:
            store.waiting.pop(slot, None)

    def _answer_pull(self, store: _Store, slot: _Slot, worker: int, rid: int) -> None:
        if store.error is not None:
            self._reply(worker, rid, "error", store.error)
        else:
            # isend pickles now: later pushes do not change what is sent.
            # The workers not waited for (gone, or dead and not replaced yet).
            self._reply(worker, rid, "ok", (store.values[slot], store.clocks[slot],
                                            tuple(sorted(self.departed | self.dead))))

    # ------------------------------------------------------------ sending
    def _reply(self, worker: int, rid: int, status: str, payload: Any) -> None:
        route = self.routes.get(worker)
        if route is None:
            return                      # a dead worker: its replacement asks again
        comm, rank = route
        try:
            self._sends.append(comm.isend((rid, status, payload), dest=rank, tag=REPLY_TAG))
        except self._mpi.Exception:
            pass                        # it died: the probe of its channel says so

    def _complete_sends(self) -> None:
        if self._sends:
            self._sends = unfinished(self._sends, self._mpi.Exception)

    def _lost(self, exc: Optional[BaseException], why: str = "") -> None:
        what = why or (f"a process of the job failed ({exc}) that cannot be replaced in the "
                       f"job (a server, whose parts are lost, or a job without MPI fault "
                       f"tolerance)")
        message = (f"rabit_py server {self.index}: {what}: the job ends here (rabit-run "
                   f"--max-restarts starts it again, from the shard checkpoints)")
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        if self.reporter is not None:
            self.reporter.fatal(RESTART, message)
        self._mpi.COMM_WORLD.Abort(1)


class _Refused(Exception):
    """A request the server answers with an error."""


_REPLICA_TAG = 3                    # on the servers' own communicator
_JOIN_TAG = 4                       # the same: a new server's handover and ports
_NO_PORT = ("server 0 died, and worker(s) {workers} with it: a replacement worker connects to "
            "the servers on server 0's port, which died with it, until a new server 0 "
            "publishes its own (or for good, where MPI's runtime publishes no names: Note "
            "[the servers' port] in rabit_py/_servers.py)")
_SNAPSHOT_FIELDS = ("staleness", "workers", "owner", "every", "path", "since", "applied",
                    "updater_blob", "closed", "values", "clocks", "error")


def _snapshot(store: _Store) -> Dict[str, Any]:
    """What a new server needs of a store's parts (Note [replaced servers])."""
    shard = {name: getattr(store, name) for name in _SNAPSHOT_FIELDS}
    shard["replicated"] = True
    shard["states"] = store.updater.get_states() if hasattr(store.updater, "get_states") \
        else store.restored_states
    return shard


def _restore(shard: Dict[str, Any], serving: bool) -> _Store:
    store = _Store(shard["staleness"], shard["workers"], owner=shard["owner"])
    for name in _SNAPSHOT_FIELDS:
        setattr(store, name, shard[name])
    store.replicated = shard["replicated"] and serving
    store.serving = serving
    store.restored_states = shard["states"]
    return store
BEAT_S = 1.0                        # between two heartbeats


def _beat(server: Server, served: threading.Event) -> None:
    """Beat every ``BEAT_S`` until ``served`` is set, from a thread of
    its own, whatever the loop does: rabit-run ends a server on another host
    whose beats stop (rule (g) of Note [supervision] in
    ``launcher/_supervisor.py``), as it ends a silent rank."""
    if server.reporter is None or server.reporter.folder is None:
        return
    while True:
        server.reporter.beat(0, sum(list(server.handled.values())), 0, "serve")
        if served.wait(BEAT_S):
            return


def main(argv: Optional[List[str]] = None) -> int:
    """Run one server process (the job's last ``RABIT_SERVERS`` processes)."""
    config = Config.from_env()
    args = list(sys.argv[1:] if argv is None else argv)
    replaces = int(args[1]) if args[:1] == ["--replaces"] and len(args) == 2 else None
    if config.servers < 1 and replaces is None:
        sys.stderr.write("rabit_py.kvstore.server: RABIT_SERVERS is not set: start servers with "
                         "rabit-run -n W --servers S, or mpirun -x RABIT_SERVERS=S -n W python "
                         "train.py : -n S python -m rabit_py.kvstore.server\n")
        return 2
    from mpi4py import MPI

    if replaces is not None:                # its settings come with the handover
        server = _replacement(replaces)
    else:
        own, link, port = split_world(MPI.COMM_WORLD, config.servers, SERVER)
        own.Set_errhandler(MPI.ERRORS_RETURN)
        ft = os.environ.get("OMPI_MCA_mpi_ft_enable", "").strip().lower() in (
            "1", "true", "yes", "on", "enabled")
        server = Server(link, link.Get_size() - config.servers, own.Get_rank(), config, own,
                        port if ft else "")
        if ft:
            # Note [the servers' port] in _servers.py: every server learns
            # whether the runtime took server 0's name.
            published = publish_port(port_service(port), 0, port) if server.index == 0 else None
            if own.bcast(published, root=0):
                server.service = port_service(port)
    # rabit-run reads these (Note [status folder] in rabit_py/_status.py):
    # a server that ended its loop and then waits in MPI_Finalize is said so.
    server.reporter = Reporter(server.config.run_status_dir, f"server-{server.index}")
    server.reporter.started()
    served = threading.Event()
    threading.Thread(target=_beat, args=(server, served), name="rabit_py-server-beat",
                     daemon=True).start()
    server.run()
    served.set()
    server.reporter.exited(True)
    if server.config.log_level.upper() == "DEBUG":
        sys.stderr.write(f"rabit_py server {server.index}: handled {server.handled}\n")
    return 0


def _on_one_host() -> bool:
    """Whether this process's job runs on one host (Note [servers on several
    hosts]): Open MPI's local size is its world size."""
    world = os.environ.get("OMPI_COMM_WORLD_SIZE")
    return world is not None and os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") == world


def _replacement(index: int) -> Server:
    """A server spawned in place of dead server ``index`` (Note [replaced
    servers]): join the survivors, take the handover, give the relay the
    workers' ports."""
    from mpi4py import MPI

    try:
        own = join_servers(index)
        accept_own = own.Dup()
        servers = own.Get_size()
        handovers = [own.recv(source=MPI.ANY_SOURCE, tag=_JOIN_TAG)
                     for _ in range(servers - 1)]
    except MPI.Exception as exc:
        # Another failure during the join: the survivors go on without this
        # process, or the job ends (they say why).
        sys.stderr.write(f"rabit_py server {index} (new process): could not join the other "
                         f"servers ({exc}); ending\n")
        sys.stderr.flush()
        os._exit(1)
    relay = next(h for h in handovers if h["relay"])
    # A replacement worker's connection is accepted by all servers together
    # on the first server's port; only there does the name matter (a new
    # server 0's is published: Note [the servers' port] in _servers.py).
    port = (MPI.Open_port() if index == 0 else "-") if relay["ft"] else ""
    server = Server(None, relay["workers"], index, relay["config"], own, port, servers,
                    accept_own)
    server.service, server.generation = relay["service"], relay["generation"]
    server._port_lost = any(h.get("port_lost") for h in handovers)
    if index == 0 and relay["ft"] and not (
            server.service and publish_port(server.service, server.generation, port)):
        # No replacement worker can find this port (Note [the servers' port]).
        server._port_lost = True
    ports = server._adopt(handovers)
    own.send(ports, dest=(index + 1) % servers, tag=_JOIN_TAG)
    return server


if __name__ == "__main__":
    sys.exit(main())
