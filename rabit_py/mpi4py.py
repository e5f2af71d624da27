"""mpi4py's collectives on rabit_py: change the import, keep the program::

    from rabit_py.mpi4py import MPI           # was: from mpi4py import MPI

    comm = MPI.COMM_WORLD
    comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
    model = comm.bcast(model, root=0)
    best = comm.allreduce(loss, op=MPI.MIN)

Started with ``rabit-run -n N python prog.py`` (or ``mpirun``, or plain
``python``), ``MPI.COMM_WORLD``'s collectives run on rabit_py's engine: under
rabit-run a rank that dies is replaced in the job, and the replacement
catches up by replaying the results the survivors kept. A program that
never checkpoints is replayed from its start (while its results fit in
1/8 of ``cache_budget``; past it a failure restarts the job, and sums run
as on MPI itself); one that calls ``rabit_py.checkpoint`` is replayed from
its last one.

# Note [mpi4py drop-in]
What ``MPI.COMM_WORLD`` here runs, with mpi4py's argument rules and results:

- buffers: ``Allreduce`` (with ``MPI.IN_PLACE``), ``Bcast``, ``Allgather``,
  ``Allgatherv``, ``Reduce``, ``Barrier``; a buffer is a NumPy array or any
  contiguous buffer, or a spec ``[buf, MPI.DOUBLE]``, ``[buf, count,
  MPI.DOUBLE]``, ``[buf, (count, displ), MPI.DOUBLE]`` (``Allgatherv``:
  ``[buf, counts, displs, MPI.DOUBLE]`` or ``[buf, (counts, displs),
  MPI.DOUBLE]``). Ops ``SUM, PROD, MAX, MIN, BAND, BOR, BXOR`` and the
  logical ``LAND, LOR, LXOR`` (0/1 results, as MPI's). Floating-point sums
  are rabit_py's (bitwise the same on every rank and every run); they may
  differ in the last bits from Open MPI's own order.
- objects: ``allreduce``, ``reduce``, ``bcast``, ``allgather``, ``gather``,
  ``scatter``: pickled, and reduced in the order mpi4py reduces them (its
  binomial tree toward rank 0, ``op(x, y)`` with mpi4py's own op objects), so
  a sum of floats or a concatenation of lists is exactly mpi4py's. Every
  rank, the root included, gets a copy, as from mpi4py.
- ``Get_rank``, ``Get_size``, ``rank``, ``size``, ``Get_name``; ``MPI.Wtime``,
  the ops, datatypes and every other constant are mpi4py's own.

What cannot be made fault tolerant raises
:class:`rabit_py.UnsupportedCallError` naming the call and why, before any
communication: point-to-point messages (a message to a rank that is being
replaced cannot be replayed), nonblocking calls (a request outlives the call
that the engine records), new communicators (``Split``, ``Dup``...: they would
not be repaired with the job), one-sided windows and the collectives not
listed. Passing them through to mpi4py would work until the first failure and
then hang or corrupt the job, which is what this module exists to prevent.
Other communicators (``MPI.COMM_SELF``) are mpi4py's own, unprotected.

``MPI.Finalize()`` finalizes rabit_py; MPI itself ends when the process does.
"""

from __future__ import annotations

import functools
import pickle
import types
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import api
from .errors import UnsupportedCallError
from .ops import Op

__all__ = ["MPI", "Intracomm"]


def _mpi() -> Any:
    """mpi4py's MPI module, once rabit_py has started MPI (its engine sets
    the process up first: a private session folder for one process alone)."""
    _ensure_started()
    from mpi4py import MPI as real

    return real


def _ensure_started() -> None:
    """mpi4py starts MPI at import; the drop-in starts rabit_py at first use."""
    if not api.is_initialized():
        api.init()


# ----------------------------------------------------------------- buffers
def _dtype_of(datatype: Any) -> np.dtype:
    if isinstance(datatype, str):
        return np.dtype(datatype)
    from mpi4py.util.dtlib import to_numpy_dtype

    return np.dtype(to_numpy_dtype(datatype))


