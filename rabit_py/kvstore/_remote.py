"""The server-backed store: ``dist_async`` and bounded delay (``dist_ssp``).

# Note [server-backed store]
Keys live on the server processes (Note [key partition] in
``_protocol.py``), and so does the updater: a worker's ``push`` queues its
gradient for the key's servers and returns, a ``pull`` asks them for the
current value and waits for the answer, which the consistency model may
hold back (Note [bounded delay] in ``server.py``). No collective is made on
the way: a slow worker delays nobody in ``dist_async``, and nobody by more
than ``staleness`` clocks in ``dist_ssp``. ``init``, ``set_optimizer``,
``set_updater``, ``barrier`` and ``close`` are collective among the
workers, as in MXNet (rank 0 talks to the servers, the others wait for it).

What is guaranteed: each server applies one worker's pushes in the order
they were made; a pull sees its own worker's earlier pushes of that key;
in ``dist_ssp`` a pull at clock ``c`` (this worker's pushes of the key so
far) sees every other worker's first ``c - staleness`` pushes of it (but a
dead worker's, until its replacement connects), which the worker checks on
every answer (``pull_clocks`` keeps the evidence). What is not: the order
in which the servers apply different workers' pushes depends on timing, so
results are not bitwise reproducible from run to run, unlike
``dist_sync``. A dead worker is replaced in the job (Note [replaced
workers] in ``server.py``); a dead server's parts are served from their
copy on the next server (``replicas=1``, Note [server replicas]), or the
job ends and a restart resumes from the servers' shard checkpoints (Note
[shard checkpoints]).
"""

from __future__ import annotations

import collections
import pickle
from typing import Any, Deque, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import api
from .._arrays import to_host
from .._servers import connect_replacement
from ..errors import KVStoreError, NotInitializedError
from ..ops import Op
from ._client import Client
from ._plans import Key, check_key
from ._protocol import CLOCKS, CLOSE, INIT, OPEN, PULL, PUSH, SYNC, UPDATER, Part, partition
from ._values import copy_out, local_sum, pairs
from .optimizer import Optimizer, Updater

__all__ = ["ServerKVStore", "ASYNC_TYPES"]

ASYNC_TYPES = ("dist_async", "dist_ssp")


class _Entry:
    __slots__ = ("shape", "dtype", "size", "parts", "pushes", "restored")

    def __init__(self, value: np.ndarray, parts: List[Part]) -> None:
        self.shape, self.dtype, self.size = value.shape, value.dtype, value.size
        self.parts = parts
        #: this worker's clock: its pushes of the key
        self.pushes = 0
        #: per part, this worker's pushes that a restored part holds already
        #: (Note [shard checkpoints] in server.py); 0 on a fresh start
        self.restored = [0] * len(parts)

    def holds(self, part: int) -> bool:
        """Whether ``part`` holds this worker's next push of the key already
        (a part restored past the worker's clock: Note [shard checkpoints])."""
        return self.restored[part] > self.pushes


def resume_clock(entries: Sequence[_Entry]) -> int:
    """The step a restarted worker resumes at: the fewest of its pushes that
    any restored part of any key holds (Note [shard checkpoints])."""
    return min((min(e.restored) for e in entries), default=0)


