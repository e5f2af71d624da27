"""What workers and servers say to each other (Note [server protocol]), and
which server holds which part of a key (Note [key partition]).

# Note [server protocol]
Messages travel on the link (Note [server processes] in
``rabit_py/_servers.py``), pickled by mpi4py, point to point only. A worker
sends requests tagged :data:`REQUEST_TAG`, a server answers those that
want an answer with :data:`REPLY_TAG`, naming the request by its id. All
requests of one worker to one server share a tag, so MPI delivers them in
the order they were sent: a worker's pull of a key is handled after its
earlier pushes of that key, whatever their priorities.

Requests are tuples ``(op, store, ...)``; ``store`` is the id the workers
agreed on when they made the store, so several stores share the servers:

- ``OPEN, store, staleness, workers, checkpoint_every, id``: make the
  store's state, unless it exists (rank 0, again in a replacement of rank
  0); answer ``None``;
- ``INIT, store, key, part, array, id``: a part's first value (rank 0);
  answer ``None``;
- ``UPDATER, store, pickled, id``: the updater that pushes run through
  (rank 0; the same bytes again change nothing); answer ``None`` or the
  error's text;
- ``PUSH, store, key, part, array, worker``: apply a gradient part (no
  answer): through the updater, else added to the value (ps-lite's default
  server handle);
- ``PULL, store, key, part, clock, id, worker``: answer ``(value, clocks)``
  once the consistency model allows (Note [bounded delay] in ``server.py``);
  ``clocks[w]`` is the number of worker ``w``'s pushes that ``value`` holds;
- ``CLOCKS, store, key, part, id``: answer the part's ``clocks`` (how many
  pushes of each worker it holds: where a restarted or replaced worker
  resumes);
- ``SYNC, store, id``: answer ``None`` at once; as it comes behind the
  worker's pushes, the answer says they are applied (``wait_all``);
- ``CLOSE, store, id``: this worker is done with the store (every worker
  sends it, behind its own pushes); the server drops the store once every
  worker closed it; answer ``None``.

Answers are ``(id, status, payload)``, status ``"ok"`` or ``"error"``.

# Note [key partition]
As ps-lite does: a key smaller than ``bigarray_bound`` elements lives whole
on one server (an integer key on ``key % S``, a string key on its CRC-32
``% S``, so keys spread and every worker computes the same owner); a larger
one is cut into ``S`` contiguous slices of its flattened elements, slice
``i`` on server ``i``, so the servers share its traffic and its updates.
"""

from __future__ import annotations

import zlib
from typing import Any, Hashable, List, Tuple

__all__ = ["REQUEST_TAG", "REPLY_TAG", "OPEN", "INIT", "UPDATER", "PUSH", "PULL", "SYNC", "CLOCKS",
           "CLOSE",
           "Part", "partition", "idle_pause", "unfinished"]

REQUEST_TAG = 1
REPLY_TAG = 2

OPEN, INIT, UPDATER, PUSH, PULL, SYNC, CLOCKS, CLOSE = (
    "open", "init", "updater", "push", "pull", "sync", "clocks", "close")

#: one part of a key: (server index among the servers, first element, end)
Part = Tuple[int, int, int]


def partition(key: Hashable, size: int, servers: int, bigarray_bound: int) -> List[Part]:
    """The parts of a key of ``size`` elements (Note [key partition])."""
    if size >= bigarray_bound and servers > 1 and size >= servers:
        bounds = [size * i // servers for i in range(servers + 1)]
        return [(i, bounds[i], bounds[i + 1]) for i in range(servers)]
    if isinstance(key, int):
        owner = key % servers
    else:
        owner = zlib.crc32(str(key).encode()) % servers
    return [(owner, 0, size)]


# Note [polling]
# Servers and the workers' progress threads wait for messages by polling
# the link (MPI has no blocking wait that does not spin a core: a blocking
# probe in Open MPI busy-polls): a few probes back to back, then short
# sleeps (20 us growing to POLL_BUSY_S) while messages came lately, and
# POLL_IDLE_S once none came for POLL_IDLE_AFTER probes (some 30 ms). The
# short sleeps bound the latency a request meets at a server in a training
# loop; the long ones the cost of a server that waits for nothing. Measured
# on the 2-core VM: a server polling at a 50 us cap used 26% of a core with
# nothing to do, at 200 us 14%; and with a 200 us cap a step of
# bench_kvstore.py --consistency (4 workers, 2 servers) took 6% longer
# than dist_sync's, at 50 us 0-1%.
POLL_SPINS = 20
POLL_BUSY_S = 50e-6
POLL_IDLE_AFTER = 400
POLL_IDLE_S = 2e-3


def idle_pause(idle: int) -> float:
    """Seconds to sleep after ``idle`` empty probes in a row (0: probe again)."""
    if idle <= POLL_SPINS:
        return 0.0
    if idle > POLL_IDLE_AFTER:
        return POLL_IDLE_S
    return min(POLL_BUSY_S, 20e-6 * (1 << min(idle - POLL_SPINS, 10)))


def unfinished(requests: List[Any], error: Any) -> List[Any]:
    """The nonblocking sends of ``requests`` not completed yet; a send that
    failed (``error``: ``MPI.Exception``) to a process that died is dropped
    (its death is handled where the link's probe reports it)."""
    left = []
    for request in requests:
        try:
            if not request.test()[0]:
                left.append(request)
        except error:
            pass
    return left