def _flat(buf: Any, dtype: Optional[np.dtype], what: str) -> np.ndarray:
    """The 1-D array over the memory of ``buf`` (no copy)."""
    if isinstance(buf, np.ndarray):
        if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
            raise BufferError(f"{what}: ndarray is not contiguous")
        flat = buf.reshape(-1, order="A")
    else:
        try:
            view = memoryview(buf)
        except TypeError:
            raise TypeError(f"{what}: {type(buf).__name__!r} object does not expose a "
                            f"buffer; pass a NumPy array or a [buf, MPI.DATATYPE] "
                            f"spec") from None
        if not view.contiguous:
            raise BufferError(f"{what}: the buffer is not contiguous")
        flat = np.asarray(view).reshape(-1)     # the buffer's format and writability
    if dtype is not None and flat.dtype != dtype:
        if flat.nbytes % dtype.itemsize:
            raise ValueError(f"{what}: {flat.nbytes} bytes are not a whole number of "
                             f"{dtype} items")
        flat = flat.view(np.uint8).view(dtype)
    return flat


_COUNTS = (int, np.integer, tuple, list)


def _message(spec: Any, what: str) -> np.ndarray:
    """mpi4py's message spec for one block: ``buf``, ``[buf, dtype]``,
    ``[buf, count, dtype]``, ``[buf, (count, displ), dtype]`` or ``[buf,
    count, displ, dtype]`` as the 1-D array it names."""
    if not isinstance(spec, (list, tuple)):
        return _flat(spec, None, what)
    buf, *rest = spec
    dtype = _dtype_of(rest[-1]) if rest and not isinstance(rest[-1], _COUNTS) else None
    counts = [r for r in rest if isinstance(r, _COUNTS)]
    flat = _flat(buf, dtype, what)
    count, displ = None, 0
    if len(counts) == 1 and isinstance(counts[0], (tuple, list)):
        count, displ = counts[0]
    elif len(counts) == 1:
        count = counts[0]
    elif len(counts) == 2:
        count, displ = counts
    if count is None:
        return flat[displ:]
    if displ + count > flat.size:
        raise ValueError(f"{what}: count {count} at displacement {displ} is past the "
                         f"buffer's {flat.size} items")
    return flat[displ:displ + count]


def _vector(spec: Any, size: int, what: str) -> Tuple[np.ndarray, List[int], List[int]]:
    """``Allgatherv``'s receive spec: the whole buffer, counts and displacements."""
    if not isinstance(spec, (list, tuple)) or len(spec) < 2:
        raise ValueError(f"{what}: give [buf, counts, displs, MPI.DATATYPE] or "
                         f"[buf, (counts, displs), MPI.DATATYPE]")
    buf, *rest = spec
    dtype = _dtype_of(rest[-1]) if not isinstance(rest[-1], _COUNTS) else None
    layout = [r for r in rest if isinstance(r, (tuple, list))]
    if len(layout) == 1 and len(layout[0]) == 2 and isinstance(layout[0][0], (tuple, list)):
        counts, displs = layout[0]
    elif len(layout) == 2:
        counts, displs = layout
    elif len(layout) == 1:
        counts, displs = layout[0], None
    else:
        raise ValueError(f"{what}: no counts given")
    counts = [int(c) for c in counts]
    if len(counts) != size:
        raise ValueError(f"{what}: {len(counts)} counts for {size} ranks")
    if displs is None:
        displs = [int(d) for d in np.concatenate([[0], np.cumsum(counts)[:-1]])]
    return _flat(buf, dtype, what), counts, [int(d) for d in displs]


# ----------------------------------------------------------------- ops
def _logical(combine: Callable[[Any, Any], Any]) -> Callable[[np.ndarray, np.ndarray], Any]:
    return lambda a, b: combine(a, b).astype(a.dtype)


_LOGICAL = {name: Op.create(_logical(fn)) for name, fn in
            (("LAND", np.logical_and), ("LOR", np.logical_or), ("LXOR", np.logical_xor))}
_BOOL_LOGICAL = {"LAND": Op.BITAND, "LOR": Op.BITOR, "LXOR": Op.BITXOR}
_BUILTIN = {"SUM": Op.SUM, "PROD": Op.PROD, "MAX": Op.MAX, "MIN": Op.MIN,
            "BAND": Op.BITAND, "BOR": Op.BITOR, "BXOR": Op.BITXOR}


