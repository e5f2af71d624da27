"""Node-local shared-memory allreduce, hierarchical across nodes.

# Note [shm allreduce]
Open MPI's shared-memory Allreduce moves each rank's whole buffer through
memory several times (copy to the peer, reduce the whole buffer), so at large
sizes it runs at a fraction of the machine's copy bandwidth. Here the ranks of
one node map one shared file (``/dev/shm``): per rank two flag lines,
a *slot* and a *result* area of ``chunk`` bytes each. An array is processed
in chunks small enough to stay in cache; for each chunk, every rank owns the
``1/P`` part of it with its node rank:

1. each rank copies the parts of its chunk that the *other* ranks own into its
   slot, and raises its ``in`` flag to the call's sequence number;
2. when every ``in`` flag is up, each rank reduces its own part over the
   node's ranks **in rank order** (its own input read in place), writing into
   its result area and its output, and raises its ``out`` flag;
3. when every ``out`` flag is up, each rank copies the other parts from their
   owners' result areas.

With two ranks per node (the common case of this machine) a *direct* variant
does less: each rank copies its whole chunk into one of two alternating
buffers, raises one flag, and reduces the whole chunk itself from both
buffers in rank order (both ranks compute the same bits); a buffer is
overwritten only after the peer raised the flag of the next chunk, i.e.
finished reading it.

In the general variant, a rank writes its slot for the next chunk only after every ``out`` flag of
the previous one is up (all reads of it are done), and its result area only
after every ``in`` flag of the next one (all copies out of it are done), so
two flags per chunk are the only synchronization. Every element is reduced
by one rank in one fixed order, so every rank gets the same bits, run after
run (not MPI's bits: the order differs). A flag is stored after the data it
guards, by the same thread, and the interpreter does not reorder the NumPy
copy and the store; x86 keeps stores in order and loads in order, so a rank
that sees the flag sees the data. Other architectures do not promise that,
and Python has no portable fence: there the path stays off (``SUPPORTED``).

Across nodes (or pseudo-nodes of ``RABIT_NODE_SIZE`` ranks, to test it on one
machine): each node reduces as above; the node leaders (node rank 0)
allreduce the node sums over MPI; each leader broadcasts the result on its
node. A custom reducer (``Op.create``) is called with whole arrays, never
pieces: node rank 0 applies it to every rank's whole input in rank order in
an area of the segment grown to fit (collectively, when a larger array
comes), the others copy the result.

# Note [fixed groups]
The bits of a hierarchical sum depend on the grouping: ``(a+b)+(c+d)`` is
not ``((a+b)+c)+d``. Grouping ranks by the host they run on *now* made a job
whose replacement started on another host compute other bits than a
failure-free run. So the groups are the hosts
of the job's *start* (``groups``: a group id per rank, computed at ``init``
and handed to replacements through the reducer's creation), kept for the
job's life. A group whose ranks no longer share one host reduces over MPI
instead of shared memory, in the same order: every rank's part is sent to
its owner (``Alltoallv``), reduced there in rank order, and gathered back
(``Allgatherv``), which gives the shared-memory path's bits exactly, since
either way each element is the left fold of the group's values in rank
order. Across groups the leaders' MPI allreduce depends on the group count
and rank numbers only (with Open MPI's HAN off: rabit-run turns it off on
several hosts).

# Note [kept results]
The robust engine keeps every allreduce result for replay (Note [result
cache]), and must be able to run a call again after a failure interrupted
it, so the caller's input has to stay intact until the result is complete.
Through the paths above that costs a copy of the input and a copy of the
result per rank, which made the robust allreduce 0.4-0.5x raw MPI's speed
at 1-16 MiB on two ranks. ``reduce_to_area`` makes the copy that the
algorithm writes anyway the kept one: each rank reduces its part of each
chunk (the general variant's ownership, operands in rank order) into a
whole-array *area* shared by the node, reading the others' parts from
alternating slot buffers; the caller's input is only read. When every
``out`` flag of the last chunk is up the area holds the node's sum (across
nodes: node rank 0 then allreduces it over the leaders, in place, and raises
its ``done`` flag); the caller copies it into its array (on one node it has it already: Note
[fused in place]) and keeps the area itself as the cached result: one area per node serves every rank on it, a
survivor still maps it after a node peer died, and a call interrupted before
the end finds its input intact.

Areas are anonymous memory files (``memfd``), made by node rank 0, which
announces the area of each call in its control line before raising its first
``in`` flag; the others open it through ``/proc/<pid>/fd`` and map it (so
nothing is ever left in ``/dev/shm``), and rank 0 closes its descriptor once
every ``out`` flag of the call is up. An area starts with one hold line per
node rank: rank 0 sets them all when it hands the area out, and each rank
clears its own when the cached view dies (a weak reference), so rank 0
reuses an area (smallest that fits) only when no rank holds it any more, and
makes a new one otherwise. After a failure the reducer is rebuilt; the old
areas live as long as some cached view maps them.

# Note [fused in place]
Where the node is the whole communicator (the ranks share one host),
``reduce_fused`` does what ``reduce_to_area`` does without keeping the
caller's input whole: for each chunk each rank offers the others' parts
into its slot as above, then reduces its own part *in place*, in the
caller's array (partial sums of more than two ranks go to a private buffer,
so the input is read before the last operation overwrites it: the same
operations in the same order, the same bits), copies it into the area while
it is in cache, raises its ``out`` flag, and copies the other ranks' parts of
the chunk before from the area once their ``out`` flags are up. A rank
writes its part of the result twice (array and area) and the others' once,
where ``reduce_to_area`` and a copy of the whole result out of the area at
the end wrote the whole result twice: 1.2-1.4x faster on two ranks at 1-16
MiB (``scripts/bench_bandwidth.py``).

The price is the input. A failure in the middle leaves each survivor's
array holding the result in some parts and the input in the others, and
which is which follows from the ``out`` flags, which stay in the segment: the
part of node rank q in chunk k is reduced iff q's ``out`` flag reached
chunk k's number, and then the area holds it (a rank overwrites its own part
only as it reduces it, the others' only after their flags). Once no rank
runs the call any more (after the repair, which every survivor joins), the
survivors read the same flags (:meth:`NodeReducer.unfinished`). The engine
runs the call again in recovery, every rank alike, replacements too
(``HostReduce.run_kept(..., again=True)``): one Allreduce agrees on what is
left; the result of a rank that finished the call (kept until the engine has
cached it) is broadcast; else the reduced parts (``finished_parts``) are
broadcast from a survivor that maps the area, and the rest, whose input is
intact on every rank, is reduced in rank order by :meth:`NodeReducer.allreduce`
(the same left fold, the same bits). A rank whose call finished keeps its
result until the engine cached it for the same reason: its input is gone, so
a failure noticed after the call must not run it from the array again.

# Note [check on the node]
Where the node is the whole communicator, the signature check's exchange
(Note [signature check] in ``_signature.py``) runs here too once the
reducer is built (:meth:`NodeReducer.exchange_check`): each rank writes its
vector into its lines, raises its check flag to the check's number and, once
every flag is up, takes the elementwise maximum of the vectors itself: the
same vector on every rank, as MPI's ``Allreduce(MAX)`` gives. Vectors
alternate between two places with the number's parity: a rank writes check
k+2's only after every rank raised check k+1's flag, i.e. finished reading
check k's. Every collective makes exactly one check, so the numbers stay
matched whatever calls the ranks make, as one MPI collective for the check
does. After a 1 MiB allreduce through this memory, MPI's small
``Allreduce`` of the check took 13 us more than the same wait on the flags
(median of 25 batches, 2 ranks; after MPI's own allreduce it costs
nothing extra): the check would cost a tenth of a fused 1 MiB call. The
engine takes the reducer's exchange for its check from the call after the
one that built the reducer (every rank builds it in the same call) until
the communicator is replaced.

# Note [uniform check]
The flags stay in the segment after their rank died, so the check on the
node has a uniform outcome, as ULFM's ``Agree`` has, which MPI's
``Allreduce`` has not: a rank passes it only once every flag is up, and a
flag once up stays up, so every rank that does not die passes it too. A
wait on a flag therefore ends with an error only while that flag is still
down once the error is seen (a rank that raised its flag and died since,
a revoke by a rank that passed and met a failure after, leave the
others' check alone). So a lazy checkpoint, which exchanges nothing after
its check, is committed by the check itself where it ran on the node: the
robust engine skips the ``Agree`` there (9 us of a 1 MiB training loop's
iteration on two ranks).

Waiting is spinning on the flags (yielding the CPU after a few hundred
reads, or at once where the node has more ranks than the host has CPUs, so
oversubscribed ranks still progress). A rank that dies while its
peers wait must not leave them spinning: every few milliseconds the waiters
check that their node peers' processes are alive and whether the engine's
watchdog fired or the communicator was revoked, and leave with the matching
MPI error, which the engine turns into recovery, ``RecoveryError`` or
``CollectiveTimeoutError`` as for any MPI call.
"""

