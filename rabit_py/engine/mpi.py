"""MpiEngine: the public API on plain mpi4py collectives.

Adds to MPI what a user needs to not lose a day: the signature check (Note
[signature check] in ``_signature.py``), timeouts (Note [timeouts] in
``_watchdog.py``), input checks before any communication, in-memory
checkpoints, and MPI errors turned into rabit_py exceptions. It does not
recover from a dead peer: that raises ``RecoveryError`` (the robust engine
overrides :meth:`MpiEngine._peer_failed`).
"""

from __future__ import annotations

import atexit
import logging
import pickle
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._mpistart import MPI

from mpi4py.util.dtlib import from_numpy_dtype

from .._checkpoint import serialize
from .._store import DurableStore
from ..config import Config
from ..errors import (CheckpointError, CollectiveMismatchError, CollectiveTimeoutError,
                      PeerFailure, RabitError, RecoveryError)
from ..ops import OpLike, dtype_code
from ._broadcast import (ARRAY, DEVICE, ERROR, HEADER_LEN, array_header, broadcast_array,
                         broadcast_device_array, root_header)
from ._reduce import HostReduce
from ._versions import Checkpoints
from ._signature import (N_FIELDS, OBJECT, Call, Kind, agrees, call_signature, call_values,
                         describe_mismatch, fill_vector, mismatched_fields)
from ._validate import check_allgather, check_allreduce, check_array_broadcast, check_root
from ._watchdog import (FATAL_NOTICE_TAG, TIMEOUT_NOTICE_TAG, Position, Watchdog, announce,
                        deadline, exchange_positions, find_notice, timeout_message)
from .._status import RESTART, Reporter
from ._startup import check_same_settings, duplicates, ulfm_enabled
from ._tags import PEER_PROBE_TAG
from ._lifecycle import abort_init, abort_job, end_job_on_uncaught, install_excepthook
from .base import DEVICE_TRANSPORT, CheckpointResult, Engine, PrepareFn

__all__ = ["MpiEngine"]

log = logging.getLogger("rabit_py")


_ERR_PROC_FAILED = getattr(MPI, "ERR_PROC_FAILED", 75)
_ERR_REVOKED = getattr(MPI, "ERR_REVOKED", 77)