@functools.lru_cache(maxsize=None)
def _op_names() -> Tuple[Tuple[Any, str], ...]:
    """mpi4py's op objects with their names (looked up once, not per call)."""
    real = _mpi()
    return tuple((getattr(real, name), name) for name in (*_BUILTIN, *_LOGICAL))


def _buffer_op(op: Any, dtype: np.dtype, call: str) -> Any:
    """rabit_py's op for an mpi4py op on buffers of ``dtype``."""
    for known, name in _op_names():
        if op is known:
            if name in _BUILTIN:
                return _BUILTIN[name]
            return _BOOL_LOGICAL[name] if dtype.kind == "b" else _LOGICAL[name]
    raise UnsupportedCallError(
        f"{call} with op={op!r}: rabit_py reduces buffers with MPI.SUM, PROD, MAX, MIN, "
        f"BAND, BOR, BXOR, LAND, LOR, LXOR; for another reduction use the object form "
        f"(comm.allreduce(obj, op)) or rabit_py.allreduce(array, rabit_py.Op.create(fn))")


def _tree_reduce(items: Sequence[Any], op: Callable[[Any, Any], Any]) -> Any:
    """``items`` (one per rank) combined as mpi4py combines them toward rank
    0: a binomial tree where rank r takes ``op(own, from r + mask)``."""
    values = list(items)
    mask = 1
    while mask < len(values):
        for rank in range(0, len(values), 2 * mask):
            if rank + mask < len(values):
                values[rank] = op(values[rank], values[rank + mask])
        mask <<= 1
    return values[0]


# ----------------------------------------------------------------- the communicator
_P2P = ("Send", "Recv", "Isend", "Irecv", "Sendrecv", "Sendrecv_replace", "Ssend", "Issend",
        "Bsend", "Ibsend", "Rsend", "Irsend", "Send_init", "Recv_init", "Probe", "Iprobe",
        "Mprobe", "Improbe", "send", "recv", "isend", "irecv", "sendrecv", "ssend", "issend",
        "bsend", "ibsend", "probe", "iprobe", "mprobe", "improbe", "Psend_init",
        "Precv_init")
_NEW_COMM = ("Split", "Split_type", "Dup", "Dup_with_info", "Idup", "Clone", "Create",
             "Create_group", "Create_cart", "Create_graph", "Create_dist_graph",
             "Create_dist_graph_adjacent", "Create_intercomm", "Spawn", "Spawn_multiple",
             "Accept", "Connect", "Free", "Disconnect")


def _why(name: str) -> str:
    if name in _P2P:
        return ("point-to-point messages are not fault tolerant: a message to or from a rank "
                "that dies and is replaced cannot be replayed. Exchange data with "
                "collectives (allgather, bcast, Allreduce) instead")
    if name in _NEW_COMM:
        return ("a new communicator would not be repaired with the job when a rank is "
                "replaced. Run on MPI.COMM_WORLD, or pass your communicator to "
                "rabit_py.init(comm=...) and use rabit_py's own API")
    if name[:1] in "Ii" and name[1:2].islower() and not name.startswith("Is_"):
        return ("nonblocking calls are not fault tolerant: a request outlives the call that "
                "the engine records and replays. Use the blocking form")
    return ("rabit_py runs Allreduce, Bcast, Allgather, Allgatherv, Reduce, Barrier and "
            "the object forms allreduce, reduce, bcast, allgather, gather, scatter; this "
            "call is not built")