from __future__ import annotations

import collections
import itertools
import mmap
import os
import platform
import tempfile
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
from mpi4py.util.dtlib import from_numpy_dtype

from .._status import process_alive
from ._mpistart import ERR_PROC_FAILED, ERR_REVOKED, MPI
from . import _control as control

__all__ = ["NodeReducer", "SUPPORTED", "Unfinished", "finished_parts", "host_groups"]

_LINE = 64                              # bytes per flag (one cache line each)
# Per rank: the "in" and "out" flags, the control line, the check's flag and
# its vector twice (Note [check on the node]).
_CHECK_FLAG = 3 * _LINE
_CHECK_VECTORS = 4 * _LINE
_CHECK_BYTES = 2 * _LINE                # room for a check vector (2 * N_FIELDS int64)
_FLAG_BYTES = 8 * _LINE
_SPINS_BEFORE_YIELD = 200
# More ranks than the host's CPUs: a waiter yields almost at once, since the
# rank it waits for may need its CPU (4 ranks on 2 CPUs, 1 MiB training loop:
# 1.81 -> 1.62 ms per iteration against 200 spins).
_SPINS_OVERSUBSCRIBED = 2
_DIRECT_MAX_RANKS = 2            # up to this many ranks per node: the direct variant
_CHECK_EVERY_S = 0.005
_PAGE = mmap.PAGESIZE
#: The flags rely on x86's store order (Note [shm allreduce]).
SUPPORTED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_SEGMENT_IDS = itertools.count()


# Op code -> the NumPy ufunc that reduces two arrays (ops.Op values).


