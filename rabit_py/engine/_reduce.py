"""How a host array is reduced once the engine's call frame is entered: MPI's
own operators, a custom reducer on MPI, or the node's shared memory (Note
[shm allreduce] in ``_shm.py``). Every rank takes the same path: the choice
depends only on what every rank shares (size, op, settings)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._mpistart import ERR_REVOKED, MPI

from ..config import Config
from ..ops import OPS, CustomOp, OpLike
from . import _control as control
from ._shm import SUPPORTED as SHM_SUPPORTED
from ._shm import NodeReducer, Unfinished, finished_parts, host_groups

__all__ = ["HostReduce", "DIRECT_TYPES"]

log = logging.getLogger("rabit_py")

_MPI_OPS = {code: getattr(MPI, info.mpi) for code, info in OPS.items()}
# MPI defines only logical operators on C_BOOL (SUM/PROD on bool are refused).
_BOOL_OPS = {code: getattr(MPI, info.mpi_bool) for code, info in OPS.items() if info.mpi_bool}


def _direct_table() -> Dict[Tuple[int, np.dtype], Tuple[Any, Any]]:
    """``(op, dtype) -> (MPI datatype, MPI op)`` for every valid pair whose
    dtype has a predefined MPI datatype (Note [small allreduce] in
    ``robust.py``): the datatype given explicitly spares mpi4py's look-up of
    it (0.4 us a call for two buffers). The datatypes are mpi4py's own
    inference table, so the calls are the ones it would make."""
    from ._validate import valid_pairs

    inferred = getattr(MPI, "_typedict", {})
    table = {}
    for op, dtype in valid_pairs():
        mpitype = inferred.get(dtype.char)
        if dtype == np.float16 or mpitype is None or not mpitype.is_predefined:
            continue            # float16: reduced as the general path decides
        table[(op, dtype)] = (mpitype, (_BOOL_OPS if dtype.kind == "b" else _MPI_OPS)[op])
    return table


#: Note [small allreduce] in ``robust.py``.
DIRECT_TYPES = _direct_table()
# MPI reduces a custom op on the whole array as one element, with no
# pipelining: through shared memory it was 1.8-3.7x faster from 256 KiB, and
# within noise at 64 KiB (bench_collectives.py).
_SHM_CUSTOM_MIN_BYTES = 256 << 10


class HostReduce:
    """The reduction step of an allreduce on one communicator.

    Args:
        config: the job's settings (``shm``, ``shm_min_bytes``,
            ``shm_keep_min_bytes``, ``node_size``).
        ulfm: whether MPI fault tolerance is on (revokes wake shared-memory waits).
        timed_out: whether the engine's watchdog fired (ends shared-memory waits).
        keeps: the robust engine's: arrays from ``shm_keep_min_bytes`` take
            the shared-memory path, whose result may be kept (:meth:`run_kept`).
        use_check: called with the exchange of the signature check that the
            node's memory offers (Note [check on the node] in ``_shm.py``)
            when the reducer is built, with None when it is dropped.
    """

    def __init__(self, config: Config, ulfm: bool, timed_out: Callable[[], bool],
                 keeps: bool = False,
                 use_check: Callable[[Optional[Callable[[np.ndarray], None]]], None]
                 = lambda exchange: None) -> None:
        self._config = config
        self._use_check = use_check
        self._ulfm = ulfm
        self._timed_out = timed_out
        self._comm: Any = None
        self._size = 1
        # Note [fixed groups] in _shm.py: the groups of the job's start.
        self.groups: Optional[List[int]] = None
        self._shm: Optional[NodeReducer] = None
        # The smallest array that may take shared memory (custom reducers go
        # there from less): one comparison on the hot path decides the rest.
        self._min_bytes = (min(config.shm_min_bytes, config.shm_keep_min_bytes) if keeps
                           else config.shm_min_bytes)
        self._shm_from = (max(1, min(self._min_bytes, _SHM_CUSTOM_MIN_BYTES))
                          if config.shm and SHM_SUPPORTED else float("inf"))
        #: The smallest array whose result :meth:`run_kept` may keep.
        self.kept_from = (max(1, self._min_bytes) if keeps and config.shm and SHM_SUPPORTED
                          else float("inf"))
        #: Arrays smaller than this go straight to MPI (no shared memory,
        #: nothing kept there): 0 while the communicator has one rank.
        self.direct_below: float = 0
        # Note [fused in place] in _shm.py: the last kept call, finished or not.
        self._last_kept: Optional[_LastKept] = None

    def use(self, comm: Any) -> None:
        """Reduce on ``comm`` from now on (a new or repaired communicator);
        the shared-memory reducer is built on it at the first call that wants it."""
        self._comm, self._size = comm, comm.Get_size()
        self.direct_below = min(self._shm_from, self.kept_from) if self._size > 1 else 0
        self._drop()

    def set_hosts(self, hosts: Optional[List[str]]) -> None:
        """The hosts of the job's start (None: unknown), for the groups."""
        self.groups = host_groups(hosts, self._config.node_size) if hosts else None

    @property
    def shared_memory(self) -> bool:
        """Whether allreduce uses shared memory between the ranks of a host
        (decided at the first allreduce that could)."""
        return self._shm is not None and self._shm.max_node_size > 1

    def run(self, data: np.ndarray, op: OpLike, out: Optional[np.ndarray],
            as_plain: bool = False) -> None:
        """Reduce ``data`` in place, or into ``out`` leaving ``data`` as it is.
        ``as_plain``: as the plain engine would, though this one keeps
        results (every rank passes the same: the robust engine past its
        cache budget). Raises ``MPI.Exception`` (the engine turns it into
        its error)."""
        if self._size == 1:
            if out is not None:
                np.copyto(out, data)
            return
        shm = data.nbytes >= self._shm_from and self._wants_shm(data, op, as_plain)
        if not shm and not isinstance(op, CustomOp):
            direct = DIRECT_TYPES.get((op, data.dtype)) if type(op) is int else None
            if direct is not None:          # the datatype given: 0.4 us less
                mpitype, mpiop = direct
                self._comm.Allreduce(MPI.IN_PLACE if out is None else [data, mpitype],
                                     [data if out is None else out, mpitype], op=mpiop)
                return
            table = _BOOL_OPS if data.dtype.kind == "b" else _MPI_OPS
            self._comm.Allreduce(MPI.IN_PLACE if out is None else data,
                                 data if out is None else out, op=table[op])
            return
        target = data
        if out is not None:
            np.copyto(out, data)        # the other paths reduce in place
            target = out
        if shm:
            self._allreduce_shm(target, op, as_plain)
        else:
            _allreduce_custom(target, op, self._comm)   # type: ignore[arg-type]

    def will_keep(self, data: np.ndarray, op: OpLike) -> bool:
        """Whether :meth:`run_kept` surely takes this call (the reducer is
        built and keeps results): then the caller needs no buffer of its own
        for the result. No collective; False may still end kept."""
        reducer = self._shm
        return (reducer is not None and reducer.keeps and data.nbytes >= self.kept_from
                and not isinstance(op, CustomOp))

    def run_kept(self, data: np.ndarray, op: OpLike, call_id: Any = None,
                 again: bool = False) -> Optional[np.ndarray]:
        """Reduce ``data`` in place and keep the result in an area of the
        node's shared memory; return it there (read-only, ``data``'s shape;
        Note [kept results] in ``_shm.py``); or None, having done nothing,
        where this call does not take that path (too small, a custom reducer,
        a node that cannot share areas): then :meth:`run` does it.

        ``call_id``: the robust engine's key of the call. ``again``: the call
        runs again after a recovery (every rank passes the same): what an
        interrupted run of it left is used first (Note [fused in place]).

        Raises ``MPI.Exception``; ``data`` may then hold part of the result,
        which a run ``again`` of the same ``call_id`` knows."""
        if (data.nbytes < self.kept_from or self._size == 1 or isinstance(op, CustomOp)
                or not self._wants_shm(data, op)):
            return None
        reducer = self._shm
        assert reducer is not None
        if again:
            # Whatever the rebuilt reducer can do (a replacement on another
            # host): what the interrupted run left must be finished.
            finished = self._finish_interrupted(reducer, data, op, call_id)
            if finished is not None:
                return finished
        if not reducer.keeps:
            return None
        return self._keep(reducer, data, op, call_id)

    def _keep(self, reducer: NodeReducer, data: np.ndarray, op: OpLike,
              call_id: Any) -> np.ndarray:
        flat = data.reshape(-1)
        ufunc = OPS[op].ufunc
        self._last_kept = None
        try:
            if reducer.fused:
                kept = reducer.reduce_fused(flat, ufunc)
            else:
                kept = reducer.reduce_to_area(flat, ufunc, _leaders_allreduce(data, op),
                                              in_place=True)
        except MPI.Exception:
            unfinished = reducer.unfinished(flat) if reducer.fused else None
            if unfinished is not None:
                self._last_kept = _LastKept(call_id, unfinished, None)
            self._lost(reducer)
            raise
        # The input is gone: should this call run again (a failure after it,
        # before the engine kept it), the result is given, not reduced again.
        self._last_kept = _LastKept(call_id, None, kept)
        return kept.reshape(data.shape)

    def settled(self) -> None:
        """The engine kept the result that :meth:`run_kept` returned: a run
        of the call again is served from the engine's cache, so the area is
        not held here any more."""
        self._last_kept = None

    def _finish_interrupted(self, reducer: NodeReducer, data: np.ndarray, op: OpLike,
                            call_id: Any) -> Optional[np.ndarray]:
        """Note [fused in place] in ``_shm.py``: a kept call run again after
        a recovery, collective. If a rank finished it, that rank's result is
        broadcast; if ranks reduced parts of it before the failure, those
        parts are broadcast from a survivor that maps the area, and the rest
        is reduced in rank order; either way ``data`` gets the bits of an
        uninterrupted run. Returns the result (a read-only copy), or None
        when nothing was left (the call runs as a new one)."""
        size, rank = self._size, self._comm.Get_rank()
        flat = data.reshape(-1)
        per = reducer.chunk // flat.itemsize
        last = self._last_kept
        # [-finished holder, -unfinished holder, chunks done by each rank]
        summary = np.full(size + 2, -1, dtype=np.int64)
        summary[:2] = -size
        if last is not None and last.call_id == call_id:
            if last.result is not None and last.result.size == flat.size:
                summary[0] = -rank
            elif (last.unfinished is not None and last.unfinished.count == flat.size
                  and last.unfinished.per == per and len(last.unfinished.out) == size):
                summary[1] = -rank
                summary[2:] = last.unfinished.chunks_done()
        self._comm.Allreduce(MPI.IN_PLACE, summary, op=MPI.MAX)
        finished_by, unfinished_by = -int(summary[0]), -int(summary[1])
        if finished_by < size:
            result = np.empty_like(flat)
            if rank == finished_by:
                np.copyto(result, last.result.reshape(-1))      # type: ignore[union-attr]
            self._comm.Bcast(result, root=finished_by)
        elif unfinished_by < size:
            known = finished_parts(flat.size, per, [int(d) for d in summary[2:]])
            rest = flat[~known]
            if rest.size:
                try:
                    reducer.allreduce(rest, OPS[op].ufunc, _leaders_allreduce(data, op))
                except MPI.Exception:
                    self._lost(reducer)
                    raise
                # More than two ranks copy from each other's buffers after the
                # last flag they wait for, and the next call's first chunk
                # writes them: every rank must be done first (a rare path).
                self._comm.Barrier()
            values = (last.unfinished.values(flat.dtype)[known]          # type: ignore[union-attr]
                      if rank == unfinished_by else np.empty(int(known.sum()), flat.dtype))
            self._comm.Bcast(values, root=unfinished_by)
            result = np.empty_like(flat)
            result[known] = values
            result[~known] = rest
        else:
            return None
        # Note [revoked success] in _frame.py: a broadcast that a peer's
        # revoke cut short may return success with part of the data, which
        # must not become the result given if the call runs again.
        if self._ulfm and self._comm.Is_revoked():
            raise MPI.Exception(ERR_REVOKED)
        np.copyto(flat, result)
        result.flags.writeable = False
        self._last_kept = _LastKept(call_id, None, result)
        log.info("rank %d: the interrupted allreduce finished from the %s result of rank %d",
                 rank, "whole" if finished_by < size else "partial",
                 min(finished_by, unfinished_by))
        return result.reshape(data.shape)

    def _reduce_to_area(self, reducer: NodeReducer, data: np.ndarray, op: OpLike,
                        in_place: bool = False) -> np.ndarray:
        try:
            return reducer.reduce_to_area(data.reshape(-1), OPS[op].ufunc,
                                          _leaders_allreduce(data, op), in_place)
        except MPI.Exception:
            self._lost(reducer)
            raise

    def _wants_shm(self, data: np.ndarray, op: OpLike, as_plain: bool = False) -> bool:
        """Whether this call takes the shared-memory path (collective the
        first time: the groups are agreed and the reducer is built)."""
        threshold = self._config.shm_min_bytes if as_plain else self._min_bytes
        if isinstance(op, CustomOp):
            threshold = min(threshold, _SHM_CUSTOM_MIN_BYTES)
        if not self._config.shm or not SHM_SUPPORTED or data.nbytes < max(1, threshold):
            return False
        if self._shm is None:
            self.groups = self._agreed_groups()
            self._shm = NodeReducer(self._comm, self.groups, interrupted=self._interrupted)
            if self._shm.checks:
                self._use_check(self._shm.exchange_check)
            if self._shm.max_node_size == 1:
                log.debug("rank %d: one rank per node: shared-memory allreduce off",
                          self._comm.Get_rank())
        if self._shm.max_node_size == 1:
            return False
        # A non-commutative reducer must see the ranks in order, which node
        # blocks need not be: MPI keeps it when the job spans nodes.
        return not (isinstance(op, CustomOp) and not op.commute and self._shm.nodes > 1)

    def _agreed_groups(self) -> List[int]:
        """Note [fixed groups] in ``_shm.py``: the groups of the job's start,
        which a replacement learns from the survivors (collective)."""
        known = np.full(self._size, -1, dtype=np.int64) if self.groups is None \
            else np.array(self.groups, dtype=np.int64)
        self._comm.Allreduce(MPI.IN_PLACE, known, op=MPI.MAX)
        if known[0] < 0:        # nobody knew (no start-up exchange): the hosts now
            names = control.allgather(self._comm, MPI.Get_processor_name(), "reduce.hosts")
            return host_groups(names, self._config.node_size)
        return [int(g) for g in known]

    def _allreduce_shm(self, data: np.ndarray, op: OpLike, as_plain: bool = False) -> None:
        """``data`` is C-contiguous: check_allreduce refuses anything else."""
        reducer = self._shm
        assert reducer is not None
        if (reducer.keeps and self.kept_from <= data.nbytes and not isinstance(op, CustomOp)
                and not as_plain):
            # A reducer that keeps results runs one protocol for every call
            # of a size, whichever rank keeps the result (the robust engine's
            # calls come through run_kept; this one's input stays whole until
            # the result is).
            self._reduce_to_area(reducer, data, op, in_place=True)
            return
        try:
            if isinstance(op, CustomOp):
                reducer.allreduce_custom(
                    data, op.fn, lambda leaders, flat: _allreduce_custom(data, op, leaders))
            else:
                reducer.allreduce(data.reshape(-1), OPS[op].ufunc, _leaders_allreduce(data, op))
        except MPI.Exception:
            self._lost(reducer)
            raise

    def _lost(self, reducer: NodeReducer) -> None:
        """After an MPI error in ``reducer``: peers on other nodes may wait
        in the leaders' or a node's collective, which only a revoke
        interrupts; the reducer is rebuilt on the repaired communicator."""
        if self._ulfm:
            reducer.revoke()
        self._drop()

    def _drop(self) -> None:
        """No reducer until the next call that wants one (built collectively)."""
        if self._shm is not None and self._shm.checks:
            self._use_check(None)
        self._shm = None

    def _interrupted(self) -> Optional[int]:
        """For the shared-memory waits: the MPI error class to leave with."""
        if self._timed_out():
            return ERR_REVOKED
        if self._ulfm and (self._comm.Is_revoked()
                           or (self._shm is not None and self._shm.is_revoked())):
            return ERR_REVOKED
        return None