class ServerKVStore:
    """A key-value store on server processes (Note [server-backed store]).

    Made by ``rabit_py.kvstore.create("dist_async")`` or
    ``create("dist_ssp", staleness=tau)`` on every worker of a job started
    with servers (``rabit-run -n W --servers S``).

    Args:
        kvtype: ``"dist_async"`` or ``"dist_ssp"``.
        staleness: ``dist_ssp``'s bound ``tau >= 0`` in clocks (a worker's
            pushes of a key); 0 behaves as BSP. Not for ``dist_async``.
        bigarray_bound: keys of at least this many elements are split over
            all servers (ps-lite's ``MXNET_KVSTORE_BIGARRAY_BOUND``).
        timeout: seconds a pull or a collective step may wait before
            ``KVStoreError`` (a dead or stuck worker or server).
        checkpoint_every: each server writes its parts every this many
            pushes it applied, and at ``close``, into the job's checkpoint
            folder (``rabit-run --checkpoint-dir``); a restarted job resumes
            the store from them (Note [shard checkpoints] in ``server.py``).
            0: no checkpoints.
        name: names the store's checkpoint (default ``store<n>``, ``n`` its
            order among the process's server-backed stores).
        replicas: 1 keeps a copy of each server's parts on the next server,
            which serves them if that server dies (Note [server replicas] in
            ``server.py``; two servers or more); 0, the default, keeps none:
            a dead server then ends the job.

    Raises:
        KVStoreError: the job has no server processes.
        ValueError: an unknown type, or a bad staleness.
    """

    def __init__(self, kvtype: str = "dist_async", staleness: Optional[int] = None,
                 bigarray_bound: int = 1_000_000, timeout: float = 600.0,
                 checkpoint_every: int = 0, name: Optional[str] = None,
                 replicas: int = 0) -> None:
        if kvtype not in ASYNC_TYPES:
            raise ValueError(f"kvtype={kvtype!r}: a server-backed store is 'dist_async' or "
                             f"'dist_ssp'")
        if kvtype == "dist_ssp":
            if staleness is None or isinstance(staleness, bool) or \
                    not isinstance(staleness, int) or staleness < 0:
                raise ValueError(f"dist_ssp needs staleness=tau, an integer >= 0 (0 behaves "
                                 f"as BSP), got {staleness!r}")
        elif staleness is not None:
            raise ValueError("dist_async has no staleness bound; use create('dist_ssp', "
                             f"staleness={staleness!r})")
        if bigarray_bound < 1 or timeout <= 0 or checkpoint_every < 0:
            raise ValueError("bigarray_bound must be >= 1, timeout > 0 and checkpoint_every "
                             ">= 0")
        if replicas not in (0, 1):
            raise ValueError(f"replicas={replicas!r}: 0 or 1 (a copy on the next server)")
        if name is not None and (not name or "/" in name or name.startswith(".")):
            raise ValueError(f"name={name!r}: a store's name is a file name (no '/')")
        try:
            api.get_rank()
        except NotInitializedError:
            api.init()
        info = api.engine_info()
        if not info.servers:
            raise KVStoreError(f"rank {api.get_rank()}: kvtype={kvtype!r} runs on server "
                               f"processes, and this job has none: start it with rabit-run -n "
                               f"W --servers S python ... (or mpirun -x RABIT_SERVERS=S -n W "
                               f"python ... : -n S python -m rabit_py.kvstore.server)")
        # Rank 0's port, also for a replacement (Note [replaced workers] in
        # server.py): to it this broadcast is answered from the others' results.
        port = api.broadcast(info.server_port if info.rank == 0 else None, root=0)
        self._kvtype = kvtype
        self.staleness = staleness
        self.bigarray_bound = int(bigarray_bound)
        self.timeout = float(timeout)
        self._workers = api.get_world_size()
        self._servers = info.servers
        resources = api.resources()
        client = getattr(resources, "server_client", None)
        if client is None:
            link = api.server_comm()
            if link is None:                # a replacement: connect to the servers
                try:
                    link = connect_replacement(port, info.rank)
                except Exception as exc:  # noqa: BLE001
                    raise self._link_failed(exc) from exc
                client = Client(link, 0, self._servers, info.rank)
            else:
                client = Client(link, self._workers, self._servers, info.rank)
            resources.server_client = client
        self._client: Client = client
        self._keys: Dict[Key, _Entry] = {}
        self._pushed = False
        self._closed = False
        #: per pull answer (the last 10000): (key, part, own clock, clocks
        #: the value held) — the evidence of the staleness bound
        self.pull_clocks: Deque[Tuple[Key, int, int, Tuple[int, ...]]] = \
            collections.deque(maxlen=10000)
        # Every worker makes its stores in the same order, so they agree on
        # the id (the checkpoint's name too), in a restarted job as well.
        self._sid = name if name is not None else f"store{client.opened}"
        client.opened += 1
        self.checkpoint_every = int(checkpoint_every)
        self.replicas = int(replicas) if self._servers > 1 else 0
        if self.replicas:
            client.replicated.add(self._sid)
        self._from_rank0("open", [(server, (OPEN, self._sid, staleness, self._workers,
                                            self.checkpoint_every, self.replicas))
                                  for server in range(self._servers)], settle=False)

    # ------------------------------------------------------------ properties
    @property
    def type(self) -> str:
        """``"dist_async"`` or ``"dist_ssp"``."""
        return self._kvtype

    @property
    def rank(self) -> int:
        """This worker's rank."""
        return api.get_rank()

    @property
    def num_workers(self) -> int:
        """The number of workers (servers not counted)."""
        return self._workers

    @property
    def num_servers(self) -> int:
        """The number of server processes."""
        return self._servers

    @property
    def name(self) -> str:
        """The store's name (its checkpoint's folder)."""
        return str(self._sid)

    def clock(self, key: Optional[Key] = None) -> int:
        """This worker's clock: its pushes of ``key`` (the fewest over all
        keys without ``key``). After a restart from shard checkpoints every
        key starts at the fewest of this worker's pushes that any restored
        part holds (Note [shard checkpoints] in ``server.py``): a program
        that pushes each key once a step and initializes its keys before
        its first push resumes its data position from it (``for step in
        range(kv.clock(), steps)``).

        Raises:
            KVStoreError: an unknown key.
        """
        if key is not None:
            return self._known(key, "clock").pushes
        return min((e.pushes for e in self._keys.values()), default=0)

    @property
    def sent(self) -> Deque[Tuple[Hashable, str]]:
        """(key, "push"/"pull"...) in the order this process sent them (Note
        [sending order] in ``_client.py``; shared by the process's stores)."""
        return self._client.sent

    def hold(self) -> Any:
        """A context manager: requests made inside the block are queued and
        sent when it ends, in priority order (Note [sending order] in
        ``_client.py``), e.g. a step's pushes. A ``pull`` inside it would
        wait for ever: only other threads may pull meanwhile."""
        return self._client.hold()

    # ------------------------------------------------------------ data
    def init(self, key: Union[Key, Sequence[Key]], value: Any) -> None:
        """Create keys on the servers with rank 0's values. Collective.

        Raises:
            KVStoreError: a key exists already (or appears twice).
            TypeError, ValueError: a bad key or value.
        """
        self._check_usable()
        keys, values = pairs(key, value)
        requests = []
        for k, v in zip(keys, values):
            if k in self._keys or keys.count(k) > 1:
                raise KVStoreError(f"rank {self.rank}: key {k!r} is initialized twice; init "
                                   f"each key once, before its first push or pull")
            if isinstance(v, (list, tuple)):
                raise TypeError(f"init of key {k!r}: give one array, not a list")
            array = np.ascontiguousarray(to_host(v))
            entry = self._keys[k] = _Entry(array, partition(k, array.size, self._servers,
                                                            self.bigarray_bound))
            flat = array.reshape(-1)
            for part, (server, start, stop) in enumerate(entry.parts):
                requests.append((server, (INIT, self._sid, server, k, part, flat[start:stop])))
        self._from_rank0("init", requests)
        # What the parts hold of this worker's pushes already: restored from
        # a checkpoint (Note [shard checkpoints] in server.py), or pushed by
        # the worker this process replaces (Note [replaced workers]). Asked
        # by every worker itself: rank 0's answers, broadcast, would be
        # replayed to a replacement as they were. Until the first push every
        # key resumes at the store's clock, the fewest of this worker's
        # pushes any part holds: the step the program restarts at (each key
        # pushed once a step); parts that hold later steps skip them.
        waits = []
        for k in keys:
            for part, (server, _, _) in enumerate(self._keys[k].parts):
                rid = self._client.next_id()
                waits.append((k, part, self._send(server, ("control", "clocks"), 0,
                                                  (CLOCKS, self._sid, server, k, part, rid),
                                                  rid)))
        for k, part, pending in waits:
            clocks = self._answer(pending, f"init of key {k!r}")
            self._keys[k].restored[part] = int(clocks[self.rank])
        for k in keys:
            entry = self._keys[k]
            entry.pushes = min(entry.restored)
        if not self._pushed:
            resume = resume_clock(list(self._keys.values()))
            for entry in self._keys.values():
                entry.pushes = resume

    def push(self, key: Union[Key, Sequence[Key]], value: Any, priority: int = 0) -> None:
        """Send gradients to the keys' servers, which apply them (through the
        updater, else adding them to the value); returns at once. Each push
        of a key advances this worker's clock of it by one.

        Args:
            key: a key or a list of keys.
            value: an array, or a list of arrays summed here first; for a
                list of keys, one such entry per key.
            priority: higher is sent first (Note [sending order]).

        Raises:
            KVStoreError: a key was not initialized, a value's shape or dtype
                is not the key's, or the link failed.
        """
        self._check_usable()
        keys, values = pairs(key, value)
        for k, v in zip(keys, values):
            entry = self._known(k, "push")
            # Sent later, by the progress thread: a copy.
            flat = local_sum(k, v, entry.shape, entry.dtype, self.rank).reshape(-1)
            for part, (server, start, stop) in enumerate(entry.parts):
                if not entry.holds(part):
                    self._send(server, k, priority,
                               (PUSH, self._sid, server, k, part, flat[start:stop], self.rank,
                                entry.pushes))
            entry.pushes += 1
            self._pushed = True

    def pull(self, key: Union[Key, Sequence[Key]], out: Any = None,
             priority: int = 0) -> Any:
        """The keys' values from their servers, as the consistency model
        allows (Note [bounded delay] in ``server.py``): at once in
        ``dist_async``; in ``dist_ssp`` once they hold every worker's pushes
        up to this worker's clock minus ``staleness``.

        Args:
            key: a key or a list of keys.
            out: an array (or a list of arrays, each gets a copy) per key;
                None returns new arrays.
            priority: higher is sent first (Note [sending order]).

        Returns:
            ``out``, or the new array(s).

        Raises:
            KVStoreError: an unknown key, an ``out`` of another shape, no
                answer within ``timeout``, a server's updater failed, or the
                answer broke the staleness bound.
        """
        self._check_usable()
        single = not isinstance(key, (list, tuple))
        keys = [check_key(k) for k in ([key] if single else key)]
        outs: List[Any] = [None] * len(keys) if out is None else \
            ([out] if single else list(out))
        if len(outs) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(outs)} outputs")
        asked = []
        for k in keys:
            entry = self._known(k, "pull")
            waits = []
            for part, (server, _, _) in enumerate(entry.parts):
                rid = self._client.next_id()
                waits.append(self._send(server, k, priority, (
                    PULL, self._sid, server, k, part, entry.pushes, rid, self.rank), rid))
            asked.append((k, entry, entry.pushes, waits))
        results = []
        for (k, entry, clock, waits), o in zip(asked, outs):
            value = np.empty(entry.size, dtype=entry.dtype)
            for part, pending in enumerate(waits):
                server, start, stop = entry.parts[part]
                payload = self._answer(pending, f"pull of key {k!r}")
                part_value, clocks, absent = payload
                self._check_bound(k, part, clock, clocks, absent)
                # Pushes the part holds need no resending after a failover.
                self._client.applied((self._sid, server, k, part), int(clocks[self.rank]))
                value[start:stop] = part_value
            results.append(copy_out(k, value.reshape(entry.shape), o, self.rank))
        return results[0] if single else results

    def pushpull(self, key: Union[Key, Sequence[Key]], value: Any, out: Any = None,
                 priority: int = 0) -> Any:
        """``push`` then ``pull``; with ``out=None`` the result is written
        into ``value``. See :meth:`push` and :meth:`pull`."""
        self.push(key, value, priority)
        return self.pull(key, value if out is None else out, priority)

    def wait_all(self) -> None:
        """Wait until the servers have applied every push this worker made
        (a request to each server that comes behind them: Note [server
        protocol] in ``_protocol.py``).

        Raises:
            KVStoreError: not within ``timeout``, or the link failed.
        """
        self._check_usable()
        waits = []
        for server in range(self._servers):
            rid = self._client.next_id()
            waits.append(self._send(server, ("control", "sync"), 0, (SYNC, self._sid, rid), rid))
        for pending in waits:
            self._answer(pending, "wait_all")

    # ------------------------------------------------------------ updates
    def set_updater(self, updater: Any) -> None:
        """Run ``updater(key, grad, weight)`` on the servers for every push
        (it is pickled and loaded there: a function of an importable module,
        not of ``__main__``). Collective.

        Raises:
            TypeError: not callable.
            KVStoreError: a server cannot load it (on every worker).
        """
        if not callable(updater):
            raise TypeError(f"the updater must be callable, got {type(updater).__name__}")
        try:
            blob = pickle.dumps(updater)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"the updater cannot be pickled for the servers ({exc})") from exc
        self._from_rank0("set_updater", [(server, (UPDATER, self._sid, blob))
                                         for server in range(self._servers)])

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Update weights with ``optimizer`` on the servers. Collective.

        Raises:
            TypeError: not a :class:`rabit_py.optimizer.Optimizer`.
        """
        self.set_updater(Updater(optimizer))

    def barrier(self) -> None:
        """A barrier of the workers once the servers applied every push of
        each. Collective."""
        self.wait_all()
        api.allreduce(np.zeros(1, dtype=np.int32), Op.SUM)

    def checkpoint(self, local_model: Any = None) -> None:
        """Not the way for server-backed stores: the servers checkpoint their
        parts themselves (``checkpoint_every``).

        Raises:
            KVStoreError: always, saying so.
        """
        raise KVStoreError(f"rank {self.rank}: a {self._kvtype} store is checkpointed by its "
                           f"servers: create it with checkpoint_every=N (and start the job "
                           f"with rabit-run --checkpoint-dir); a restarted job resumes it, "
                           f"and kv.clock() gives this worker's step")

    load_checkpoint = checkpoint

    def close(self) -> None:
        """Send what is queued and drop the store on the servers (once every
        worker closed it; with ``checkpoint_every``, after a last
        checkpoint). Collective.

        Raises:
            KVStoreError: a server did not answer within ``timeout``.
        """
        if self._closed:
            return
        try:
            # Each worker's close travels behind its own pushes (Note
            # [server protocol]); a server drops the store after all of them.
            waits = []
            for server in range(self._servers):
                rid = self._client.next_id()
                waits.append(self._send(server, ("control", "close"), 0,
                                        (CLOSE, self._sid, rid), rid))
            for pending in waits:
                self._answer(pending, "close")
            api.allreduce(np.zeros(1, dtype=np.int32), Op.SUM)
        finally:
            self._closed = True

    def __enter__(self) -> "ServerKVStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._closed = True

    # ------------------------------------------------------------ internals
    def _send(self, server: int, key: Key, priority: int, request: tuple,
              rid: Optional[int] = None) -> Any:
        try:
            return self._client.send(server, key, priority, request, rid)
        except BaseException as exc:
            raise self._link_failed(exc) from exc

    def _answer(self, pending: Any, what: str) -> Any:
        try:
            status, payload = self._client.wait(pending, self.timeout)
        except TimeoutError:
            bound = (f"; in dist_ssp a pull waits for workers more than {self.staleness} "
                     f"clock(s) behind" if self.staleness is not None else "")
            error = KVStoreError(f"rank {self.rank}: {what}: no answer from the servers "
                                 f"within {self.timeout:g} s (a stuck or dead worker or "
                                 f"server{bound})")
            error.restartable = True    # type: ignore[attr-defined] - a fault, not a bug
            raise error from None
        except BaseException as exc:
            raise self._link_failed(exc) from exc
        if status != "ok":
            error = KVStoreError(f"rank {self.rank}: {what}: {payload}")
            if status == "lost":            # a server died with its parts: a fault
                error.restartable = True    # type: ignore[attr-defined]
            raise error
        return payload

    def _from_rank0(self, what: str, requests: List[Tuple[int, tuple]],
                    settle: bool = True) -> List[Any]:
        """Rank 0 sends ``requests`` (each with an answer id appended) and
        waits for every answer; then every worker learns the outcome and
        the answers. With ``settle``, this worker's pushes are applied first."""
        if settle:
            self.wait_all()
        error, answers = None, []
        if self.rank == 0:
            waits = []
            for server, request in requests:
                rid = self._client.next_id()
                waits.append(self._send(server, ("control", what), 0, request + (rid,), rid))
            for pending in waits:
                try:
                    answers.append(self._answer(pending, what))
                except KVStoreError as exc:
                    error = error or str(exc)
        error, answers = api.broadcast((error, answers), root=0)
        if error is not None:
            raise KVStoreError(error if self.rank == 0 else f"rank {self.rank}: {what} failed "
                               f"on rank 0: {error}")
        return answers

    def _check_bound(self, key: Key, part: int, clock: int, clocks: np.ndarray,
                     absent: Tuple[int, ...]) -> None:
        """Record what an answer held, and check it against the bound
        (Note [bounded delay]): the server enforces it, this checks the
        server."""
        held = tuple(int(c) for c in clocks)
        self.pull_clocks.append((key, part, clock, held))
        floor = clock if self.staleness is None else clock - self.staleness
        behind = [w for w, c in enumerate(held) if c < floor and w not in absent
                  and (self.staleness is not None or w == self.rank)]
        if behind:
            raise KVStoreError(f"rank {self.rank}: pull of key {key!r} at clock {clock} got a "
                               f"value holding only {[held[w] for w in behind]} push(es) of "
                               f"worker(s) {behind} (staleness {self.staleness}): the "
                               f"consistency model was broken; please report it")

    def _known(self, key: Key, action: str) -> _Entry:
        try:
            return self._keys[check_key(key)]
        except KeyError:
            raise KVStoreError(f"rank {self.rank}: {action} of key {key!r}, which was never "
                               f"initialized; call init({key!r}, value) first") from None

    def _check_usable(self) -> None:
        if self._closed:
            raise KVStoreError("the KVStore is closed")

    def _link_failed(self, exc: BaseException) -> KVStoreError:
        if isinstance(exc, KVStoreError):
            return exc
        error = KVStoreError(f"rank {self.rank}: the link to the servers failed "
                             f"({type(exc).__name__}: {exc}): a worker or server process "
                             f"died, and server-backed stores do not recover in the job yet; "
                             f"the job ends (rabit-run --max-restarts starts it again)")
        error.restartable = True        # type: ignore[attr-defined] - a fault, not a bug
        return error