def host_groups(hosts: Sequence[str], node_size: int = 0) -> List[int]:
    """The group of each rank (Note [fixed groups]): the smallest rank on the
    same host, or ``rank // node_size`` for pseudo-nodes of ``node_size``."""
    if node_size > 0:
        return [rank // node_size for rank in range(len(hosts))]
    first: dict = {}
    return [first.setdefault(host, rank) for rank, host in enumerate(hosts)]


class NodeReducer:
    """The shared-memory allreduce of one communicator (Note [shm allreduce]).

    Collective over ``comm`` to build.

    Args:
        comm: the engine's communicator.
        groups: the group ("node") of each rank, fixed for the job's life
            (Note [fixed groups]); see :func:`host_groups`.
        chunk_bytes: bytes of one pipeline chunk (per rank: a slot and a
            result area of this size).
        interrupted: returns an MPI error class when the wait must end (the
            watchdog fired, the communicator was revoked), else None.
    """

    def __init__(self, comm: Any, groups: Sequence[int], chunk_bytes: int = 1 << 20,
                 interrupted: Optional[Callable[[], Optional[int]]] = None) -> None:
        rank = comm.Get_rank()
        self.groups = list(groups)
        self.node = comm.Split(self.groups[rank], rank)
        self.node.Set_errhandler(MPI.ERRORS_RETURN)
        self.node_rank = self.node.Get_rank()
        self.node_size = self.node.Get_size()
        leaders = comm.Split(0 if self.node_rank == 0 else MPI.UNDEFINED, rank)
        self.leaders = leaders if leaders != MPI.COMM_NULL else None
        if self.leaders is not None:
            self.leaders.Set_errhandler(MPI.ERRORS_RETURN)
        self.nodes = len(set(self.groups))
        #: The largest node: 1 means no rank shares a node (nothing to gain).
        self.max_node_size = max(collections.Counter(self.groups).values())
        # Note [fixed groups]: whether this group still shares one host.
        self.colocated = bool(control.reduce_int(self.node, int(self._shares_one_host()), MPI.MIN))
        self.pids: List[int] = control.allgather(self.node, os.getpid(), "shm.pids")
        self.chunk = max(_LINE, chunk_bytes // _LINE * _LINE)
        self._spins = (_SPINS_BEFORE_YIELD if self.node_size <= (os.cpu_count() or 1)
                       else _SPINS_OVERSUBSCRIBED)
        self._interrupted = interrupted or (lambda: None)
        self._seq = 0
        self._call = 0                  # the first sequence number of the current kept call
        self._capacity = 0
        self._map: Optional[mmap.mmap] = None
        # Note [kept results]: this rank's mappings of the node's areas.
        self._areas: Dict[int, _Area] = {}
        self._area_ids = itertools.count()
        self._let_go_by_me: List[_Area] = []       # node rank 0's candidates for reuse
        self._views: Dict[int, tuple] = {}          # weak references to the kept views
        if self.colocated:
            self._allocate(0)
        #: Whether :meth:`reduce_to_area` can run (Note [kept results]).
        self.keeps = self.colocated and self.node_size > 1 and self._areas_open()
        #: Whether :meth:`reduce_fused` can run (Note [fused in place]): the
        #: node is the whole communicator.
        self.fused = self.keeps and self.nodes == 1
        self._scratch: Optional[np.ndarray] = None
        #: The fused call in progress: its first sequence number and area.
        self._fused_call: Optional[tuple] = None
        #: Whether :meth:`exchange_check` can run (Note [check on the node]).
        self.checks = self.colocated and self.nodes == 1 and self.node_size > 1

    def _shares_one_host(self) -> bool:
        """Whether this rank shares a host with every rank of its group
        (collective on the group)."""
        shared = self.node.Split_type(MPI.COMM_TYPE_SHARED, key=self.node_rank)
        together = shared.Get_size() == self.node_size
        shared.Free()
        return together

    def _areas_open(self) -> bool:
        """Whether every node rank can open an area that node rank 0 made
        (Note [kept results]; collective on the node)."""
        fd = -1
        if self.node_rank == 0 and hasattr(os, "memfd_create"):
            try:
                fd = os.memfd_create("rabit_py-probe", os.MFD_CLOEXEC)
            except OSError:
                fd = -1
        fd = control.bcast(self.node, fd, 0, "shm.probe")
        ok = fd >= 0
        if ok and self.node_rank != 0:
            try:
                os.close(os.open(f"/proc/{self.pids[0]}/fd/{fd}", os.O_RDWR))
            except OSError:
                ok = False
        ok = bool(control.reduce_int(self.node, int(ok), MPI.MIN))
        if self.node_rank == 0 and fd >= 0:
            os.close(fd)
        return ok

    # ------------------------------------------------------------ segment
    def _allocate(self, custom_bytes: int) -> None:
        """(Re)map the segments: flags, slot, result, and ``custom_bytes`` for
        whole-array custom reductions. Collective on the node.

        One file in ``/dev/shm`` per node, made by node rank 0 and mapped by
        all; it is unlinked as soon as everyone mapped it, so it disappears
        with the last process, however the job ends. (Not an MPI window: MPI
        one-sided windows print warnings under ULFM and add nothing here.)
        """
        if self._map is not None:
            self.node.Barrier()              # every copy out of the old segments is done
            self._release()
        per_rank = _FLAG_BYTES + 2 * self.chunk + custom_bytes
        total = per_rank * self.node_size
        path = None
        if self.node_rank == 0:
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            path = os.path.join(folder, f"rabit_py-{os.getpid()}-{next(_SEGMENT_IDS)}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, total)
            except OSError:
                os.close(fd)
                os.unlink(path)
                raise
        path = control.bcast(self.node, path, 0, "shm.segment")
        if self.node_rank != 0:
            fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        self.node.Barrier()
        if self.node_rank == 0:
            os.unlink(path)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        segments = [whole[q * per_rank:(q + 1) * per_rank] for q in range(self.node_size)]
        self._in = [s[:8].view(np.int64) for s in segments]
        self._out = [s[_LINE:_LINE + 8].view(np.int64) for s in segments]
        # Note [kept results]: the area of the call, its descriptor, "done",
        # and the call this rank left with an error ("abandoned").
        self._ctl = [s[2 * _LINE:2 * _LINE + 32].view(np.int64) for s in segments]
        start = _FLAG_BYTES
        self._slot = [s[start:start + self.chunk] for s in segments]
        self._result = [s[start + self.chunk:start + 2 * self.chunk] for s in segments]
        self._custom = [s[start + 2 * self.chunk:] for s in segments]
        self._capacity = custom_bytes
        self._seq = 0                    # new segments start with every flag at 0
        self._check_flags = [s[_CHECK_FLAG:_CHECK_FLAG + 8].view(np.int64) for s in segments]
        self._check_rows = [
            [s[_CHECK_VECTORS + half:_CHECK_VECTORS + half + _CHECK_BYTES].view(np.int64)
             for s in segments] for half in (0, _CHECK_BYTES)]
        self._checked = 0

    def _release(self) -> None:
        self._in = self._out = self._ctl = self._slot = self._result = self._custom = []
        self._check_flags, self._check_rows = [], []
        try:
            self._map.close()
        except BufferError:              # a view is still alive somewhere: leave it mapped
            pass
        self._map = None

    def free(self) -> None:
        """Unmap the segments and free the communicators (collective on the node)."""
        if self._map is not None:
            self._release()
        self._areas = {}
        self._let_go_by_me = []
        for comm in (self.node, self.leaders):
            if comm is not None:
                comm.Free()

    def revoke(self) -> None:
        """ULFM: revoke the node and leaders communicators, so that peers
        blocked in them (waiting for a rank that left after a failure) return."""
        for comm in (self.node, self.leaders):
            if comm is not None:
                try:
                    comm.Revoke()
                except MPI.Exception:
                    pass

    def is_revoked(self) -> bool:
        """ULFM: whether a peer revoked the node or leaders communicator."""
        return any(comm is not None and comm.Is_revoked() for comm in (self.node, self.leaders))

    # ------------------------------------------------------------ collectives
    def allreduce(self, flat: np.ndarray, ufunc: Any,
                  leaders_allreduce: Callable[[Any, np.ndarray], None]) -> None:
        """Reduce the 1-D contiguous ``flat`` in place over the communicator:
        ``ufunc`` (a NumPy binary ufunc) on the node, then
        ``leaders_allreduce(leaders_comm, flat)`` among the node leaders (MPI).

        Raises:
            MPI.Exception: a node peer died (``ERR_PROC_FAILED``), the wait
                was interrupted (the class ``interrupted`` returned), or MPI failed.
        """
        # MPI reduces overflowing or NaN values silently: so do we.
        with np.errstate(all="ignore"):
            if self.node_size > 1 and not self.colocated:
                self._node_allreduce_mpi(flat, ufunc)
            elif self.node_size > _DIRECT_MAX_RANKS:
                self._node_allreduce(flat, ufunc)
            elif self.node_size > 1:
                self._node_allreduce_direct(flat, ufunc)
        self._across_nodes(flat, leaders_allreduce)
        self._check_revoked()

    def allreduce_custom(self, data: np.ndarray, fn: Callable[[np.ndarray, np.ndarray], Any],
                         leaders_allreduce: Callable[[Any, np.ndarray], None]) -> None:
        """Reduce the contiguous ``data`` in place with ``fn(lower_rank_value,
        higher_rank_value)`` called on whole arrays (Note [shm allreduce]).

        Raises:
            MPI.Exception: as :meth:`allreduce`.
        """
        if self.node_size > 1 and not self.colocated:
            # Note [fixed groups]: the same fold, over MPI.
            flat = data.reshape(-1)
            everyone = np.empty((self.node_size, flat.size), dtype=data.dtype) \
                if self.node_rank == 0 else None
            self.node.Gather(flat, everyone, root=0)
            if self.node_rank == 0:
                acc = data
                for q in range(1, self.node_size):
                    acc = np.asarray(fn(acc, everyone[q].reshape(data.shape)))
                np.copyto(data, acc, casting="unsafe")
            self.node.Bcast(flat, root=0)
        elif self.node_size > 1:
            nbytes = data.nbytes
            if nbytes > self._capacity:
                self._allocate(nbytes)
            flat = data.reshape(-1)
            area = self._custom[self.node_rank][:nbytes].view(data.dtype)
            self._seq += 1
            seq = self._seq
            if self.node_rank != 0:              # rank 0 reads its own input in place
                np.copyto(area, flat)
            self._raise(self._in, seq)
            if self.node_rank == 0:
                # Rank 0's area holds the result: the others read it after the
                # "out" flags, and rank 0 writes it again only after the next
                # call's "in" flags, i.e. after every copy is done.
                self._wait(self._in, seq)
                acc = data
                for q in range(1, self.node_size):
                    other = self._custom[q][:nbytes].view(data.dtype).reshape(data.shape)
                    acc = np.asarray(fn(acc, other))
                np.copyto(data, acc, casting="unsafe")
                np.copyto(area, flat)
            self._raise(self._out, seq)
            self._wait(self._out, seq)
            if self.node_rank != 0:
                np.copyto(flat, self._custom[0][:nbytes].view(data.dtype))
        self._across_nodes(data.reshape(-1), leaders_allreduce)
        self._check_revoked()

    def _across_nodes(self, flat: np.ndarray,
                      leaders_allreduce: Callable[[Any, np.ndarray], None]) -> None:
        if self.nodes == 1:
            return
        if self.leaders is not None:
            leaders_allreduce(self.leaders, flat)
            self._check_revoked()       # before the node is given the leaders' result
        if self.node_size > 1:
            self.node.Bcast(flat, root=0)

    def reduce_to_area(self, flat: np.ndarray, ufunc: Any,
                       leaders_allreduce: Callable[[Any, np.ndarray], None],
                       in_place: bool = False) -> np.ndarray:
        """Reduce the 1-D contiguous, non-empty ``flat`` over the communicator
        into an area shared by the node, leaving ``flat`` as it is (Note
        [kept results]; only where :attr:`keeps`). ``in_place``: write the
        result into ``flat`` too, once the call is done (until then the
        input is whole, so a failed call can run again).

        Returns:
            The result: a read-only view of the area, which stays the
            node's until the last view of it (and of arrays made from it) dies.

        Raises:
            MPI.Exception: as :meth:`allreduce`.
        """
        self._call = self._seq + 1
        try:
            return self._reduce_to_area(flat, ufunc, leaders_allreduce, in_place)
        except BaseException:
            # Node peers may wait on this rank's flags, or on "done" while
            # it leaves after its leaders' step failed; no MPI call wakes
            # them (a revoke reaches a rank only when it calls MPI), so they
            # look at this word (_check_alive).
            self._ctl[self.node_rank][3] = self._call
            raise

    def _reduce_to_area(self, flat: np.ndarray, ufunc: Any,
                        leaders_allreduce: Callable[[Any, np.ndarray], None],
                        in_place: bool) -> np.ndarray:
        size, me = self.node_size, self.node_rank
        item, dtype = flat.itemsize, flat.dtype
        per = self.chunk // item
        buffers = (self._slot, self._result)
        area = self._hand_out(flat.nbytes) if me == 0 else None
        with np.errstate(all="ignore"):
            for start in range(0, flat.size, per):
                stop = min(flat.size, start + per)
                m = stop - start
                bounds = [m * q // size for q in range(size + 1)]
                lo, hi = bounds[me], bounds[me + 1]
                self._seq += 1
                seq = self._seq
                # Alternating buffers: every rank raised its "in" flag of the
                # previous chunk (waited for there), so it has read this
                # buffer's chunk before it (as in the direct variant).
                current = buffers[seq & 1]
                _offer(current[me][:m * item].view(dtype), flat, start, stop, lo, hi)
                self._raise(self._in, seq)
                self._wait(self._in, seq)
                if area is None:
                    area = self._opened(int(self._ctl[0][0]), int(self._ctl[0][1]))
                result = area.data[(start + lo) * item:(start + hi) * item].view(dtype)
                parts = [flat[start + lo:start + hi] if q == me
                         else current[q][:m * item].view(dtype)[lo:hi] for q in range(size)]
                _fold(ufunc, parts, result)
                self._raise(self._out, seq)
        assert area is not None, "reduce_to_area needs a non-empty array"
        last = self._seq
        self._wait(self._out, last)     # the node's sum is whole; every rank mapped the area
        if me == 0 and area.fd >= 0:
            os.close(area.fd)
            area.fd = -1
        whole = area.data[:flat.nbytes].view(dtype)
        if self.nodes > 1:
            if self.leaders is not None:
                leaders_allreduce(self.leaders, whole)
                self._check_revoked()   # before the node is given the leaders' result
                self._ctl[0][2] = last
            else:
                self._wait_one(self._ctl[0][2:], last, 0)
        self._check_revoked()
        view = self._kept_view(area, flat)
        if in_place:
            np.copyto(flat, view)
        return view

    def _kept_view(self, area: "_Area", flat: np.ndarray) -> np.ndarray:
        """The cached result: an array of its own over the area's mapping,
        not a view of ``area.data``: NumPy points every view made from it (a
        reshape, a slice) at it, so it lives, and the area stays held, as
        long as any of them does."""
        view = np.ndarray(flat.shape, flat.dtype, area.map, area.header)
        view.flags.writeable = False
        # A weak reference whose callback lets go of the area (1 us less per
        # call than weakref.finalize); kept here, since a reference that dies
        # first never calls back. A reducer dropped after a failure drops
        # them: its areas are not handed out again anyway.
        ref = weakref.ref(view, self._view_died)
        self._views[id(ref)] = (ref, area)          # an array has no hash
        return view

    def _view_died(self, ref: "weakref.ref[np.ndarray]") -> None:
        """The last view of an area died: the area is no longer this rank's
        (node rank 0 also lists it, to look at when it hands out the next one)."""
        area = self._views.pop(id(ref))[1]
        area.holds[self.node_rank][0] = 0
        if self.node_rank == 0:
            self._let_go_by_me.append(area)

    def reduce_fused(self, flat: np.ndarray, ufunc: Any) -> np.ndarray:
        """Reduce the 1-D contiguous, non-empty ``flat`` in place over the
        communicator, keeping the result in an area shared by the node too
        (Note [fused in place]; only where :attr:`fused`). ``flat`` is
        overwritten part by part before the call ends: after a failure,
        :meth:`unfinished` says which parts hold the result.

        Returns:
            The result in the area, read-only (as :meth:`reduce_to_area`).

        Raises:
            MPI.Exception: as :meth:`allreduce`.
        """
        self._call = self._seq + 1
        try:
            return self._reduce_fused(flat, ufunc)
        except BaseException:
            self._ctl[self.node_rank][3] = self._call     # as in reduce_to_area
            raise

    def _reduce_fused(self, flat: np.ndarray, ufunc: Any) -> np.ndarray:
        size, me = self.node_size, self.node_rank
        item, dtype = flat.itemsize, flat.dtype
        per = self.chunk // item
        buffers = (self._slot, self._result)
        acc = self._partial_sums(dtype)
        self._fused_call = None
        area = self._hand_out(flat.nbytes) if me == 0 else None
        before = self._seq                      # chunk k is numbered before + 1 + k
        kept: Optional[np.ndarray] = None
        pending: Optional[tuple] = None
        with np.errstate(all="ignore"):
            for start in range(0, flat.size, per):
                stop = min(flat.size, start + per)
                m = stop - start
                lo, hi = start + m * me // size, start + m * (me + 1) // size
                self._seq += 1
                seq = self._seq
                # Buffers alternate with the sequence number, across calls
                # too: this one was read for the chunk numbered two before,
                # and every node rank is past that one (its "out" flags, or
                # the "in" flags of the next one, were waited for).
                current = buffers[seq & 1]
                _offer(current[me][:m * item].view(dtype), flat, start, stop, lo - start,
                       hi - start)
                self._raise(self._in, seq)
                self._wait(self._in, seq)
                if kept is None:
                    if area is None:
                        area = self._opened(int(self._ctl[0][0]), int(self._ctl[0][1]))
                    self._fused_call = (before, area)
                    kept = area.data[:flat.nbytes].view(dtype)
                if hi > lo:
                    mine = flat[lo:hi]
                    parts = [mine if q == me
                             else current[q][:m * item].view(dtype)[lo - start:hi - start]
                             for q in range(size)]
                    _fold_in_place(ufunc, parts, mine, acc[:hi - lo])
                    np.copyto(kept[lo:hi], mine)
                self._raise(self._out, seq)
                if pending is not None:
                    self._copy_others(flat, kept, *pending)
                pending = (start, stop, lo, hi, seq)
            assert pending is not None and area is not None and kept is not None, \
                "reduce_fused needs a non-empty array"
            self._copy_others(flat, kept, *pending)
        self._fused_call = None
        if me == 0 and area.fd >= 0:
            os.close(area.fd)
            area.fd = -1
        # No _check_revoked: nothing here is an MPI call that a revoke could
        # cut short (the engine checks its own communicator after the call).
        return self._kept_view(area, flat)

    def _copy_others(self, flat: np.ndarray, kept: np.ndarray, start: int, stop: int,
                     lo: int, hi: int, seq: int) -> None:
        """Once every node rank reduced its part of the chunk ``[start,
        stop)``, copy the parts around this rank's own ``[lo, hi)`` from the
        area."""
        self._wait(self._out, seq)
        if lo > start:
            np.copyto(flat[start:lo], kept[start:lo])
        if stop > hi:
            np.copyto(flat[hi:stop], kept[hi:stop])

    def _partial_sums(self, dtype: np.dtype) -> np.ndarray:
        """A private buffer for the partial sums of one part of a chunk."""
        if self._scratch is None:
            self._scratch = np.empty(self.chunk // self.node_size + 2 * _LINE, dtype=np.uint8)
        return self._scratch[:self._scratch.nbytes // dtype.itemsize * dtype.itemsize].view(dtype)

    def unfinished(self, flat: np.ndarray) -> Optional["Unfinished"]:
        """After :meth:`reduce_fused` of ``flat`` raised: what the
        call left (Note [fused in place]), or None if it failed before this
        rank mapped the call's area (then it wrote nothing into its input)."""
        if self._fused_call is None:
            return None
        first, area = self._fused_call
        self._fused_call = None
        return Unfinished(first, self.chunk // flat.itemsize, flat.size, area, list(self._out))

    def _hand_out(self, nbytes: int) -> "_Area":
        """Node rank 0: the smallest area of ``nbytes`` that no rank holds,
        or a new one, held by every rank and announced in the control line.
        Only areas that rank 0 let go of are looked at (a program that never
        checkpoints holds hundreds)."""
        best: Optional[_Area] = None
        for area in self._let_go_by_me:
            if area.capacity >= nbytes and (best is None or area.capacity < best.capacity) \
                    and not any(hold[0] for hold in area.holds):
                best = area
        if best is None:
            best = self._new_area(nbytes)
        else:
            self._let_go_by_me.remove(best)
        for hold in best.holds:
            hold[0] = 1
        ctl = self._ctl[0]
        ctl[0] = best.index
        ctl[1] = best.fd
        return best

    def _new_area(self, nbytes: int) -> "_Area":
        header = -(-self.node_size * _LINE // _PAGE) * _PAGE
        capacity = -(-nbytes // _PAGE) * _PAGE
        index = next(self._area_ids)
        fd = os.memfd_create(f"rabit_py-area-{index}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, header + capacity)
            area = _Area(index, fd, mmap.mmap(fd, header + capacity), header,
                         self.node_size)
        except BaseException:
            os.close(fd)
            raise
        self._areas[index] = area
        return area

    def _opened(self, index: int, fd: int) -> "_Area":
        """A node rank other than 0: the area ``index`` that rank 0 announced,
        mapped from its descriptor the first time."""
        area = self._areas.get(index)
        if area is None:
            try:
                mine = os.open(f"/proc/{self.pids[0]}/fd/{fd}", os.O_RDWR)
            except OSError:             # node rank 0 died since it announced the area
                raise MPI.Exception(ERR_PROC_FAILED) from None
            try:
                length = os.fstat(mine).st_size
                header = -(-self.node_size * _LINE // _PAGE) * _PAGE
                area = _Area(index, -1, mmap.mmap(mine, length), header, self.node_size)
            finally:
                os.close(mine)
            self._areas[index] = area
        return area

    def _check_revoked(self) -> None:
        """Note [revoked success] in ``_frame.py``, for the node and leaders
        communicators: an MPI call on them that a peer's revoke interrupts can
        return success with part of the data. The engine checks its own
        communicator after each call, but a peer revokes these first (a rank
        killed in a hierarchical allreduce, and the others' results would
        miss its part): the result is trusted only if neither was revoked."""
        try:
            revoked = self.is_revoked()
        except (AttributeError, NotImplementedError, MPI.Exception):
            return                      # an MPI without fault tolerance: nothing revokes
        if revoked:
            raise MPI.Exception(ERR_REVOKED)

    def _node_allreduce(self, flat: np.ndarray, ufunc: Any) -> None:
        size, me = self.node_size, self.node_rank
        item = flat.itemsize
        per = self.chunk // item
        dtype = flat.dtype
        for start in range(0, flat.size, per):
            stop = min(flat.size, start + per)
            m = stop - start
            bounds = [m * q // size for q in range(size + 1)]
            lo, hi = bounds[me], bounds[me + 1]
            self._seq += 1
            seq = self._seq
            _offer(self._slot[me][:m * item].view(dtype), flat, start, stop, lo, hi)
            self._raise(self._in, seq)
            self._wait(self._in, seq)
            parts = [flat[start + lo:start + hi] if q == me
                     else self._slot[q][:m * item].view(dtype)[lo:hi] for q in range(size)]
            result = self._result[me][:(hi - lo) * item].view(dtype)
            _fold(ufunc, parts, result)
            self._raise(self._out, seq)
            np.copyto(flat[start + lo:start + hi], result)
            self._wait(self._out, seq)
            for q in range(size):
                if q != me:
                    a, b = bounds[q], bounds[q + 1]
                    theirs = self._result[q][:(b - a) * item].view(dtype)
                    np.copyto(flat[start + a:start + b], theirs)

    def _node_allreduce_mpi(self, flat: np.ndarray, ufunc: Any) -> None:
        """A group whose ranks are on several hosts (Note [fixed groups]):
        each rank reduces its part over the group in rank order, as
        :meth:`_node_allreduce` does through shared memory."""
        size, me = self.node_size, self.node_rank
        bounds = [flat.size * q // size for q in range(size + 1)]
        counts = [bounds[q + 1] - bounds[q] for q in range(size)]
        mine = counts[me]
        datatype = from_numpy_dtype(flat.dtype)
        rows = np.empty((size, mine), dtype=flat.dtype)
        self.node.Alltoallv([flat, (counts, bounds[:-1]), datatype],
                            [rows, ([mine] * size, [mine * q for q in range(size)]), datatype])
        result = np.empty(mine, dtype=flat.dtype)
        ufunc(rows[0], rows[1], out=result)
        for q in range(2, size):
            ufunc(result, rows[q], out=result)
        self.node.Allgatherv(result, [flat, (counts, bounds[:-1]), datatype])

    def _node_allreduce_direct(self, flat: np.ndarray, ufunc: Any) -> None:
        """Few ranks (Note [shm allreduce], direct variant): every rank copies
        its chunk into a buffer and reduces the whole chunk itself from all
        buffers, in rank order; one flag per chunk. Buffers alternate, so a
        rank overwrites one only after every peer raised the flag of the
        next chunk, i.e. finished reading it."""
        size, me = self.node_size, self.node_rank
        item = flat.itemsize
        per = self.chunk // item
        dtype = flat.dtype
        buffers = (self._slot, self._result)
        for start in range(0, flat.size, per):
            stop = min(flat.size, start + per)
            self._seq += 1
            seq = self._seq
            nbytes = (stop - start) * item
            mine = flat[start:stop]
            np.copyto(buffers[seq & 1][me][:nbytes].view(dtype), mine)
            self._raise(self._in, seq)
            self._wait(self._in, seq)
            parts = [buffers[seq & 1][q][:nbytes].view(dtype) for q in range(size)]
            _fold(ufunc, parts, mine)

    # ------------------------------------------------------------ the check
    def exchange_check(self, vec: np.ndarray) -> None:
        """The signature check's exchange through the node's memory (Note
        [check on the node]; only where :attr:`checks`): ``vec``, the
        ``int64`` vector of this rank, becomes the elementwise maximum of
        every rank's, as MPI's ``Allreduce(MAX)`` makes it.

        Raises:
            MPI.Exception: as :meth:`allreduce`.
        """
        self._checked += 1
        seq = self._checked
        me = self.node_rank
        rows = self._check_rows[seq & 1]
        mine = rows[me]
        mine[:vec.size] = vec
        self._check_flags[me][0] = seq
        same = True
        sent = mine.tobytes()
        for q in range(self.node_size):
            if q != me:
                self._wait_one(self._check_flags[q], seq, q, only_q=True)
                same = same and rows[q].tobytes() == sent
        if not same:
            for q in range(self.node_size):
                np.maximum(vec, rows[q][:vec.size], out=vec)

    # ------------------------------------------------------------ flags
    def _raise(self, flags: List[np.ndarray], seq: int) -> None:
        flags[self.node_rank][0] = seq

    def _wait(self, flags: List[np.ndarray], seq: int) -> None:
        """Until every node rank's flag reached ``seq``; checks peers and the
        engine every few milliseconds."""
        for q in range(self.node_size):
            self._wait_one(flags[q], seq, q)

    def _wait_one(self, flag: np.ndarray, seq: int, q: int, only_q: bool = False) -> None:
        """Until ``flag[0]``, node rank ``q``'s, reached ``seq``. ``only_q``:
        only ``q`` leaving ends the wait, not another peer (Note [uniform
        check]). A flag that is up ends the wait whatever happened since."""
        spins = 0
        checked = time.monotonic()
        while flag[0] < seq:
            spins += 1
            if spins < self._spins:
                continue
            os.sched_yield()
            now = time.monotonic()
            if now - checked > _CHECK_EVERY_S:
                checked = now
                try:
                    self._check_alive(q, only_q)
                except MPI.Exception:
                    if flag[0] >= seq:
                        return          # it came meanwhile; what happened is met later
                    raise

    def _check_alive(self, waited_for: int, only_waited_for: bool = False) -> None:
        error_class = self._interrupted()
        if error_class is not None:
            raise MPI.Exception(error_class)
        peers = [waited_for] if only_waited_for else range(self.node_size)
        for q in peers:
            if self._ctl[q][3] >= self._call > 0:
                raise MPI.Exception(ERR_REVOKED)        # a node peer left this call
        # A node peer that left a call revokes the node (the engine does,
        # and so must any caller): waits on flags end here, as MPI calls on
        # the node communicator do.
        self._check_revoked()
        for q in peers:
            if q != self.node_rank and not process_alive(self.pids[q]):
                raise MPI.Exception(ERR_PROC_FAILED)


class _Area:
    """One rank's mapping of a node's result area (Note [kept results]): a
    hold line per node rank, then the data from a page boundary."""

    __slots__ = ("index", "fd", "map", "header", "holds", "data", "capacity")

    def __init__(self, index: int, fd: int, mapped: mmap.mmap, header: int,
                 node_size: int) -> None:
        self.index, self.fd, self.map, self.header = index, fd, mapped, header
        whole = np.frombuffer(mapped, dtype=np.uint8)
        self.holds = [whole[q * _LINE:q * _LINE + 8].view(np.int64) for q in range(node_size)]
        self.data = whole[header:]
        self.capacity = self.data.nbytes


class Unfinished:
    """What a fused call that a failure interrupted left on a survivor
    (Note [fused in place]): the node's area, which holds the result of
    every part reduced, and the node ranks' ``out`` flags, which say which
    parts those are once no rank runs the call any more."""

    __slots__ = ("first", "per", "count", "area", "out")

    def __init__(self, first: int, per: int, count: int, area: "_Area",
                 out: List[np.ndarray]) -> None:
        self.first, self.per, self.count = first, per, count
        self.area, self.out = area, out

    def chunks_done(self) -> List[int]:
        """How many chunks each node rank finished its part of."""
        chunks = -(-self.count // self.per)
        return [max(0, min(chunks, int(flag[0]) - self.first)) for flag in self.out]

    def values(self, dtype: np.dtype) -> np.ndarray:
        """The area as an array of ``count`` elements (what has been reduced
        holds the result; the rest anything)."""
        return self.area.data[:self.count * dtype.itemsize].view(dtype)


def finished_parts(count: int, per: int, done: Sequence[int]) -> np.ndarray:
    """The elements of a fused call of ``count`` elements (chunks of ``per``)
    whose result is known: node rank q's part of each of its first
    ``done[q]`` chunks (Note [fused in place])."""
    size = len(done)
    mask = np.zeros(count, dtype=bool)
    for k, start in enumerate(range(0, count, per)):
        m = min(count, start + per) - start
        for q in range(size):
            if k < done[q]:
                mask[start + m * q // size:start + m * (q + 1) // size] = True
    return mask


def _fold_in_place(ufunc: Any, parts: List[np.ndarray], out: np.ndarray,
                   acc: np.ndarray) -> None:
    """:func:`_fold` into ``out``, which is one of ``parts`` (this rank's
    input): partial sums go to ``acc`` and only the last operation writes
    ``out``, so the input is read before it is overwritten. The same
    operations in the same order as :func:`_fold`: the same bits."""
    if len(parts) == 2:
        ufunc(parts[0], parts[1], out=out)
        return
    ufunc(parts[0], parts[1], out=acc)
    for q in range(2, len(parts) - 1):
        ufunc(acc, parts[q], out=acc)
    ufunc(acc, parts[-1], out=out)


def _offer(slot: np.ndarray, flat: np.ndarray, start: int, stop: int, lo: int, hi: int) -> None:
    """Copy the parts of the chunk ``flat[start:stop]`` that other ranks own
    (all but ``[lo, hi)``) into this rank's ``slot`` (the general variant)."""
    if lo > 0:
        np.copyto(slot[:lo], flat[start:start + lo])
    if hi < stop - start:
        np.copyto(slot[hi:], flat[start + hi:stop])


def _fold(ufunc: Any, parts: List[np.ndarray], out: np.ndarray) -> None:
    """``out`` = the parts reduced in rank order: the same bits on every rank
    (even for MAX of +0.0 and -0.0, which is not symmetric in NumPy)."""
    ufunc(parts[0], parts[1], out=out)
    for q in range(2, len(parts)):
        ufunc(out, parts[q], out=out)