class _LastKept:
    """The last kept call of this rank (Note [fused in place] in ``_shm.py``):
    its ``result`` if it finished, else what it left (``unfinished``)."""

    __slots__ = ("call_id", "unfinished", "result")

    def __init__(self, call_id: Any, unfinished: Optional[Unfinished],
                 result: Optional[np.ndarray]) -> None:
        self.call_id, self.unfinished, self.result = call_id, unfinished, result


def _leaders_allreduce(data: np.ndarray, op: OpLike) -> Callable[[Any, np.ndarray], None]:
    table = _BOOL_OPS if data.dtype.kind == "b" else _MPI_OPS
    return lambda leaders, flat: leaders.Allreduce(MPI.IN_PLACE, flat, op=table[op])


def _allreduce_custom(data: np.ndarray, op: CustomOp, comm: Any) -> None:
    """A custom reducer on MPI, in place, the whole array as one element."""
    dtype, shape, fn = data.dtype, data.shape, op.fn

    def combine(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        # MPI computes inout = in (op) inout, "in" coming from lower ranks.
        a = np.frombuffer(inbuf, dtype=dtype).reshape(shape)
        b = np.frombuffer(inoutbuf, dtype=dtype).reshape(shape)
        b[...] = fn(a, b)

    mpi_op = MPI.Op.Create(combine, commute=op.commute)
    # One element covering the whole array, so MPI never hands fn pieces.
    whole = MPI.BYTE.Create_contiguous(data.nbytes).Commit()
    try:
        comm.Allreduce(MPI.IN_PLACE, [data, 1, whole], op=mpi_op)
    finally:
        whole.Free()
        mpi_op.Free()