class MpiEngine(Engine):
    """The public API on mpi4py, with checks and timeouts but no recovery.

    Args:
        config: the job's settings.
        comm: the communicator to run on (default ``MPI.COMM_WORLD``). It is
            duplicated, so the caller's own traffic never mixes with ours.

    Raises:
        TypeError: ``comm`` is not an mpi4py intra-communicator.
    """

    def __init__(self, config: Config, comm: Optional[Any] = None,
                 check_settings: bool = True) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm) or base == MPI.COMM_NULL:
            raise TypeError(f"comm must be an mpi4py intra-communicator (e.g. MPI.COMM_WORLD "
                            f"or a Split of it), got {type(base).__name__}")
        self._config = config
        self._watchdog: Optional[Watchdog] = None
        self._reduce = HostReduce(config, ulfm_enabled(), lambda: self._watchdog is not None
                                  and self._watchdog.fired is not None)
        rank = base.Get_rank()
        # Dup is collective: a rank that never calls init() would hang it.
        with deadline(config.timeout if base.Get_size() > 1 else 0,
                      lambda _: abort_init(base, Reporter.for_rank(config.run_status_dir, rank),
                                            rank, config.timeout), "init"):
            self._adopt(base)
            hosts = (check_same_settings(self._comm, config)
                     if check_settings and self._size > 1 else None)
        self._reduce.set_hosts(hosts)
        self._ulfm = ulfm_enabled()
        self._check = config.check and self._size > 1
        self._version = 0
        self._seqno = 0
        self._checkpoints = Checkpoints(
            DurableStore(config.checkpoint_dir, self._rank, self._size, config.keep_checkpoints)
            if config.checkpoint_dir else None)
        self._broken: Optional[str] = None
        self._finalized = False
        self._token: tuple = (0, 0, 0)  # (kind, version, seqno) of the current call
        self._sigvec = np.empty(2 * N_FIELDS, dtype=np.int64)
        self._header = np.zeros(HEADER_LEN, dtype=np.int64)
        self._header_sent: Optional[list] = None   # what _header holds, if we sent it
        self._broadcast_payload: Optional[Any] = None
        self._broadcast_device = False      # whether the last broadcast was a device array
        self._attachments: Dict[str, Any] = {}
        self._membership = 0
        self._repairing = False             # for the heartbeat: in a repair
        self._reporter = Reporter.for_rank(config.run_status_dir, self._rank)
        reports = self._reporter.folder is not None
        self._watchdog = (Watchdog(config.timeout, self._on_timeout,
                                   heartbeat=self._beat if reports else None)
                          if (config.timeout > 0 or reports) and self._size > 1 else None)
        self._saved_excepthook = None
        if self._size > 1:
            self._saved_excepthook = install_excepthook(self._end_job_on_uncaught)
        # At exit (after the program's own code, before MPI_Finalize): a rank
        # that leaves without finalize() (sys.exit, a return, the end of the
        # script) is finalized on its behalf, which tells its peers; then
        # rabit-run is told how this engine ended.
        self._clean_exit = False
        self._reporter.started()
        atexit.register(self._at_exit)
        if self._watchdog is not None and not self._ulfm:
            log.debug("rank %d: no MPI fault tolerance: a timeout aborts the job "
                      "(launch with rabit-run to get CollectiveTimeoutError instead)", self._rank)

    def _adopt(self, base: Any) -> None:
        """Run on duplicates of ``base`` (a collective call on it)."""
        # Control traffic (who is late, after a timeout) must still flow when
        # the data communicator has been revoked.
        self._use(*duplicates(base))

    def _use(self, comm: Any, ctrl: Any) -> None:
        """Run on ``comm``, with ``ctrl`` for control traffic."""
        self._comm, self._ctrl = comm, ctrl
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        self._reduce.use(comm)

    # ------------------------------------------------------------------ info
    @property
    def config(self) -> Config:
        return self._config

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def processor_name(self) -> str:
        return MPI.Get_processor_name()

    def version_number(self) -> int:
        return self._version

    def tracker_print(self, msg: str) -> None:
        if self._rank == 0:
            print(msg, flush=True)

    # ------------------------------------------------------- device support
    # (Documented in the Engine interface.)
    @property
    def membership(self) -> int:
        return self._membership

    def check_peers(self) -> None:
        """Raise the engine's failure if MPI knows a peer is gone (for
        transports that would wait for it forever, such as NCCL)."""
        if self._size == 1 or not self._ulfm:
            return
        try:
            self._comm.Iprobe(MPI.ANY_SOURCE, PEER_PROBE_TAG)   # lets MPI make progress
            group = self._comm.Get_failed()
            failed = group.Get_size()
            group.Free()
        except MPI.Exception as exc:
            raise self._failure(exc) from exc
        if failed:
            raise self._failure(MPI.Exception(_ERR_PROC_FAILED))

    def device_allreduce(self, data: Any, op: OpLike, prepare_fun: Optional[PrepareFn],
                         reduce: Callable[[], None]) -> Any:
        """An allreduce of a device array run by ``reduce()`` on another
        transport (NCCL) as one of this engine's numbered calls: the
        signature check and the timeout watchdog apply as to its own calls;
        ``prepare_fun`` fills ``data`` first. Returns ``data``.

        Raises:
            CollectiveMismatchError: the ranks made different calls.
        """
        call = (op, data.dtype, tuple(data.shape), None)
        self._enter(Kind.ALLREDUCE, None, True, call if self._check else None)
        try:
            if prepare_fun is not None:
                prepare_fun(data)
            reduce()
        finally:
            self._leave()
        return data

    def device_transport(self) -> Any:
        """The transport that carries device arrays in :meth:`broadcast` and
        :meth:`device_allgather` (the NCCL backend, attached by
        ``rabit_py.gpu`` once chosen), or None: then they are staged through
        host memory."""
        transport = self._attachments.get(DEVICE_TRANSPORT)
        return transport if hasattr(transport, "carries") else None

    def device_allgather(self, data: Any) -> Any:
        """:meth:`allgather` of a device array on :meth:`device_transport`, as
        one of this engine's numbered calls (signature check, watchdog): the
        row counts travel over MPI, the rows on the transport. Returns a new
        device array.

        Raises:
            TypeError, ValueError: a dtype rabit_py does not carry, or a 0-d array.
            CollectiveMismatchError, CollectiveTimeoutError: as :meth:`allgather`.
        """
        transport = self.device_transport()
        assert transport is not None, "device_allgather needs a device transport"
        error: Optional[BaseException] = None
        if data.ndim == 0:
            error = ValueError("allgather concatenates along axis 0 and needs an array with "
                               "ndim >= 1; wrap a scalar as cupy.array([x])")
        elif dtype_code(data.dtype) == 0:
            error = TypeError(f"allgather does not support dtype {data.dtype}")
        self._enter(Kind.ALLGATHER, error, True,
                    (None, data.dtype, (-1,) + tuple(data.shape[1:]), None)
                    if self._check and error is None else None)
        try:
            if self._size == 1:
                return data.copy()
            counts = np.empty(self._size, dtype=np.int64)
            self._comm.Allgather(np.array([data.shape[0]], dtype=np.int64), counts)
            return transport.allgather(data, counts.tolist())
        except MPI.Exception as exc:
            raise self._failure(exc) from exc
        finally:
            self._leave()

    def side_allgather(self, obj: Any) -> List[Any]:
        """Every rank's ``obj``, outside the numbered calls (for setting up a
        device transport: it is not part of the program's call sequence)."""
        if self._size == 1:
            return [obj]
        try:
            return self._comm.allgather(obj)
        except MPI.Exception as exc:
            raise self._failure(exc) from exc

    def attach(self, name: str, resource: Any) -> Any:
        """Keep ``resource`` (e.g. a NCCL communicator) with this engine; its
        ``close()`` runs at finalize. Returns it."""
        self._attachments[name] = resource
        return resource

    def attachment(self, name: str, make: Optional[Callable[[], Any]] = None) -> Any:
        """What :meth:`attach` kept under ``name``; if nothing, ``make()``
        attached there (None without ``make``)."""
        resource = self._attachments.get(name)
        if resource is None and make is not None:
            resource = self.attach(name, make())
        return resource

    # ------------------------------------------------------------ collectives
    def allreduce(self, data: np.ndarray, op: OpLike,
                  prepare_fun: Optional[PrepareFn] = None) -> np.ndarray:
        return self._allreduce(data, op, prepare_fun, check_allreduce(data, op))

    def _allreduce(self, data: np.ndarray, op: OpLike, prepare_fun: Optional[PrepareFn],
                   error: Optional[BaseException], out: Optional[np.ndarray] = None
                   ) -> np.ndarray:
        """The framed allreduce of ``data`` (``error``: the input check's
        refusal). With ``out`` (C-contiguous, ``data``'s shape and dtype) the
        result goes there and ``data`` keeps what it holds after
        ``prepare_fun``, so a call that fails half-way can run again; every
        rank must pass ``out`` or none (MPI_IN_PLACE is all or nothing).
        Returns where the result is."""
        self._enter(Kind.ALLREDUCE, error, True,
                    (op, data.dtype, data.shape, None) if self._check and error is None else None)
        try:
            if prepare_fun is not None:
                prepare_fun(data)
            self._reduce.run(data, op, out)
        except MPI.Exception as exc:
            raise self._failure(exc) from exc
        finally:
            self._leave()
        return data if out is None else out

    def broadcast(self, data: Any, root: int = 0) -> Any:
        error = check_root(root, self._size)
        # Plain NumPy arrays (the common case) skip the device lookup.
        transport = self.device_transport() if type(data) is not np.ndarray else None
        on_device = transport is not None and transport.carries(data)
        is_array = not on_device and isinstance(data, np.ndarray)
        if error is None and is_array:
            error = check_array_broadcast(data)
        if error is None and on_device and dtype_code(data.dtype) == 0:
            error = TypeError(f"broadcast does not support dtype {data.dtype}")
        is_root = error is None and self._rank == root

        call: Optional[Call] = None
        if self._check and error is None:
            call = ((None, data.dtype, tuple(data.shape), root) if is_array or on_device
                    else (None, OBJECT, None, root) if is_root else (None, None, None, root))
        self._enter(Kind.BROADCAST, error, True, call)
        pickle_error: Optional[BaseException] = None
        try:
            if on_device and (is_root or self._size == 1):
                values, payload = array_header(DEVICE, tuple(data.shape), data.dtype), None
            elif is_root or self._size == 1:
                values, payload, pickle_error = root_header(data)
            self._broadcast_payload = None
            self._broadcast_device = on_device
            if self._size == 1:
                # Same errors at world size 1 as at N: the object must pickle.
                if pickle_error is not None:
                    raise TypeError(f"rank 0: broadcast from root 0: the root's object cannot "
                                    f"be pickled: {pickle_error}") from pickle_error
                return data
            header = self._header
            if is_root:
                if values != self._header_sent:
                    header[:] = values
                    self._header_sent = values
            else:
                self._header_sent = None       # the Bcast below overwrites it
            self._comm.Bcast(header, root=root)
            h = header.tolist()
            if h[0] == ARRAY:
                return broadcast_array(self._comm, self._rank, data, h, root)
            if h[0] == DEVICE:
                self._broadcast_device = True   # the robust engine keeps that too
                return broadcast_device_array(self._comm, self._rank, self.device_transport(),
                                              data, h, root)
            if not is_root:
                payload = bytearray(h[1])
            self._comm.Bcast([payload, MPI.BYTE], root=root)
            self._broadcast_payload = payload   # the robust engine caches these bytes
        except MPI.Exception as exc:
            raise self._failure(exc) from exc
        finally:
            self._leave()
        if h[0] == ERROR:
            raise TypeError(f"rank {self._rank}: broadcast from root {root}: the root's object "
                            f"cannot be pickled: {bytes(payload).decode(errors='replace')}"
                            ) from pickle_error
        if not is_root:
            self._check_revoked()       # before unpickling what may be half a message
        return data if is_root else pickle.loads(payload)

    def allgather(self, data: np.ndarray) -> np.ndarray:
        error = check_allgather(data)
        self._enter(Kind.ALLGATHER, error, True,
                    (None, data.dtype, (-1,) + data.shape[1:], None)
                    if self._check and error is None else None)
        try:
            if self._size == 1:
                return data.copy()
            data = np.ascontiguousarray(data)
            counts = np.empty(self._size, dtype=np.int64)
            self._comm.Allgather(np.array([data.shape[0]], dtype=np.int64), counts)
            row = int(np.prod(data.shape[1:], dtype=np.int64))
            out = np.empty((int(counts.sum()),) + data.shape[1:], dtype=data.dtype)
            displs = np.zeros(self._size, dtype=np.int64)
            np.cumsum(counts[:-1], out=displs[1:])
            mpitype = from_numpy_dtype(data.dtype)
            self._comm.Allgatherv([data, mpitype],
                                  [out, (counts * row, displs * row), mpitype])
            return out
        except MPI.Exception as exc:
            raise self._failure(exc) from exc
        finally:
            self._leave()

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
        self._sync(Kind.CHECKPOINT, error)
        self._checkpoints.commit(global_blob, local_blob)
        self._version += 1
        self._seqno = 0
        self._checkpoints.save(self._version, global_blob, local_blob)

    def lazy_checkpoint(self, global_model: Any) -> None:
        # On disk the global model must be bytes: the writing rank serializes it now.
        blob = (serialize(global_model, "global model")
                if self._checkpoints.store is not None and self._rank == 0 else None)
        self._sync(Kind.CHECKPOINT, None)
        self._checkpoints.commit(None, None, lazy=global_model)
        self._version += 1
        self._seqno = 0
        self._checkpoints.save(self._version, blob, None)

    def load_checkpoint(self, with_local: bool = False) -> CheckpointResult:
        self._sync(Kind.LOAD_CHECKPOINT, None)
        self._seqno = 0    # calls are numbered from here, as after a checkpoint
        self._load_durable()
        return self._checkpoints.result(self._version, with_local)

    def _load_durable(self) -> None:
        """Adopt the newest version on disk on a fresh start (collective)."""
        self._version = self._checkpoints.load_durable(self._comm, self._rank, self._version)

    def finalize(self) -> None:
        if self._finalized:
            return
        store_error: Optional[CheckpointError] = None
        if self._checkpoints.store is not None:
            try:
                self._checkpoints.store.close()         # the last version reaches the disk
            except CheckpointError as exc:
                store_error = exc           # raised after the others are released
        for resource in self._attachments.values():
            try:
                resource.close()
            except Exception as exc:  # noqa: BLE001 - finalize goes on
                log.warning("rank %d: closing %r at finalize failed: %s", self._rank,
                            resource, exc)
        self._attachments.clear()
        try:
            if self._broken is None:
                self._finalize_sync()
                self._clean_exit = store_error is None
                self._reporter.job_done(self._size)
                if self._checkpoints.store is not None and store_error is None:
                    self._final_prune()
        finally:
            self._finalized = True
            if self._watchdog is not None:
                self._watchdog.stop()
            self._reporter.beat(self._version, self._seqno, Kind.FINALIZE, "done")
            if self._saved_excepthook is not None:
                sys.excepthook = self._saved_excepthook
            if self._broken is None:
                self._comm.Free()
                self._ctrl.Free()
        if store_error is not None:
            raise store_error

    def _final_prune(self) -> None:
        """Every rank has written its last version: the leader can now drop
        the versions that the last ones make obsolete (while ranks were still
        writing, a version with local models was not complete yet)."""
        try:
            self._comm.Barrier()
        except MPI.Exception:
            return                          # a peer is gone: leave the folder as it is
        if self._rank == 0:
            self._checkpoints.store.prune()

    def _at_exit(self) -> None:
        if not self._finalized and self._broken is None:
            # Not an error: leaving at the end of the script is the usual way.
            log.info("rank %d: the program is exiting without finalize(); finalizing now",
                     self._rank)
            try:
                self.finalize()
            except Exception as exc:  # noqa: BLE001 - nothing can be raised at exit
                sys.stderr.write(f"rabit_py: rank {self._rank}: the program is exiting "
                                 f"without finalize(); finalizing on its behalf failed: "
                                 f"{exc}\n")
        try:
            self._beat()    # the last counters, for rabit-run's summary
        except Exception:  # noqa: BLE001 - a status report never breaks the exit
            pass
        self._reporter.exited(self._clean_exit, self._broken or "")

    def _beat(self) -> None:
        """Watchdog thread: tell rabit-run where this rank is (Note [status folder])."""
        kind, version, seqno = self._token
        spawning = self._spawning() if self._repairing else []
        state = ("done" if self._finalized else "spawn" if spawning
                 else "repair" if self._repairing
                 else "call" if self._watchdog is not None and self._watchdog.in_call
                 else "user")
        self._reporter.beat(version, seqno, kind, state, *self._recovery_counts(),
                            spawning=spawning)

    def _recovery_counts(self) -> Tuple[int, int]:
        """(in-job recoveries, processes replaced) so far: none without recovery."""
        return 0, 0

    def _spawning(self) -> List[int]:
        """The ranks a repair is spawning processes for (none without recovery)."""
        return []

    def _finalize_sync(self) -> None:
        self._sync(Kind.FINALIZE, None)

    # ---------------------------------------------------------- call framing
    def _enter(self, kind: int, error: Optional[BaseException], numbered: bool,
               call: Optional[Call]) -> None:
        """Start a collective: number it, arm the watchdog, run the signature
        check. Raises the input's refusal or a mismatch on every rank."""
        if self._broken is not None or self._finalized:
            raise RabitError(self._broken or f"rank {self._rank}: the engine was finalized; "
                                             f"call init() again")
        if error is not None:
            error.args = (f"rank {self._rank}: {error.args[0]}",) + error.args[1:]
        # Calls are numbered from 0 after each checkpoint; a checkpoint (or
        # finalize) carries the number of calls made before it.
        self._token = (kind, self._version, self._seqno)
        if numbered:
            self._seqno += 1
        if error is not None and not self._check:
            raise error
        if self._watchdog is not None:
            self._watchdog.enter(self._token)
        if not self._check:
            return
        try:
            self._agree(kind, call, error)
        except MPI.Exception as exc:
            self._leave()
            raise self._failure(exc) from exc
        except BaseException:
            self._leave()
            raise

    def _leave(self) -> None:
        if self._watchdog is not None:
            self._watchdog.leave()

    def _sync(self, kind: int, error: Optional[BaseException]) -> None:
        """A call with no data of its own (checkpoint, finalize): only the check."""
        self._enter(kind, error, False, None)
        self._leave()

    def _agree(self, kind: int, call: Optional[Call], error: Optional[BaseException]) -> None:
        """See Note [signature check]."""
        seq = self._token[2]
        vec = fill_vector(self._sigvec, call_values(self._version, seq, kind, call, error))
        self._comm.Allreduce(MPI.IN_PLACE, vec, op=MPI.MAX)
        if not agrees(vec):
            fields = mismatched_fields(vec)
            mine = call_signature(self._version, seq, kind, call, error)
            # Note [mismatch exchange]: on the control communicator. A rank
            # that raised first may revoke the data communicator (its uncaught
            # exception ends the job) while slower ranks are still here; under
            # ULFM their collective then returned "success" with half-filled
            # buffers (seen: UnpicklingError, 2 runs in 21 on a loaded machine).
            everyone = self._ctrl.allgather(mine.describe())
            message = describe_mismatch(self._rank, mine, fields, everyone)
            if any(d["kind"] == "finalize" for d in everyone):
                # A rank that finalized is gone: nothing more can be agreed with it.
                self._broken = message
            if error is not None:
                raise error
            raise CollectiveMismatchError(message)
        if error is not None:
            raise error

    # --------------------------------------------------------- failures
    def _failure(self, exc: "MPI.Exception") -> BaseException:
        """Turn an MPI error raised inside a collective into our exception."""
        error_class = exc.Get_error_class()
        fired = self._watchdog is not None and self._watchdog.fired is not None
        if fired or error_class == _ERR_REVOKED:
            token = (self._watchdog.fired if fired else None) or self._token
            positions = exchange_positions(self._ctrl, self._rank, self._size,
                                           (token[1], token[2], token[0], int(fired)),
                                           self._grace())
            if fired or any(p[3] for p in positions.values()):
                self._broken = self._timeout_message(token, positions)
                return CollectiveTimeoutError(self._broken)
        if error_class in (_ERR_PROC_FAILED, _ERR_REVOKED):
            return self._peer_failed(PeerFailure(
                f"rank {self._rank}: a peer process failed during "
                f"{Kind.NAMES.get(self._token[0], '?')} #{self._token[2]} "
                f"(version {self._version}): {exc.Get_error_string()}", error_class))
        self._broken = (f"rank {self._rank}: MPI error in collective #{self._token[2]} "
                        f"(version {self._version}): {exc.Get_error_string()}")
        return RabitError(self._broken)

    def _check_revoked(self) -> None:
        """Note [revoked success]: under ULFM a collective that a peer's revoke
        interrupts can return success on the ranks still inside it, with part
        of the data (seen: an allgather of pickles in the recovery protocol
        gave UnpicklingError: invalid load key '\\x00' while the other ranks
        raised RecoveryError and revoked). A call's result is trusted only if
        the communicator was not revoked when it returned; otherwise it
        counts as interrupted, as if it had raised (0.1 us, local)."""
        if self._ulfm and self._comm.Is_revoked():
            raise self._failure(MPI.Exception(_ERR_REVOKED))

    def _peer_failed(self, failure: PeerFailure) -> BaseException:
        """What a dead peer means for this engine: no recovery, the job must end."""
        self._broken = (f"{failure} -- the 'mpi' engine cannot recover from a failed rank. "
                        f"Run under rabit-run with engine='robust' (RABIT_ENGINE=robust) for "
                        f"in-job recovery, or restart the job from a durable checkpoint.")
        # The job cannot go on, whatever the program does next: tell rabit-run
        # now. A program that catches the error, or meets it at finalize
        # (where the excepthook is gone), would otherwise leave the job to
        # ranks that may never return (seen: survivors hung inside XGBoost
        # while this rank waited for them in MPI_Finalize, for good).
        self._reporter.fatal(RESTART, self._broken)
        return RecoveryError(self._broken)

    def _grace(self) -> float:
        return min(1.0, max(0.1, self._config.timeout / 2))

    def _on_timeout(self, token: tuple) -> None:
        """Watchdog thread: a call overstayed (see Note [timeouts])."""
        if self._ulfm:
            self._announce(TIMEOUT_NOTICE_TAG)
            return
        positions = exchange_positions(self._ctrl, self._rank, self._size,
                                       (token[1], token[2], token[0], 1), self._grace())
        sys.stderr.write(
            f"rabit_py: CollectiveTimeoutError: {self._timeout_message(token, positions)}\n"
            f"rabit_py: rank {self._rank}: aborting the job: without MPI fault tolerance a "
            f"blocked collective cannot be interrupted. Launch with rabit-run (or mpirun "
            f"--with-ft ulfm) to get a CollectiveTimeoutError exception instead.\n")
        sys.stderr.flush()
        self._reporter.fatal(RESTART, self._timeout_message(token, positions))
        abort_job(self._comm, self._reporter)

    def _announce(self, tag: int) -> None:
        if self._ulfm and self._size > 1:
            announce(self._ctrl, self._comm, self._rank, self._size, tag)

    def _notice(self, wait: float = 0.05) -> Optional[Tuple[int, int]]:
        """A peer's notice that it ends the job: (tag, its rank), or None."""
        return find_notice(self._ctrl, wait)

    def _end_job_on_uncaught(self, exc_type: Any, exc: BaseException) -> None:
        """The excepthook's end of the job (Note [uncaught errors] in _lifecycle.py)."""
        end_job_on_uncaught(exc_type, exc, self._rank, self._reporter, self._notice,
                            lambda: self._announce(FATAL_NOTICE_TAG), self._comm)

    def _timeout_message(self, token: tuple, positions: Dict[int, Position]) -> str:
        return timeout_message(self._rank, self._size, self._config.timeout, token, positions)
