"""MpiEngine: the public API on plain mpi4py collectives.

Adds to MPI what a user needs to not lose a day: the signature check (Note
[signature check] in ``_signature.py``), timeouts (Note [timeouts] in
``_watchdog.py``), input checks before any communication, in-memory
checkpoints, and MPI errors turned into rabit_py exceptions (all of a call's
framing is in ``_frame.py``). It does not recover from a dead peer: that
raises ``RecoveryError`` (the robust engine builds its frame with
``recovers=True`` and repairs instead).

# Note [call stamps]
The messages of a call carry its *stamp* (version and call number, one
int64) where they carry a header anyway: a broadcast's header and an
allgather's row counts (one more int64 each, nothing measurable). A rank
that receives another call's stamp raises ``CollectiveMismatchError`` (the
engine is then broken): a program whose ranks make different calls with
the signature check off, or a crossed message, fails loudly instead of
mixing two calls' data. A broadcast's payload (an array or a pickled
object) and each rank's rows of an allgather also carry their CRC-32C, in
the header and with the row counts: data that differ from what their sender
sent are an interrupted call, which the robust engine recovers from like a
lost peer (a rank killed inside an allgather can leave a survivor's call
returning success with that rank's rows never filled in, and that result,
cached, would be served to every rank in the recovery). Checking costs one pass of
hardware CRC-32C over the data on each rank (0.04 ms per MiB here). An
allreduce has no header (its result has no room for a stamp): the signature
check (on by default) carries the stamp there, and a revoked communicator
makes its result untrusted (Note [revoked success] in ``_frame.py``). The
engine's own control messages are sealed (Note [sealed messages] in
``_control.py``).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import pickle
import struct
import sys
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import numpy as np

from ._mpistart import ERR_PROC_FAILED, MPI

from ._checksum import crc32c
from mpi4py.util.dtlib import from_numpy_dtype

from .._status import SETUP, Reporter
from ..config import Config
from ..errors import CheckpointError, CollectiveMismatchError
from ..ops import OpLike, dtype_code
from . import _control as control
from ._broadcast import OBJECT as PICKLED
from ._broadcast import (ARRAY, CHECK, DEVICE, ERROR, HEADER_LEN, MESSAGE_LEN, STAMP,
                         array_header, broadcast_array, broadcast_device_array, header_dtype,
                         inlined, receive_mismatch, received_shape, root_header)
from ._checkpoint import serialize
from ._frame import CallFrame
from ._lifecycle import abort_init, install_excepthook, mark_every_rank
from ._reduce import HostReduce
from ._signature import OBJECT, Call, Kind, allgather_call, allreduce_call
from ._startup import check_same_settings, duplicates, ulfm_enabled
from ._store import DurableStore
from ._tags import PEER_PROBE_TAG
from ._validate import check_allgather, check_allreduce, check_array_broadcast, check_root
from ._transports import Transports
from ._versions import Checkpoints
from ._watchdog import Watchdog, deadline
from .base import (CheckpointResult, DeviceTransports, Engine, EngineInfo, PrepareFn,
                   Resources, Transport)

__all__ = ["MpiEngine"]

log = logging.getLogger("rabit_py")

# Note [allgather records]: a record is 16 int64s, the rows inline after 3.
_HEADER = struct.Struct(f"={HEADER_LEN}q")     # a broadcast's header, as int64s
_GATHER_WORDS = 16
_GATHER_HEAD = 3 * 8
_GATHER_INLINE = _GATHER_WORDS * 8 - _GATHER_HEAD






class Carried(NamedTuple):
    """What a broadcast carried, for the robust engine's result cache."""

    #: a device array (the cache keeps its host copy)
    on_device: bool
    #: an object's pickled bytes (None for an array)
    pickled: Optional[bytes]