class Intracomm:
    """``MPI.COMM_WORLD`` on rabit_py's engine (Note [mpi4py drop-in])."""

    # --------------------------------------------------------- who
    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        """This process's rank."""
        _ensure_started()
        return api.get_rank()

    def Get_size(self) -> int:  # noqa: N802
        """The number of ranks."""
        _ensure_started()
        return api.get_world_size()

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.Get_rank()

    @property
    def size(self) -> int:
        """The number of ranks."""
        return self.Get_size()

    def Get_name(self) -> str:  # noqa: N802
        """``"MPI_COMM_WORLD"``."""
        return "MPI_COMM_WORLD"

    @property
    def name(self) -> str:
        """``"MPI_COMM_WORLD"``."""
        return self.Get_name()

    def Is_inter(self) -> bool:  # noqa: N802
        """False: an intra-communicator."""
        return False

    def Is_intra(self) -> bool:  # noqa: N802
        """True: an intra-communicator."""
        return True

    def Abort(self, errorcode: int = 0) -> None:  # noqa: N802
        """End the whole job (``rabit_py.abort``: rabit-run does not restart it)."""
        _ensure_started()
        api.abort(f"MPI.COMM_WORLD.Abort({errorcode}) was called")

    # --------------------------------------------------------- buffers
    def Barrier(self) -> None:  # noqa: N802
        """Wait until every rank has called it."""
        _ensure_started()
        api.allreduce(np.zeros(1, np.uint8), Op.BITOR)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:  # noqa: N802
        """``recvbuf`` = ``sendbuf`` reduced over the ranks with ``op``
        (default ``MPI.SUM``); ``sendbuf`` may be ``MPI.IN_PLACE``."""
        real = _mpi()
        op = real.SUM if op is None else op
        recv = _message(recvbuf, "Allreduce recvbuf")
        rabit_op = _buffer_op(op, recv.dtype, "Allreduce")
        if sendbuf is not real.IN_PLACE:
            send = _message(sendbuf, "Allreduce sendbuf")
            _same_layout(send, recv, "Allreduce")
            np.copyto(recv, send)
        api.allreduce(recv, rabit_op)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = None,  # noqa: N802
               root: int = 0) -> None:
        """As :meth:`Allreduce`, the result written on ``root`` only
        (``recvbuf`` is ignored elsewhere and may be None)."""
        real = _mpi()
        op = real.SUM if op is None else op
        rank = self.Get_rank()
        _check_root(root, self.Get_size(), "Reduce")
        if sendbuf is real.IN_PLACE:
            if rank != root:
                raise ValueError("Reduce: MPI.IN_PLACE is for the root's sendbuf only")
            data = _message(recvbuf, "Reduce recvbuf")
        else:
            data = _message(sendbuf, "Reduce sendbuf").copy()
        api.allreduce(data, _buffer_op(op, data.dtype, "Reduce"))
        if rank == root:
            recv = _message(recvbuf, "Reduce recvbuf")
            _same_layout(data, recv, "Reduce")
            np.copyto(recv, data)

    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        """The root's buffer into every rank's ``buf``."""
        _check_root(root, self.Get_size(), "Bcast")
        api.broadcast(_message(buf, "Bcast buf"), root)

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        """Every rank's block, in rank order, into ``recvbuf``;
        ``sendbuf`` may be ``MPI.IN_PLACE`` (the rank's block of ``recvbuf``)."""
        real = _mpi()
        size, rank = self.Get_size(), self.Get_rank()
        recv = _message(recvbuf, "Allgather recvbuf")
        if recv.size % size:
            raise ValueError(f"Allgather: recvbuf holds {recv.size} items, not a multiple "
                             f"of the {size} ranks")
        block = recv.size // size
        if sendbuf is real.IN_PLACE:
            send = recv[rank * block:(rank + 1) * block].copy()
        else:
            send = _message(sendbuf, "Allgather sendbuf")
            _same_layout(send, recv[:block], "Allgather")
        np.copyto(recv, api.allgather(send))

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        """Every rank's block (of its own count) at its displacement in ``recvbuf``."""
        real = _mpi()
        size, rank = self.Get_size(), self.Get_rank()
        recv, counts, displs = _vector(recvbuf, size, "Allgatherv recvbuf")
        if sendbuf is real.IN_PLACE:
            send = recv[displs[rank]:displs[rank] + counts[rank]].copy()
        else:
            send = _message(sendbuf, "Allgatherv sendbuf")
            if send.size != counts[rank]:
                raise ValueError(f"Allgatherv: rank {rank} sends {send.size} items but "
                                 f"recvbuf's counts say {counts[rank]}")
            if send.dtype != recv.dtype:
                raise TypeError(f"Allgatherv: sendbuf is {send.dtype}, recvbuf {recv.dtype}")
        gathered = api.allgather(send)
        if gathered.size != sum(counts):
            raise ValueError(f"Allgatherv: the ranks sent {gathered.size} items, the counts "
                             f"add up to {sum(counts)}")
        start = 0
        for count, displ in zip(counts, displs):
            recv[displ:displ + count] = gathered[start:start + count]
            start += count

    # --------------------------------------------------------- objects
    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        """The root's object, a copy on every rank (the root's too)."""
        _check_root(root, self.Get_size(), "bcast")
        mine = _dumps(obj) if self.Get_rank() == root else None
        return pickle.loads(api.broadcast(mine, root))

    def allgather(self, sendobj: Any) -> List[Any]:
        """Every rank's object, in rank order (copies)."""
        _ensure_started()
        blob = np.frombuffer(_dumps(sendobj), np.uint8)
        lengths = api.allgather(np.array([blob.size], np.int64))
        data = api.allgather(blob)
        ends = np.cumsum(lengths)
        return [pickle.loads(data[end - n:end].tobytes()) for n, end in zip(lengths, ends)]

    def gather(self, sendobj: Any, root: int = 0) -> Optional[List[Any]]:
        """Every rank's object on ``root`` (a list in rank order); None elsewhere."""
        _check_root(root, self.Get_size(), "gather")
        items = self.allgather(sendobj)
        return items if self.Get_rank() == root else None

    def scatter(self, sendobj: Optional[Sequence[Any]] = None, root: int = 0) -> Any:
        """Item ``rank`` of the root's sequence on each rank."""
        size = self.Get_size()
        _check_root(root, size, "scatter")
        if self.Get_rank() == root and (sendobj is None or len(sendobj) != size):
            raise ValueError(f"scatter: the root must pass a sequence of {size} items, "
                             f"one per rank")
        return self.bcast(list(sendobj) if self.Get_rank() == root else None,
                          root)[self.Get_rank()]

    def allreduce(self, sendobj: Any, op: Any = None) -> Any:
        """Every rank's object combined with ``op`` (default ``MPI.SUM``) in
        mpi4py's order; each rank gets the same result."""
        op = _mpi().SUM if op is None else op
        return _tree_reduce(self.allgather(sendobj), op)

    def reduce(self, sendobj: Any, op: Any = None, root: int = 0) -> Any:
        """As :meth:`allreduce`, the result on ``root``; None elsewhere."""
        _check_root(root, self.Get_size(), "reduce")
        result = self.allreduce(sendobj, op)
        return result if self.Get_rank() == root else None

    def barrier(self) -> None:
        """As :meth:`Barrier`."""
        self.Barrier()

    # --------------------------------------------------------- the rest
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(_mpi().Intracomm, name):
            raise AttributeError(f"'Intracomm' object has no attribute {name!r}")
        raise UnsupportedCallError(f"MPI.COMM_WORLD.{name}: {_why(name)} "
                                   f"(Note [mpi4py drop-in] in rabit_py/mpi4py.py)")

    def __repr__(self) -> str:
        return "<rabit_py.mpi4py MPI.COMM_WORLD>"


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _check_root(root: int, size: int, call: str) -> None:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) \
            or not 0 <= root < size:
        raise ValueError(f"{call}: root={root!r} is not a rank of the {size} ranks")


