"""The parameter-server process: ``python -m rabit_py.kvstore.server``.

Started beside the workers (``rabit-run -n W --servers S python train.py``,
or ``mpirun -x RABIT_SERVERS=S -n W python train.py : -n S python -m
rabit_py.kvstore.server``; Note [server processes] in
``rabit_py/_servers.py``). It holds its parts of every key of the
server-backed stores (Note [key partition] in ``_protocol.py``), runs the
updater on each push it receives, and answers pulls as the store's
consistency model allows; it ends when every worker has left the job.

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
longer holds the others back. A worker that dies ends the job for now: the
server aborts it with a message (in-job recovery of server-backed stores is
not built yet), so that no pull waits forever for its pushes.
"""

from __future__ import annotations

import pickle
import sys
import time
import traceback
from typing import Any, Dict, Hashable, List, Optional, Tuple

import numpy as np

from .._servers import BYE_TAG, SERVER, split_world
from ..config import Config
from ._protocol import (CLOSE, INIT, OPEN, PULL, PUSH, REPLY_TAG, REQUEST_TAG, UPDATER,
                        idle_pause)

__all__ = ["Server", "main"]

_Slot = Tuple[Hashable, int]        # (key, part)


class _Store:
    """One store's parts on this server."""

    def __init__(self, staleness: Optional[int], workers: int) -> None:
        self.staleness = staleness
        self.workers = workers
        self.updater: Any = None
        self.values: Dict[_Slot, np.ndarray] = {}
        self.clocks: Dict[_Slot, np.ndarray] = {}
        #: pulls waiting for the bound: slot -> [(worker, clock, id)]
        self.waiting: Dict[_Slot, List[Tuple[int, int, int]]] = {}
        #: an updater that raised breaks the store: every later answer is this
        self.error: Optional[str] = None


class Server:
    """One server process's loop (Note [bounded delay]).

    Args:
        link: the workers-and-servers communicator (Note [server processes]).
        workers: the number of workers (the link's first ranks).
        index: this server's index among the servers.
    """

    def __init__(self, link: Any, workers: int, index: int) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.link = link
        self.workers = workers
        self.index = index
        self.stores: Dict[int, _Store] = {}
        self.departed: set = set()
        self._sends: List[Any] = []
        #: requests handled, by operation (for tests and the log)
        self.handled: Dict[str, int] = {}

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        """Serve until every worker has left the job."""
        MPI = self._mpi
        status = MPI.Status()
        idle = 0
        while len(self.departed) < self.workers:
            try:
                message = self.link.improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
                if message is None:
                    self._complete_sends()
                    idle += 1
                    pause = idle_pause(idle)     # Note [polling] in _protocol.py
                    if pause:
                        time.sleep(pause)
                    continue
                idle = 0
                request = message.recv()
            except MPI.Exception as exc:
                self._lost(exc)
                return
            source, tag = status.Get_source(), status.Get_tag()
            if tag == BYE_TAG:
                self.departed.add(source)
                for store in self.stores.values():
                    for slot in list(store.waiting):
                        self._release(store, slot)
            elif tag == REQUEST_TAG:
                self._handle(source, request)
        for request in self._sends:
            request.wait()

    def _handle(self, source: int, request: tuple) -> None:
        op, sid = request[0], request[1]
        self.handled[op] = self.handled.get(op, 0) + 1
        if op == PUSH:
            _, _, key, part, grad, worker = request
            store = self.stores[sid]
            slot = (key, part)
            if store.error is None:
                try:
                    if store.updater is not None:
                        store.updater(key, grad, store.values[slot])
                    else:
                        store.values[slot] += grad
                except Exception:  # noqa: BLE001 - said to every later pull
                    store.error = (f"server {self.index}: the updater raised on a push of key "
                                   f"{key!r}:\n{traceback.format_exc()}")
            store.clocks[slot][worker] += 1
            if store.waiting.get(slot):
                self._release(store, slot)
        elif op == PULL:
            _, _, key, part, clock, rid, worker = request
            store = self.stores[sid]
            slot = (key, part)
            if self._allowed(store, slot, clock):
                self._answer_pull(store, slot, source, rid)
            else:
                store.waiting.setdefault(slot, []).append((source, clock, rid))
        elif op == OPEN:
            _, _, staleness, workers, rid = request
            self.stores[sid] = _Store(staleness, workers)
            self._reply(source, rid, "ok", None)
        elif op == INIT:
            _, _, key, part, value, rid = request
            store = self.stores[sid]
            store.values[(key, part)] = np.array(value, copy=True)
            store.clocks[(key, part)] = np.zeros(store.workers, dtype=np.int64)
            self._reply(source, rid, "ok", None)
        elif op == UPDATER:
            _, _, blob, rid = request
            try:
                self.stores[sid].updater = pickle.loads(blob)
            except Exception as exc:  # noqa: BLE001 - told to the worker
                self._reply(source, rid, "error",
                            f"server {self.index} cannot load the updater ({type(exc).__name__}: "
                            f"{exc}); an updater must be importable by the server process (a "
                            f"rabit_py optimizer, or a function in an importable module, not in "
                            f"__main__)")
            else:
                self._reply(source, rid, "ok", None)
        elif op == CLOSE:
            _, _, rid = request
            self.stores.pop(sid, None)
            self._reply(source, rid, "ok", None)
        else:
            raise RuntimeError(f"server {self.index}: unknown request {op!r} from worker {source}")

    # ------------------------------------------------------------ pulls
    def _allowed(self, store: _Store, slot: _Slot, clock: int) -> bool:
        if store.staleness is None:
            return True
        clocks = store.clocks[slot]
        live = [w for w in range(store.workers) if w not in self.departed]
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
            self._reply(worker, rid, "ok", (store.values[slot], store.clocks[slot],
                                            tuple(sorted(self.departed))))

    # ------------------------------------------------------------ sending
    def _reply(self, worker: int, rid: int, status: str, payload: Any) -> None:
        self._sends.append(self.link.isend((rid, status, payload), dest=worker, tag=REPLY_TAG))

    def _complete_sends(self) -> None:
        if self._sends:
            self._sends = [r for r in self._sends if not r.test()[0]]

    def _lost(self, exc: BaseException) -> None:
        message = (f"rabit_py server {self.index}: a process of the job failed ({exc}); "
                   f"in-job recovery of server-backed stores (dist_async, dist_ssp) is not built "
                   f"yet, so the job ends here (rabit-run --max-restarts starts it again)")
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        self._mpi.COMM_WORLD.Abort(1)


def main(argv: Optional[List[str]] = None) -> int:
    """Run one server process (the job's last ``RABIT_SERVERS`` processes)."""
    config = Config.from_env()
    if config.servers < 1:
        sys.stderr.write("rabit_py.kvstore.server: RABIT_SERVERS is not set: start servers with "
                         "rabit-run -n W --servers S, or mpirun -x RABIT_SERVERS=S -n W python "
                         "train.py : -n S python -m rabit_py.kvstore.server\n")
        return 2
    from mpi4py import MPI

    own, link = split_world(MPI.COMM_WORLD, config.servers, SERVER)
    server = Server(link, link.Get_size() - config.servers, own.Get_rank())
    server.run()
    if config.log_level.upper() == "DEBUG":
        sys.stderr.write(f"rabit_py server {server.index}: handled {server.handled}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