class MpiEngine(Engine, Transport):
    """The public API on mpi4py, with checks and timeouts but no recovery.

    Args:
        config: the job's settings.
        comm: the communicator to run on (default ``MPI.COMM_WORLD``). It is
            duplicated, so the caller's own traffic never mixes with ours.

    Raises:
        TypeError: ``comm`` is not an mpi4py intra-communicator.
    """

    def __init__(self, config: Config, comm: Optional[Any] = None,
                 check_settings: bool = True, recovers: bool = False,
                 device_transports: Optional[DeviceTransports] = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py intra-communicator (e.g. MPI.COMM_WORLD "
                            f"or a Split of it), got {type(base).__name__}")
        self._config = config
        #: the call frame every collective goes through, and the state it keeps
        self.frame = frame = CallFrame(config, ulfm_enabled(), recovers)
        self._reduce = HostReduce(config, frame.ulfm, lambda: frame.timed_out, keeps=recovers,
                                  use_check=frame.use_check_exchange)
        rank = base.Get_rank()
        # Dup is collective: a rank that never calls init() would hang it.
        with deadline(config.timeout if base.Get_size() > 1 else 0,
                      lambda _: abort_init(base, Reporter.for_rank(config.run_status_dir, rank),
                                            rank, config.timeout), "init"):
            self._adopt(base)
            hosts = (check_same_settings(frame.comm, config)
                     if check_settings and frame.size > 1 else None)
        self._reduce.set_hosts(hosts)
        frame.check = config.check and frame.size > 1
        self.checkpoints = Checkpoints(self._open_store(config, agree=check_settings),
                                       config.allowed_checkpoint_classes,
                                       config.trust_checkpoints)
        self._header = np.zeros(MESSAGE_LEN, dtype=np.int64)
        self._header_bytes = memoryview(self._header).cast("B")
        self._gather: Optional[Tuple[np.ndarray, np.ndarray, memoryview]] = None
        self._inline = self._header_bytes[HEADER_LEN * 8:]
        self._resources = Resources()
        self._transports = Transports(self, self, device_transports)
        frame.reporter = Reporter.for_rank(config.run_status_dir, frame.rank)
        reports = frame.reporter.folder is not None
        if (config.timeout > 0 or reports) and frame.size > 1:
            frame.watchdog = Watchdog(config.timeout, frame.on_timeout,
                                      heartbeat=self._beat if reports else None,
                                      on_overdue=frame.on_overdue if reports else None)
        self._saved_excepthook = self._error_printer = None
        if frame.size > 1:
            self._saved_excepthook, self._error_printer = install_excepthook(
                frame.end_job_on_uncaught, frame.rank, verbose=config.log_level == "DEBUG",
                wait_for_notice=frame.notice)
        # At exit (after the program's own code, before MPI_Finalize): a rank
        # that leaves without finalize() (sys.exit, a return, the end of the
        # script) is finalized on its behalf, which tells its peers; then
        # rabit-run is told how this engine ended.
        self._clean_exit = False
        frame.reporter.started()
        atexit.register(self._at_exit)
        if frame.watchdog is not None and not frame.ulfm:
            log.debug("rank %d: no MPI fault tolerance: a timeout aborts the job "
                      "(launch with rabit-run to get CollectiveTimeoutError instead)", frame.rank)

    def _open_store(self, config: Config, agree: bool) -> Optional[DurableStore]:
        """The durable store. At the job's start (``agree``) every rank opens
        it together (collective): a folder that a rank cannot use is a set-up
        error raised on every rank at ``init``, not at the first checkpoint
        an hour later. A replacement opens it alone (the survivors are in
        their recovery rounds) and raises its own error.

        Raises:
            CheckpointError: on every rank, naming the folder and the problem.
        """
        if not config.checkpoint_dir:
            return None
        frame = self.frame
        store: Optional[DurableStore] = None
        problem: Optional[str] = None
        try:
            store = DurableStore(config.checkpoint_dir, frame.rank, frame.size,
                                 config.keep_checkpoints, config.trust_checkpoints,
                                 config.strict_checkpoints)
        except CheckpointError as exc:
            problem = str(exc)
        if not agree and problem is not None:
            raise CheckpointError(problem)
        problems = ([problem] if frame.size == 1 or not agree else
                    control.allgather(frame.comm, problem, "startup.store"))
        if not any(problems):
            return store
        if store is not None:
            store.close()
        ranks: dict = {}
        for r, text in enumerate(problems):
            if text:
                ranks.setdefault(text.split(": ", 1)[-1], []).append(r)
        message = "; ".join(f"{text} (on rank{'s' if len(rs) > 1 else ''} "
                            f"{','.join(map(str, rs))})" for text, rs in ranks.items())
        Reporter.for_rank(config.run_status_dir, frame.rank).fatal(SETUP, message)
        raise mark_every_rank(CheckpointError(message))

    def _adopt(self, base: Any) -> None:
        """Run on duplicates of ``base`` (a collective call on it)."""
        # Control traffic (who is late, after a timeout) must still flow when
        # the data communicator has been revoked.
        self.use(*duplicates(base))

    def use(self, comm: Any, ctrl: Any) -> None:
        """Run on ``comm``, with ``ctrl`` for control traffic (at the start,
        and on the repaired communicators after a recovery)."""
        self.frame.use(comm, ctrl)
        self._reduce.use(comm)

    # ------------------------------------------------------------------ info
    @property
    def config(self) -> Config:
        return self._config

    @property
    def rank(self) -> int:
        return self.frame.rank

    @property
    def world_size(self) -> int:
        return self.frame.size

    def processor_name(self) -> str:
        return MPI.Get_processor_name()

    def version_number(self) -> int:
        return self.frame.version

    def tracker_print(self, msg: str) -> None:
        if self.frame.rank == 0:
            print(msg, flush=True)

    #: the engine's name in :class:`EngineInfo`
    kind = "mpi"

    def info(self) -> EngineInfo:
        frame = self.frame
        return EngineInfo(
            engine=self.kind, rank=frame.rank, world_size=frame.size, version=frame.version,
            trial=0, joined_as="start", restart=self._config.restart_count, recoveries=0,
            replaced=0, transports=tuple(self._transports.candidates),
            nccl=self._resources.nccl is not None, shared_memory=self._reduce.shared_memory,
            cache_bytes=0, cache_budget=0, cache_refused=0,
            checkpoint_classes=self._config.allowed_checkpoint_classes,
            trust_checkpoints=self._config.trust_checkpoints, servers=self._config.servers,
            server_port=self.server_port)

    # ------------------------------------------------------- device support
    # (Documented in the Engine interface.)
    @property
    def membership(self) -> int:
        return self.frame.membership

    def check_peers(self) -> None:
        """Raise the engine's failure if MPI knows a peer is gone (for
        transports that would wait for it forever, such as NCCL)."""
        frame = self.frame
        if frame.size == 1 or not frame.ulfm:
            return
        try:
            frame.comm.Iprobe(MPI.ANY_SOURCE, PEER_PROBE_TAG)   # lets MPI make progress
            group = frame.comm.Get_failed()
            failed = group.Get_size()
            group.Free()
        except MPI.Exception as exc:
            raise frame.failure(exc) from exc
        if failed:
            raise frame.failure(MPI.Exception(ERR_PROC_FAILED))

    def device_allreduce(self, data: Any, op: OpLike, prepare_fun: Optional[PrepareFn],
                         reduce: Callable[[], None]) -> Any:
        """An allreduce of a device array run by ``reduce()`` on another
        transport (NCCL) as one of this engine's numbered calls: the
        signature check and the timeout watchdog apply as to its own calls;
        ``prepare_fun`` fills ``data`` first. Returns ``data``.

        Raises:
            CollectiveMismatchError: the ranks made different calls.
        """
        self.frame.enter(Kind.ALLREDUCE, None, True,
                         allreduce_call(op, data) if self.frame.check else None)
        try:
            if prepare_fun is not None:
                self.frame.run_prepare(prepare_fun, data)
            reduce()
        finally:
            self.frame.leave()
        return data

    def device_transport(self) -> Any:
        """The transport that carries device arrays in :meth:`broadcast` and
        :meth:`device_allgather` (the NCCL backend, attached by
        ``rabit_py.gpu`` once chosen), or None: then they are staged through
        host memory."""
        return self._resources.nccl

    def device_allgather(self, data: Any) -> Any:
        """:meth:`allgather` of a device array on :meth:`device_transport`, as
        one of this engine's numbered calls (signature check, watchdog): the
        row counts travel over MPI, the rows on the transport. Returns a new
        device array.

        Raises:
            TypeError, ValueError: a dtype rabit_py does not carry, or a 0-d array.
            CollectiveMismatchError, CollectiveTimeoutError: as :meth:`allgather`.
        """
        frame = self.frame
        transport = self.device_transport()
        assert transport is not None, "device_allgather needs a device transport"
        error: Optional[BaseException] = None
        if data.ndim == 0:
            error = ValueError("allgather concatenates along axis 0 and needs an array with "
                               "ndim >= 1; wrap a scalar as cupy.array([x])")
        elif dtype_code(data.dtype) == 0:
            error = TypeError(f"allgather does not support dtype {data.dtype}")
        frame.enter(Kind.ALLGATHER, error, True,
                    allgather_call(data) if frame.check and error is None else None)
        try:
            if frame.size == 1:
                return data.copy()
            counts, _, _ = self._row_counts(data.shape[0], 0)   # device rows: no CRC
            return transport.allgather(data, counts)
        except MPI.Exception as exc:
            raise frame.failure(exc) from exc
        finally:
            frame.leave()

    def side_allgather(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, outside the numbered calls (for setting up a
        device transport: it is not part of the program's call sequence)."""
        if self.frame.size == 1:
            return [obj]
        try:
            return control.allgather(self.frame.comm, obj, "side_allgather")
        except MPI.Exception as exc:
            raise self.frame.failure(exc) from exc

    @property
    def resources(self) -> Resources:
        return self._resources

    # The engine is its own host transport (Note [transports]).
    name = "host"

    def enabled(self, data: Any, op: Any) -> bool:
        return True

    def transport(self, data: Any, op: Any) -> Transport:
        if type(data) is np.ndarray:
            return self             # every NumPy call's path: one type check
        return self._transports.for_call(data, op)

    # ------------------------------------------------------------ collectives
    def allreduce(self, data: np.ndarray, op: OpLike,
                  prepare_fun: Optional[PrepareFn] = None) -> np.ndarray:
        return self.framed_allreduce(data, op, prepare_fun, check_allreduce(data, op))

    def framed_allreduce(self, data: np.ndarray, op: OpLike, prepare_fun: Optional[PrepareFn],
                         error: Optional[BaseException], out: Optional[np.ndarray] = None,
                         call: Optional[Call] = None, keep: bool = False,
                         past_budget: bool = False, call_id: Any = None,
                         again: bool = False) -> np.ndarray:
        """The framed allreduce of ``data`` (``error``: the input check's
        refusal). With ``out`` (C-contiguous, ``data``'s shape and dtype) the
        result goes there and ``data`` keeps what it holds after
        ``prepare_fun``, so a call that fails half-way can run again. Ranks
        may differ in passing ``out`` (the robust engine reduces in place
        with a ``prepare_fun``): Open MPI copies a send buffer into the
        receive buffer before its algorithm runs, so MPI_IN_PLACE on some
        ranks only gives the same bits (tested).
        ``call``: the call's description, if the caller made it already
        (:func:`allreduce_call`). ``keep``: the result may stay where the
        shared-memory path put it, a read-only array to keep (Note [kept
        results] in ``_shm.py``), and ``data`` holds it too; ``call_id`` and
        ``again`` are then the robust engine's key of the call and whether it
        runs again after a recovery (``HostReduce.run_kept``).
        ``past_budget``: the robust engine keeps nothing of this call, on
        every rank (Note [uniform budget]): reduced as the plain engine does.
        Returns where the result is."""
        frame = self.frame
        if call is None and error is None and frame.check:
            call = (op, data.dtype, data.shape, None)       # allreduce_call, inlined
        frame.enter(Kind.ALLREDUCE, error, True, call)
        try:
            if prepare_fun is not None:
                self.frame.run_prepare(prepare_fun, data)
            reduce = self._reduce
            if keep and data.nbytes >= reduce.kept_from:
                kept = reduce.run_kept(data, op, call_id, again)
                if kept is not None:
                    return kept
            reduce.run(data, op, out, past_budget)
        except MPI.Exception as exc:
            raise frame.failure(exc) from exc
        finally:
            frame.leave()
        return data if out is None else out

    def broadcast(self, data: Any, root: int = 0) -> Any:
        return self.carried_broadcast(data, root)[0]

    def broadcast_input(self, data: Any, root: int
                        ) -> Tuple[Optional[BaseException], bool, bool, bool, Optional[Call]]:
        """A broadcast's input on this rank: its refusal, whether a device
        array, a NumPy array, whether this rank is the root, and the call's
        description (None if refused). For :meth:`carried_broadcast`, which
        the robust engine hands what it computed already."""
        error = check_root(root, self.frame.size)
        # Plain NumPy arrays (the common case) skip the device lookup.
        transport = self.device_transport() if type(data) is not np.ndarray else None
        on_device = transport is not None and transport.carries(data)
        is_array = not on_device and isinstance(data, np.ndarray)
        if error is None and is_array:
            error = check_array_broadcast(data)
        if error is None and on_device and dtype_code(data.dtype) == 0:
            error = TypeError(f"broadcast does not support dtype {data.dtype}")
        is_root = error is None and self.frame.rank == root
        call: Optional[Call] = None
        if error is None:
            call = ((None, data.dtype, tuple(data.shape), root) if is_array or on_device
                    else (None, OBJECT, None, root) if is_root else (None, None, None, root))
        return error, on_device, is_array, is_root, call

    def carried_broadcast(self, data: Any, root: int, described: Optional[tuple] = None
                          ) -> Tuple[Any, "Carried"]:
        """:meth:`broadcast`, returning also what it carried (for the robust
        engine's result cache): whether a device array, and an object's
        pickled bytes. ``described``: :meth:`broadcast_input`, if the caller
        has it."""
        frame = self.frame
        error, on_device, is_array, is_root, call = (
            described if described is not None else self.broadcast_input(data, root))
        frame.enter(Kind.BROADCAST, error, True, call if frame.check else None)
        pickle_error: Optional[BaseException] = None
        try:
            if on_device and (is_root or frame.size == 1):
                values, payload = array_header(DEVICE, tuple(data.shape), data.dtype), None
            elif is_root or frame.size == 1:
                values, payload, pickle_error = root_header(data)
            pickled: Optional[bytes] = None
            if frame.size == 1:
                # Same errors at world size 1 as at N: the object must pickle.
                if pickle_error is not None:
                    raise TypeError(f"rank 0: broadcast from root 0: the root's object cannot "
                                    f"be pickled: {pickle_error}") from pickle_error
                return data, Carried(on_device, None)
            header = self._header
            stamp = control.stamp(frame.token[1], frame.token[2])
            if is_root:
                values[STAMP] = stamp
                # struct, not a NumPy slice assignment: 0.5 us less (a hot path).
                _HEADER.pack_into(self._header_bytes, 0, *values)
                if inlined(values):
                    nbytes = values[1]
                    self._inline[:nbytes] = (payload if payload is not None
                                             else data.tobytes())
            frame.comm.Bcast(header, root=root)
            h = _HEADER.unpack_from(self._header_bytes)
            if h[STAMP] != stamp:
                self._out_of_step("broadcast", root, stamp, [h[STAMP]])
            inline = inlined(h)
            if h[0] == ARRAY:
                received = (broadcast_array(frame.comm, frame.rank, data, h, root) if not inline
                            else data if is_root else self._inline_array(data, h, root))
                if not is_root and crc32c(received) != h[CHECK]:
                    raise control.InterruptedExchange(
                        f"broadcast #{frame.token[2]} from root {root}: the array differs from "
                        f"the root's (CRC-32C)")
                return received, Carried(False, None)
            if h[0] == DEVICE:
                return (broadcast_device_array(frame.comm, frame.rank, self.device_transport(),
                                               data, h, root), Carried(True, None))
            if inline:
                if not is_root:
                    payload = bytes(self._inline[:h[1]])
            else:
                if not is_root:
                    payload = bytearray(h[1])
                frame.comm.Bcast([payload, MPI.BYTE], root=root)
            pickled = bytes(payload)
            if not is_root:
                frame.check_revoked()       # before unpickling what may be half a message
                if h[0] == PICKLED and crc32c(payload) != h[CHECK]:
                    raise control.InterruptedExchange(
                        f"broadcast #{frame.token[2]} from root {root}: the object's bytes "
                        f"differ from the root's (CRC-32C)")
        except MPI.Exception as exc:
            raise frame.failure(exc) from exc
        finally:
            frame.leave()
        if h[0] == ERROR:
            raise TypeError(f"rank {frame.rank}: broadcast from root {root}: the root's object "
                            f"cannot be pickled: {bytes(payload).decode(errors='replace')}"
                            ) from pickle_error
        return (data if is_root else pickle.loads(payload)), Carried(False, pickled)

    def _inline_array(self, data: Any, header: List[int], root: int) -> np.ndarray:
        """A receiver's array whose payload came in the header's message: in
        place in a matching array, else a new one (as ``broadcast_array``)."""
        shape = received_shape(self.frame.comm, header, root)
        dtype = header_dtype(header)
        values = np.frombuffer(self._inline, dtype=dtype,
                               count=header[1] // dtype.itemsize).reshape(shape)
        if isinstance(data, np.ndarray) and data.shape == shape and data.dtype == dtype:
            data[...] = values
            return data
        if isinstance(data, np.ndarray):
            raise receive_mismatch(self.frame.rank, root, dtype, shape, data)
        return values.copy()

    def allgather(self, data: np.ndarray) -> np.ndarray:
        frame = self.frame
        error = check_allgather(data)
        frame.enter(Kind.ALLGATHER, error, True,
                    allgather_call(data) if frame.check and error is None else None)
        try:
            if frame.size == 1:
                return data.copy()
            data = np.ascontiguousarray(data)
            counts, checks, records = self._row_counts(data.shape[0], crc32c(data), data)
            row = math.prod(data.shape[1:])
            shape = (sum(counts),) + data.shape[1:]
            displs = list(itertools.accumulate(counts, initial=0))[:-1]
            row_bytes = row * data.itemsize
            most = max(counts)
            if most * row_bytes <= _GATHER_INLINE:
                # Note [allgather records]: every rank's rows came with the counts.
                cells = records.view(np.uint8)
                if min(counts) == most:
                    # As many rows on every rank (the usual case): one copy.
                    out = cells[:, _GATHER_HEAD:_GATHER_HEAD + most * row_bytes].copy().view(
                        data.dtype).reshape(shape)
                else:
                    out = np.empty(shape, dtype=data.dtype)
                    flat = out.reshape(-1).view(np.uint8)
                    for rank, rows in enumerate(counts):
                        at, nbytes = displs[rank] * row_bytes, rows * row_bytes
                        flat[at:at + nbytes] = cells[rank, _GATHER_HEAD:_GATHER_HEAD + nbytes]
            else:
                out = np.empty(shape, dtype=data.dtype)
                mpitype = from_numpy_dtype(data.dtype)
                frame.comm.Allgatherv([data, mpitype],
                                      [out, ([c * row for c in counts], [d * row for d in displs]),
                                       mpitype])
            self._check_rows(out, counts, displs, checks)
            return out
        except MPI.Exception as exc:
            raise frame.failure(exc) from exc
        finally:
            frame.leave()

    # Note [allgather records]
    # An allgather starts with every rank's record: its row count, the call's
    # stamp and the CRC-32C of its rows (Note [call stamps]), and its rows
    # themselves where they fit in the rest of the record's 128 bytes. When
    # every rank's rows fit, every rank has them all after that one
    # MPI_Allgather, as every rank sees every count; else an Allgatherv
    # follows. A small allgather is one MPI call, not two.

    def _row_counts(self, rows: int, check: int, data: Optional[np.ndarray] = None
                    ) -> Tuple[List[int], List[int], np.ndarray]:
        """Every rank's row count and ``check`` (the CRC-32C of its rows) for
        an allgather, with the call's stamp checked (Note [call stamps]), and
        the records themselves, which hold ``data`` where it fits (Note
        [allgather records])."""
        frame = self.frame
        stamp = control.stamp(frame.token[1], frame.token[2])
        mine, records, words = self._gather_buffers()
        # Item by item through a memoryview: a slice assignment of a tuple
        # costs 0.5 us more on this hot path.
        words[0], words[1], words[2] = rows, stamp, check
        if data is not None and data.nbytes <= _GATHER_INLINE:
            mine.view(np.uint8)[_GATHER_HEAD:_GATHER_HEAD + data.nbytes] = \
                data.reshape(-1).view(np.uint8)
        frame.comm.Allgather(mine, records)
        table = records[:, :3].tolist()
        stamps = [t[1] for t in table]
        if any(s != stamp for s in stamps):
            self._out_of_step("allgather", None, stamp, stamps)
        return [t[0] for t in table], [t[2] for t in table], records

    def _gather_buffers(self) -> Tuple[np.ndarray, np.ndarray, memoryview]:
        """This rank's record, every rank's (Note [allgather records]), and
        this rank's record as a memoryview of int64."""
        size = self.frame.size
        if self._gather is None or self._gather[1].shape[0] != size:
            mine = np.zeros(_GATHER_WORDS, dtype=np.int64)
            self._gather = (mine, np.zeros((size, _GATHER_WORDS), dtype=np.int64),
                            memoryview(mine))
        return self._gather

    def _check_rows(self, out: np.ndarray, counts: List[int], displs: List[int],
                    checks: List[int]) -> None:
        """Note [call stamps]: every rank's rows as that rank sent them; an
        allgather that returned with another rank's rows missing or torn (a
        rank killed in it) is an interrupted call."""
        for rank, (at, rows, check) in enumerate(zip(displs, counts, checks)):
            if crc32c(out[at:at + rows]) != check:
                raise control.InterruptedExchange(
                    f"allgather #{self.frame.token[2]}: the rows of rank {rank} differ from "
                    f"what it sent (CRC-32C)")

    def _out_of_step(self, what: str, root: Optional[int], mine: int, stamps: List[int]) -> None:
        """Note [call stamps]: the data of another call arrived; the engine is
        broken. An allgather's stamps reach every rank, so every rank raises
        it; a broadcast's only the receivers (uncaught, it ends the job as any
        error does)."""
        frame = self.frame
        if frame.ulfm:
            frame.check_revoked()       # an interrupted call: the failure, not this
        version, seqno = control.stamp_parts(mine)
        others = sorted({s for s in stamps if s != mine})
        theirs = "; ".join(f"call #{q} of version {v}"
                           for v, q in map(control.stamp_parts, others))
        frame.broken = (
            f"rank {frame.rank}: {what} #{seqno} (version {version}) received the data of "
            f"{theirs}{'' if root is None else f' from root {root}'}: the ranks' calls are "
            f"out of step (a rank made a call that the others did not make; the signature "
            f"check, RABIT_CHECK=1, names the call) or a message crossed; the engine cannot "
            f"go on")
        error = CollectiveMismatchError(frame.broken)
        raise mark_every_rank(error) if root is None else error

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self, global_model: Any, local_model: Any = None) -> None:
        error: Optional[BaseException] = None
        global_blob = local_blob = None
        try:
            global_blob = serialize(global_model, "global model")
            if local_model is not None:
                local_blob = serialize(local_model, "local model")
        except CheckpointError as exc:
            error = exc
        self.frame.sync(Kind.CHECKPOINT, error)
        self.checkpoints.commit(global_blob, local_blob)
        self.frame.next_version()
        self.checkpoints.save(self.frame.version, global_blob, local_blob)

    def lazy_checkpoint(self, global_model: Any) -> None:
        # On disk the global model must be bytes: the writing rank serializes it now.
        blob = (serialize(global_model, "global model")
                if self.checkpoints.store is not None and self.frame.rank == 0 else None)
        self.frame.sync(Kind.CHECKPOINT, None)
        self.checkpoints.commit(None, None, lazy=global_model)
        self.frame.next_version()
        self.checkpoints.save(self.frame.version, blob, None)

    def load_checkpoint(self, with_local: bool = False) -> CheckpointResult:
        self.frame.sync(Kind.LOAD_CHECKPOINT, None)
        self.frame.number_from(0)   # calls are numbered from here, as after a checkpoint
        self.load_durable()
        return self.checkpoints.result(self.frame.version, with_local)

    def load_durable(self) -> None:
        """Adopt the newest version on disk on a fresh start (collective)."""
        frame = self.frame
        frame.adopt_version(self.checkpoints.load_durable(frame.comm, frame.rank, frame.version))

    def finalize(self) -> None:
        if self.frame.finalized:
            return
        store_error: Optional[CheckpointError] = None
        if self.checkpoints.store is not None:
            try:
                self.checkpoints.store.close()         # the last version reaches the disk
            except CheckpointError as exc:
                store_error = exc           # raised after the others are released
        self._resources.close(self.frame.rank)
        try:
            if self.frame.broken is None:
                self.finalize_sync()
                self._clean_exit = store_error is None
                self.frame.reporter.job_done(self.frame.size)
                if self.checkpoints.store is not None and store_error is None:
                    self._final_prune()
        finally:
            self.frame.finalized = True
            if self.frame.watchdog is not None:
                self.frame.watchdog.stop()
            self.frame.reporter.beat(self.frame.version, self.frame.seqno, Kind.FINALIZE, "done")
            if self._saved_excepthook is not None:
                # After an error ended the engine (a session's exit), the
                # error on its way up is still printed as the engine would.
                sys.excepthook = (self._error_printer if self.frame.broken is not None
                                  else self._saved_excepthook)
            if self.frame.broken is None:
                self.frame.comm.Free()
                self.frame.ctrl.Free()
        if store_error is not None:
            raise store_error

    def abort(self, reason: str) -> None:
        self.frame.abort(reason)

    def _final_prune(self) -> None:
        """Every rank has written its last version: the leader can now drop
        the versions that the last ones make obsolete (while ranks were still
        writing, a version with local models was not complete yet)."""
        try:
            self.frame.comm.Barrier()
        except MPI.Exception:
            return                          # a peer is gone: leave the folder as it is
        if self.frame.rank == 0:
            self.checkpoints.store.prune()

    def _at_exit(self) -> None:
        if not self.frame.finalized and self.frame.broken is None:
            # Not an error: leaving at the end of the script is the usual way.
            log.info("rank %d: the program is exiting without finalize(); finalizing now",
                     self.frame.rank)
            try:
                self.finalize()
            except Exception as exc:  # noqa: BLE001 - nothing can be raised at exit
                sys.stderr.write(f"rabit_py: rank {self.frame.rank}: the program is exiting "
                                 f"without finalize(); finalizing on its behalf failed: "
                                 f"{exc}\n")
        try:
            self._beat()    # the last counters, for rabit-run's summary
        except Exception:  # noqa: BLE001 - a status report never breaks the exit
            pass
        self.frame.reporter.exited(self._clean_exit, self.frame.broken or "")

    def _beat(self) -> None:
        """Watchdog thread: tell rabit-run where this rank is (Note [status folder])."""
        frame = self.frame
        kind, version, seqno = frame.token
        repairing, spawning, recoveries, replaced = self.recovery_status()
        state = ("done" if frame.finalized else "spawn" if spawning
                 else "repair" if repairing
                 else "prepare" if frame.preparing
                 else "call" if frame.watchdog is not None and frame.watchdog.in_call
                 else "user")
        frame.reporter.beat(version, seqno, kind, state, recoveries, replaced,
                            spawning=spawning)

    def recovery_status(self) -> Tuple[bool, List[int], int, int]:
        """For the heartbeat: (repairing now, the ranks that a repair spawning
        processes replaces, in-job recoveries so far, processes replaced so far);
        nothing without recovery."""
        return False, [], 0, 0

    def finalize_sync(self) -> None:
        self.frame.sync(Kind.FINALIZE, None)