def _same_layout(send: np.ndarray, recv: np.ndarray, call: str) -> None:
    if send.size != recv.size or send.dtype != recv.dtype:
        raise ValueError(f"{call}: sendbuf ({send.size} x {send.dtype}) and recvbuf "
                         f"({recv.size} x {recv.dtype}) differ")


class _Namespace(types.ModuleType):
    """``MPI``: mpi4py's module with ``COMM_WORLD`` on rabit_py's engine."""

    COMM_WORLD = Intracomm()

    def Finalize(self) -> None:  # noqa: N802
        """Finalize rabit_py (MPI itself ends with the process)."""
        api.finalize()
        self.__dict__["_finalized"] = True

    def Is_finalized(self) -> bool:  # noqa: N802
        """Whether :meth:`Finalize` was called."""
        return bool(self.__dict__.get("_finalized"))

    def Init(self) -> None:  # noqa: N802
        """Start rabit_py (mpi4py programs rarely call it: the first use does)."""
        _ensure_started()

    def Is_initialized(self) -> bool:  # noqa: N802
        """Whether rabit_py is running."""
        return api.is_initialized()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_mpi(), name)


MPI = _Namespace("rabit_py.mpi4py.MPI", "mpi4py's MPI with a fault-tolerant COMM_WORLD "
                                        "(Note [mpi4py drop-in] in rabit_py/mpi4py.py)")
