"""RobustEngine: Rabit-style in-job recovery on ULFM.

# Note [robust protocol]
Every call has a key ``(epoch, seqno)``: the epoch is the version (or ``BOOT``
before the first ``load_checkpoint``/``checkpoint``), the seqno counts calls
since then from 0, and a checkpoint or finalize takes the seqno after the last
collective. Results are cached (Note [result cache] in ``_cache.py``).

A collective that fails with a dead peer (or a revoke) raises ``PeerFailure``
inside the MPI layer; the call's loop (:meth:`RobustEngine._call`) repairs the
communicator (Note [repair] in ``_repair.py``) and puts every rank, survivors
and replacements, in *recovery mode*. In recovery mode each call runs
*rounds* until it is answered; a round is a fixed sequence of collectives, so
ranks standing at different calls stay matched (Rabit's ``RecoverExec``):

1. summary: one allreduce of (committed version, smallest requested key);
2. if someone is in ``load_checkpoint`` (a replacement): a survivor broadcasts
   the global model, replica holders send each requester its local model,
   every rank re-replicates its local model; the requesters return;
3. else the smallest key *s*: if a rank holds its result, it broadcasts it and
   the ranks at *s* return it (``prepare_fun`` skipped); the others loop;
4. else every rank is at *s*: they run the call together and leave recovery.

A failure during a round repairs again and resumes the rounds.

Checkpoints are two-phase: each rank stores the new version as pending and
sends its local model to its ``replicas`` ring successors; then ``Agree``
commits. ULFM's agreement is uniform (it fails at all ranks or at none), so
after a failure inside a checkpoint every survivor holds the same committed
version. (A lazy checkpoint exchanges nothing; where its signature check ran
on the node's memory, that check is as uniform and commits it: Note
[uniform check] in ``_shm.py``.) ``finalize`` is the same agreement (a shutdown pseudo-checkpoint): a
peer that dies at the very end is replaced and replays up to it.

# Note [fresh start with a store]
With a durable checkpoint folder, a fresh job's first ``load_checkpoint``
makes the ranks agree on the newest version on disk. A rank that dies before
that is done must not make the job start over from version 0 (the survivors
would serve the replacement version 0 and go on from there, beside the newer
versions that an earlier attempt had left on disk). So each rank with a store keeps
``_resume_pending`` until the resume is done; the recovery round's summary
carries it (a MAX over the ranks), and a replacement takes it from there. A
rank in that ``load_checkpoint`` while recovering, holding its version (0),
runs rounds keyed by the call it stands at, ``(BOOT, seqno)``: they serve the
replacement its replays (a config broadcast before ``load_checkpoint``) and
its checkpoint, until every rank stands there (the round says execute); then
all do the disk resume together. When the survivors are still in earlier
calls, the replacement catches up with them there and they all reach
``load_checkpoint`` by the normal path, with the flag set everywhere. A
failure during the resume repairs and does the same again; ranks left
holding different versions (the failure came after some had loaded) end the
job for a restart.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from ._mpistart import MPI

from ..config import Config
from ..errors import (CheckpointError, CollectiveMismatchError, PeerFailure, RabitError,
                      RecoveryError)
from ..ops import OpLike
from . import _control as control
from ._checkpoint import deserialize, serialize
from ._lifecycle import raised_by_rabit_py
from ._signature import (Call, Kind, allgather_call, allreduce_call, replay_key, same_call,
                         shown)
from ._reduce import DIRECT_TYPES
from ._validate import check_allreduce
from ._versions import NO_LAZY
from .base import CheckpointResult, DeviceTransports, EngineInfo, PrepareFn
from .mpi import MpiEngine
from .recovery import (BOOT, BOOT_SHARE, Entry, Recovery, Replicas, ResultCache, code_key,
                       default_budget, enter_job, key_code)

__all__ = ["RobustEngine"]

log = logging.getLogger("rabit_py")

_AGAIN = object()       # a step of _until_done that must run again
Key = Tuple[int, int]
_LOAD = 0                       # request code of load_checkpoint (served first)
_NO_VERSION = int(np.iinfo(np.int64).min)
_SERVED, _WAIT, _EXECUTE = "served", "wait", "execute"


def _epoch_name(key: Key) -> str:
    """The calls ``key`` belongs to, for messages: "the start-up calls" or "version N"."""
    return "the start-up calls" if key[0] == BOOT else f"version {key[0]}"


def _serve_array(entry: Entry, data: np.ndarray, *_: Any) -> np.ndarray:
    """A served allreduce result, copied into the caller's array."""
    np.copyto(data, entry.payload)
    return data


class RobustEngine(MpiEngine):
    """The public API with in-job recovery (see Note [robust protocol]).

    Raises:
        RabitError: MPI fault tolerance is not enabled; the message says how to
            launch the job.
    """

    def __init__(self, config: Config, comm: Optional[Any] = None,
                 device_transports: Optional[DeviceTransports] = None) -> None:
        joined = enter_job(config, comm)
        #: how this process joined: "start", "spare" or "spawned" (for the tests).
        self.joined_as = joined.joined_as
        config, comm, replacement = joined.config, joined.comm, joined.replacement
        # A replacement's settings come from the survivors (JoinState), and
        # only the job's start has every rank in the check.
        super().__init__(config, comm, check_settings=not replacement, recovers=True,
                         device_transports=device_transports)
        if replacement:
            # The survivors agree that every rank made its communicators
            # (_duplicate_repaired in _recovery.py); ours are made.
            comm.Agree(1)
        if joined.owns_comm:
            comm.Free()                 # ours, not the caller's: the engine runs on a Dup
        if not replacement and not config.cache_budget:
            # Note [uniform budget]: the smallest rank's default, kept in the
            # settings that a replacement is given.
            budget = default_budget()
            if self.frame.size > 1:
                budget = control.reduce_int(self.frame.comm, budget, MPI.MIN)
            config = self._config = dataclasses.replace(config, cache_budget=budget)
        self._cache = ResultCache(config.cache_budget, config.result_copies)
        self._epoch = BOOT
        self._recovering = replacement
        #: The call that the last recovery round ran again (every rank the same).
        self._again_key: Optional[Key] = None
        self._has_version = not replacement
        # Note [fresh start with a store]: the disk resume of the first
        # load_checkpoint is still to be done (replacements learn it in the
        # recovery round).
        self._resume_pending = self.checkpoints.store is not None and not replacement
        self._replicas = Replicas(config.replicas)
        #: the job's recovery counters and the repair of its communicators
        self.recovery = Recovery(self.frame, config, self._replicas, joined.state, joined.pool)
        if joined.pool is not None:
            atexit.register(self.recovery.release_spares)
        if replacement:
            log.info("rank %d: joined the job as a replacement (trial %d)",
                     self.frame.rank, self.recovery.trial)

    @property
    def replays_results(self) -> bool:
        return True

    def recovery_status(self) -> Tuple[bool, List[int], int, int]:
        # The heartbeat may beat before the recovery state exists.
        recovery = getattr(self, "recovery", None)
        return recovery.status() if recovery is not None else (False, [], 0, 0)

    kind = "robust"

    def info(self) -> EngineInfo:
        _, _, recoveries, replaced = self.recovery_status()
        return dataclasses.replace(
            super().info(), trial=self.trial, joined_as=self.joined_as, recoveries=recoveries,
            replaced=replaced, cache_bytes=self._cache.nbytes, cache_budget=self._cache.budget,
            cache_refused=self._cache.refused)

    @property
    def trial(self) -> int:
        """How many times this rank's process has been replaced in this job
        (0: the process the job started with)."""
        return self.recovery.trial

    def device_allreduce(self, data: Any, op: OpLike, prepare_fun: Optional[PrepareFn],
                         reduce: Callable[[], None]) -> Any:
        """As :meth:`allreduce`, for a device array reduced by ``reduce()``
        (NCCL): numbered, its result kept (a host copy) and served to a
        replacement, run again after a failure from a copy of the input
        (on the device) unless ``prepare_fun`` remakes it."""
        backup = data.copy() if prepare_fun is None and self.frame.size > 1 else None
        key = self._next_key()
        return self._call(Kind.ALLREDUCE, key, allreduce_call(op, data),
                          self._execute_device_allreduce, self._serve_device_array, None,
                          data, op, prepare_fun, reduce, backup)

    def _execute_device_allreduce(self, key: Key, call: Call, data: Any, op: OpLike,
                                  prepare_fun: Optional[PrepareFn], reduce: Callable[[], None],
                                  backup: Any) -> Any:
        if backup is not None:
            data[...] = backup
        super().device_allreduce(data, op, prepare_fun, reduce)
        self.frame.check_revoked()
        self._cache.put_array(key, Kind.ALLREDUCE, call, data.get(), True)
        self._thin(key)
        return data

    @staticmethod
    def _serve_device_array(entry: Entry, data: Any, *_: Any) -> Any:
        data.set(np.ascontiguousarray(entry.payload))
        return data

    # ------------------------------------------------------------ collectives
    # Note [robust call]
    # Every robust call is framed by _call: numbered by its key, described by
    # its Call, run by execute(key, call, *args) -- which keeps its result for
    # replay -- or, while the job recovers, by rounds of the recovery protocol
    # that end in serve(entry, *args) (the survivors' result, checked against
    # the call) or in execute. execute and serve are methods, not closures.
    # The allreduce, broadcast and allgather (the hot paths) run _step's first
    # branch themselves: when the job is not recovering they execute at once,
    # and a lost peer met there is recovered (as _until_done does) before
    # _call takes over.
    def allreduce(self, data: np.ndarray, op: OpLike,
                  prepare_fun: Optional[PrepareFn] = None) -> np.ndarray:
        frame = self.frame
        if (prepare_fun is None and type(data) is np.ndarray and type(op) is int
                and data.nbytes < self._reduce.direct_below and not self._recovering):
            direct = DIRECT_TYPES.get((op, data.dtype))
            flags = data.flags
            if direct is not None and flags.c_contiguous and flags.writeable \
                    and not self._cache.refused:
                key = (self._epoch, frame.seqno)
                try:
                    return self._direct_allreduce(key, data, op, direct)
                except PeerFailure:
                    self._recover()
                return self._call(Kind.ALLREDUCE, key, (op, data.dtype, data.shape, None),
                                  self._execute_allreduce, _serve_array, None, data, op, None)
        error = check_allreduce(data, op)
        key = (self._epoch, frame.seqno)
        if error is not None:
            return self._call(Kind.ALLREDUCE, key, None, self._refused_allreduce, None, error,
                              data, op, prepare_fun, error)
        # allreduce_call, inlined (the hot path): the frame's check and the
        # result cache share it.
        call = (op, data.dtype, data.shape, None)
        if not self._recovering:
            # The first branch of _step, inlined: the hot path (Note [robust call]).
            try:
                return self._execute_allreduce(key, call, data, op, prepare_fun)
            except PeerFailure:
                self._recover()
        return self._call(Kind.ALLREDUCE, key, call, self._execute_allreduce, _serve_array, None,
                          data, op, prepare_fun)

    # Note [small allreduce]
    # A small allreduce costs its Python more than its MPI call (raw
    # mpi4py's 8-byte Allreduce: 1-1.5 us on the development VM), so the
    # common case -- a built-in op on a writeable C-contiguous array below
    # the shared-memory sizes, no prepare_fun, not recovering -- runs in one
    # method: the input checks are one look-up in DIRECT_TYPES (_reduce.py),
    # which also gives the predefined MPI datatype and op, sparing mpi4py's
    # look-up of them for both buffers (0.4 us). The same steps as the
    # general path in the same order (number, watch, check, reduce out of
    # place into a cache buffer, trust only an unrevoked result, copy back,
    # keep, thin): the same results, errors and recovery. Measured
    # (scripts/bench_hotpath.py, 8 bytes, 2 ranks, best of 4 jobs): 5.4 ->
    # 4.6 us per call with the check off, 8.2 -> 7.1 with it on.

    def _direct_allreduce(self, key: Key, data: np.ndarray, op: int,
                          direct: Tuple[Any, Any]) -> np.ndarray:
        """Note [small allreduce]: :meth:`_execute_allreduce` for an array
        that goes straight to MPI."""
        frame = self.frame
        call = (op, data.dtype, data.shape, None)
        frame.enter(Kind.ALLREDUCE, None, True, call)
        cache = self._cache
        try:
            out = cache.buffer_like(data)
            mpitype, mpiop = direct
            frame.comm.Allreduce([data, mpitype], [out, mpitype], op=mpiop)
        except MPI.Exception as exc:
            raise frame.failure(exc) from exc
        finally:
            frame.leave()
        frame.check_revoked()
        data[...] = out
        cache.put_owned(key, Kind.ALLREDUCE, call, out)
        if cache.copies or cache.refused:
            self._thin(key)             # thins, or says the budget was passed
        return data

    def _execute_allreduce(self, key: Key, call: Call, data: np.ndarray, op: OpLike,
                           prepare_fun: Optional[PrepareFn]) -> np.ndarray:
        """Run the allreduce of ``key`` and keep its result. Reduced out of
        place into the buffer the cache keeps: an MPI call that fails half-way
        leaves ``data`` as it was, so the call can run again after a recovery,
        and the result is copied once (Note [result cache]); with a
        ``prepare_fun`` or past the cache budget, in place (Note [in-place
        robust allreduce]). The frame's call number is ``key``'s."""
        cache = self._cache
        if prepare_fun is not None or cache.refused:
            return self._execute_in_place(key, call, data, op, prepare_fun)
        # A call kept in the node's memory needs no buffer (4.5 us per call).
        reduce = self._reduce
        out = (None if data.nbytes >= reduce.kept_from and reduce.will_keep(data, op)
               else cache.buffer_like(data))
        result = self.framed_allreduce(data, op, prepare_fun, None, out, call, True,
                                       call_id=key, again=key == self._again_key)
        self.frame.check_revoked()
        if result is out:
            data[...] = result          # same copy; 0.3 us less than np.copyto for 8 bytes
            cache.put_owned(key, Kind.ALLREDUCE, call, out)
        else:                           # Note [kept results] in _shm.py: data holds it too
            assert result is not data, "will_keep promised a kept result"
            if out is not None:
                cache.give_back(out)
            cache.put_kept(key, Kind.ALLREDUCE, call, result)
            self._reduce.settled()
        self._thin(key)
        return data

    def _execute_in_place(self, key: Key, call: Call, data: np.ndarray, op: OpLike,
                          prepare_fun: Optional[PrepareFn]) -> np.ndarray:
        """The allreduce of ``key`` reduced in place (Note [in-place robust
        allreduce]): with ``prepare_fun``, then its result copied into the
        cache; past the cache budget, kept nowhere (every rank alike: Note
        [uniform budget])."""
        if not self._cache.refused:
            result = self.framed_allreduce(data, op, prepare_fun, None, None, call, True,
                                           call_id=key, again=key == self._again_key)
            self.frame.check_revoked()
            if result is data:
                self._cache.put_array(key, Kind.ALLREDUCE, call, data)
            else:                       # Note [kept results] in _shm.py: data holds it too
                self._cache.put_kept(key, Kind.ALLREDUCE, call, result)
                self._reduce.settled()
            self._thin(key)
            return data
        try:
            self.framed_allreduce(data, op, prepare_fun, None, None, call, past_budget=True)
            self.frame.check_revoked()
        except PeerFailure as exc:
            raise self.recovery.give_up(RecoveryError(
                f"rank {self.frame.rank}: a failure interrupted call #{key[1]} of "
                f"{_epoch_name(key)}, made "
                f"past the cache budget (RABIT_CACHE_BUDGET={self._cache.budget} bytes): its "
                f"input was reduced in place and not kept, so it cannot run again; the job "
                f"must restart from a durable checkpoint")) from exc
        self._cache.refused += 1
        self._thin(key)
        return data

    # Note [in-place robust allreduce]
    # Below shm_keep_min_bytes (or where a node cannot share areas), the
    # robust allreduce reduces out of place into the cache's buffer so
    # that an interrupted call finds its input intact and can run again
    # (Note [result cache]), then copies the result back; from it, the node's
    # shared memory holds the result (Note [kept results] in _shm.py) and the
    # input is only read, or on one host reduced in place with what is left
    # of an interrupted call known (Note [fused in place]). Open MPI's
    # out-of-place Allreduce costs more than
    # its in-place one on one host (raw mpi4py, 2 ranks on the development
    # VM: 0.92 against 0.57 ms at 4 MiB). Two cases need no intact input,
    # and reduce in place:
    # - with prepare_fun, which remakes the input before the call runs again:
    #   the same protocol as the others (ranks may differ in passing a
    #   prepare_fun: see framed_allreduce); the result is then copied into
    #   the cache, one copy in all;
    # - past the cache budget (Note [cache budget]), where nothing is kept:
    #   a failure needs results that nobody holds anyway, so the call runs as
    #   the plain engine's (MPI's in-place allreduce: 0.55 against 0.88 ms
    #   for the kept-result protocol at 4 MiB on 2 ranks, Open MPI reading
    #   the peer's memory directly), and a failure inside it ends the job
    #   for a restart instead of running it again on a half-reduced input.
    #   Every rank is past the budget in the same call (Note [uniform
    #   budget]): the paths do not meet.

    def _refused_allreduce(self, key: Key, call: None, data: np.ndarray, op: OpLike,
                           prepare_fun: Optional[PrepareFn], error: BaseException) -> None:
        """An allreduce whose input this rank refused: the others learn it in
        the signature check, and every rank raises."""
        MpiEngine.framed_allreduce(self, data, op, prepare_fun, error)

    def broadcast(self, data: Any, root: int = 0) -> Any:
        key = self._next_key()
        described = self.broadcast_input(data, root)        # once: checks, device lookup
        if not self._recovering:
            # The first branch of _step, inlined as in allreduce (Note [robust call]).
            try:
                return self._execute_broadcast(key, described[4], data, root, described)
            except PeerFailure:
                self._recover()
        return self._call(Kind.BROADCAST, key, described[4], self._execute_broadcast,
                          self._serve_broadcast, None, data, root, described)

    def _execute_broadcast(self, key: Key, call: Optional[Call], data: Any, root: int,
                           described: tuple) -> Any:
        result, carried = self.carried_broadcast(data, root, described)
        self.frame.check_revoked()
        if carried.on_device:
            # A device array (NCCL): its host copy is kept (a receiver that
            # passed a NumPy array got one already).
            transport = self.device_transport()
            host = transport.to_host(result) if transport.carries(result) else result
            self._cache.put_array(key, Kind.BROADCAST, call, host, device=True)
        elif isinstance(result, np.ndarray) and carried.pickled is None:
            self._cache.put_array(key, Kind.BROADCAST, call, result)
        else:
            self._cache.put_bytes(key, Kind.BROADCAST, call, carried.pickled or b"")
        self._thin(key)
        return result

    def _serve_broadcast(self, entry: Entry, data: Any, root: int, _described: tuple) -> Any:
        payload = entry.payload
        if not isinstance(payload, np.ndarray):
            return deserialize(payload, "broadcast result")
        transport = self.device_transport()
        on_device = transport is not None and transport.carries(data)
        if (on_device or isinstance(data, np.ndarray)) and \
                tuple(data.shape) == payload.shape and data.dtype == payload.dtype:
            if on_device:
                return transport.upload(payload, data)
            np.copyto(data, payload)
            return data
        if entry.device and transport is not None:
            return transport.upload(payload)
        return payload.copy()

    def allgather(self, data: np.ndarray) -> np.ndarray:
        key = self._next_key()
        call = allgather_call(data)
        if not self._recovering:
            # The first branch of _step, inlined as in allreduce (Note [robust call]).
            try:
                return self._execute_allgather(key, call, data, False)
            except PeerFailure:
                self._recover()
        return self._call(Kind.ALLGATHER, key, call, self._execute_allgather,
                          self._serve_gathered, None, data, False)

    def device_allgather(self, data: Any) -> Any:
        """As :meth:`allgather`, for a device array on the device transport:
        numbered, its result kept (a host copy) and served to a replacement
        as a new device array."""
        key = self._next_key()
        return self._call(Kind.ALLGATHER, key, allgather_call(data), self._execute_allgather,
                          self._serve_gathered, None, data, True)

    def _execute_allgather(self, key: Key, call: Optional[Call], data: Any, device: bool) -> Any:
        if device:
            result = super().device_allgather(data)
            host = self.device_transport().to_host(result)
        else:
            result = host = super().allgather(data)
        self.frame.check_revoked()
        self._cache.put_array(key, Kind.ALLGATHER, call, host, device)
        self._thin(key)
        return result

    def _serve_gathered(self, entry: Entry, data: Any, device: bool) -> Any:
        if device:
            return self.device_transport().upload(entry.payload)
        return entry.payload.copy()

    def _thin(self, key: Key) -> None:
        """Keep the result of ``key`` (``result_copies``: Note [result cache]);
        the first time the cache budget was passed, say what that means."""
        cache = self._cache
        if cache.copies == 0 and not cache.refused:
            return              # the default: every rank keeps every result
        if not cache.thin(key, self.frame.rank, self.frame.size):
            return
        if key[0] == BOOT:
            log.warning(
                "rank %d: this program has not checkpointed since it started, so every "
                "result since its start is kept for a replacement to replay, and at call #%d "
                "they passed the part of the cache budget that start-up calls may use "
                "(%d bytes: 1/%d of RABIT_CACHE_BUDGET=%d). From here on results are not "
                "kept and allreduces run as on plain MPI, but a failure ends the job for a "
                "restart from the start (or from the durable checkpoint) instead of an "
                "in-job recovery. A checkpoint each iteration (rabit.checkpoint(model), or "
                "rabit.lazy_checkpoint(model), which copies nothing) lets the engine drop "
                "the results before it: a failure at any point is then recovered in the "
                "job, by replaying at most one iteration's calls.",
                self.frame.rank, key[1], self._cache.budget // BOOT_SHARE, BOOT_SHARE,
                self._cache.budget)
        else:
            log.warning(
                "rank %d: the results kept for replay since the last checkpoint passed the "
                "cache budget (RABIT_CACHE_BUDGET=%d bytes) at call #%d of version %d. "
                "Results past it are not kept, so a failure before the next checkpoint ends "
                "the job for a restart from the durable checkpoint (rabit-run "
                "--checkpoint-dir, --max-restarts) instead of an in-job recovery. Checkpoint "
                "more often (rabit.checkpoint), or raise RABIT_CACHE_BUDGET.",
                self.frame.rank, self._cache.budget, key[1], self.frame.version)

    # ------------------------------------------------------------ checkpoints
    def checkpoint(self, global_model: Any, local_model: Any = None) -> None:
        error: Optional[BaseException] = None
        global_blob = local_blob = None
        try:
            global_blob = serialize(global_model, "global model")
            local_blob = None if local_model is None else serialize(local_model, "local model")
        except CheckpointError as exc:
            error = exc
        self._commit_version(global_blob, NO_LAZY, local_blob, error)

    def lazy_checkpoint(self, global_model: Any) -> None:
        self._commit_version(None, global_model, None, None)

    def _commit_version(self, global_blob: Optional[bytes], lazy: Any,
                        local_blob: Optional[bytes], error: Optional[BaseException]) -> None:
        key = (self._epoch, self.frame.seqno)
        self._before_call(key[1])

        lazy_call = lazy is not NO_LAZY

        def execute(*_: Any) -> None:
            frame = self.frame
            frame.sync(Kind.LAZY_CHECKPOINT if lazy_call else Kind.CHECKPOINT, error)
            if lazy_call:
                # Every rank is in a lazy checkpoint (the check holds it): no
                # local model anywhere, so the exchange would move only Nones.
                replicas = self._replicas.none_held(frame.rank, frame.size)
            else:
                replicas = frame.guarded(Kind.CHECKPOINT,
                                         lambda: self._replicas.exchange(frame.comm, local_blob))
            if not (lazy_call and frame.checks_on_node):
                # Note [uniform check] in _shm.py: a check on the node commits
                # a lazy checkpoint by itself.
                frame.guarded(Kind.CHECKPOINT, lambda: frame.comm.Agree(1), agreement=True)
            # Committed at every living rank (the agreement is uniform).
            self.checkpoints.commit(global_blob, local_blob, lazy)
            self._replicas.held = replicas
            self.frame.next_version()
            self._start_epoch()
            if self.checkpoints.store is not None:
                on_disk = global_blob
                if on_disk is None and self.frame.rank == 0 and lazy is not NO_LAZY:
                    on_disk = serialize(lazy, "global model")
                self.checkpoints.save(self.frame.version, on_disk, local_blob)

        if not self._recovering:
            # The first branch of _step, inlined as in allreduce (Note [robust
            # call]): a training loop checkpoints at every iteration.
            try:
                execute()
                return
            except PeerFailure:
                self._recover()
        self._call(Kind.CHECKPOINT, key, None, execute, None, error)

    def load_checkpoint(self, with_local: bool = False) -> CheckpointResult:
        self._before_call(self.frame.seqno)

        def step() -> Any:
            if not (self._recovering or not self._has_version):
                self.frame.sync(Kind.LOAD_CHECKPOINT, None)
                if self._resume_pending:
                    self._resume_from_disk()
                return None
            if self._has_version and self._resume_pending:
                # Note [fresh start with a store]: rounds at this call
                # until every rank reached it, then the resume together.
                key = (self._epoch, self.frame.seqno)
                if self.frame.guarded(Kind.LOAD_CHECKPOINT,
                                 lambda: self._round(key))[0] != _EXECUTE:
                    return _AGAIN
                self._recovering = False
                self.recovery.caught_up()
                self._resume_from_disk()
                return None
            # A replacement (or any rank while recovering) asks the survivors.
            if self.frame.guarded(Kind.LOAD_CHECKPOINT, lambda: self._round(None))[0] == _SERVED:
                if self._resume_pending:
                    return _AGAIN       # learned in the round: resume with the others
                return None
            return _AGAIN

        self._until_done(step)
        self._start_epoch()
        return self.checkpoints.result(self.frame.version, with_local)

    def _resume_from_disk(self) -> None:
        """A fresh start with a checkpoint folder: the ranks agree on the newest
        version on disk, load it and copy the local models to their ring
        replicas (Note [fresh start with a store]). Raises ``PeerFailure``
        if a rank is lost meanwhile."""
        self.frame.guarded(Kind.LOAD_CHECKPOINT, self.load_durable)
        if self.frame.version > 0:
            self._replicas.held = self.frame.guarded(
                Kind.LOAD_CHECKPOINT,
                lambda: self._replicas.exchange(self.frame.comm, self.checkpoints.local_blob))
        self._resume_pending = False

    def finalize(self) -> None:
        if not self.frame.finalized and self.frame.broken is None:
            self._before_call(self.frame.seqno)
        try:
            super().finalize()
        finally:
            self.recovery.release_spares()

    def finalize_sync(self) -> None:
        def execute(*_: Any) -> None:
            self.frame.sync(Kind.FINALIZE, None)
            self.frame.guarded(Kind.FINALIZE, lambda: self.frame.comm.Agree(1), agreement=True)

        self._call(Kind.FINALIZE, (self._epoch, self.frame.seqno), None, execute, None, None)

    # ------------------------------------------------------------ the protocol
    def _before_call(self, seqno: int) -> None:
        """Hook run at the start of every call but ``allreduce``, which keeps
        the hot path free of it (the mock kills here, and overrides
        ``allreduce`` to run it there too)."""

    def _next_key(self) -> Key:
        key = (self._epoch, self.frame.seqno)
        self._before_call(key[1])
        return key

    def _start_epoch(self) -> None:
        """A checkpoint committed or the checkpoint was loaded: new numbering."""
        if self._epoch == BOOT or self._epoch != self.frame.version:
            self._epoch = self.frame.version
            self.frame.number_from(0)
            self._cache.drop_epochs_before(self.frame.version)

    def _call(self, kind: int, key: Key, call: Optional[Call], execute: Callable[..., Any],
              serve: Optional[Callable[..., Any]], error: Optional[BaseException],
              *args: Any) -> Any:
        """Run one call (Note [robust call]): ``execute(key, call, *args)``,
        or, while recovering, rounds that end in ``serve(entry, *args)`` (a
        result that the survivors kept, of the same call: Note [signature
        check]) or in ``execute``. ``error``: this rank refused its input."""
        return self._until_done(self._step, kind, key, call, execute, serve, error, args)

    def _step(self, kind: int, key: Key, call: Optional[Call], execute: Callable[..., Any],
              serve: Optional[Callable[..., Any]], error: Optional[BaseException],
              args: Tuple[Any, ...]) -> Any:
        """One try of :meth:`_call`."""
        if self._recovering:
            if error is not None:
                raise error
            outcome, entry = self.frame.guarded(kind, lambda: self._round(key))
            if outcome == _WAIT:
                return _AGAIN
            if outcome == _SERVED:
                self.frame.number_from(key[1] + 1)
                mine = replay_key(call)
                if entry.kind != kind or not same_call(entry.signature, mine):
                    raise CollectiveMismatchError(
                        f"rank {self.frame.rank}: after recovery, call #{key[1]} of version "
                        f"{self.frame.version} is {shown(kind, mine)} but the other ranks "
                        f"ran {shown(entry.kind, entry.signature)}: the program must make "
                        f"the same calls on every run")
                self._cache.put_entry(key, entry)
                return serve(entry, *args) if serve is not None else None
            self._recovering = False        # _EXECUTE: everyone is at this call
            self._again_key = key           # Note [fused in place] in _shm.py
            self.recovery.caught_up()
            self.frame.number_from(key[1])
        return execute(key, call, *args)

    def _until_done(self, step: Callable[..., Any], *args: Any) -> Any:
        """Run ``step(*args)`` until it returns something else than
        ``_AGAIN``. The one place where a lost peer (PeerFailure, from any MPI
        call of the step) is caught: the job is repaired (Note [repair]) and
        the step runs again, as a round of the recovery protocol or for real."""
        while True:
            try:
                result = step(*args)
            except PeerFailure:
                self._recover()
                continue
            except RabitError:
                raise
            except Exception as exc:
                if self._recovering and raised_by_rabit_py(exc):
                    raise self._internal_failure("recovering from a lost peer", exc) from exc
                raise                   # the program's own error (a prepare_fun's): a bug
            if result is not _AGAIN:
                return result

    def _internal_failure(self, doing: str, exc: BaseException) -> RecoveryError:
        """rabit_py's own code failed while the job recovered from a fault:
        not the program's bug, and a restart from the durable checkpoint may
        do (the error says which; rabit-run is told)."""
        return self.recovery.give_up(RecoveryError(
            f"rank {self.frame.rank}: {doing} failed ({type(exc).__name__}: {exc}); the job "
            f"must restart from a durable checkpoint"))

    def _round(self, key: Optional[Key]) -> Tuple[str, Optional[Entry]]:
        """One round of the recovery protocol; ``key`` None asks for the checkpoint."""
        comm = self.frame.comm
        code = _LOAD if key is None else key_code(key)
        version = self.frame.version if self._has_version else _NO_VERSION
        summary = np.array([version, -version if self._has_version else _NO_VERSION,
                            -code, code, int(self._resume_pending and self._has_version)],
                           dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, summary, op=MPI.MAX)
        max_version, min_code, max_code = int(summary[0]), -int(summary[2]), int(summary[3])
        # Note [fresh start with a store]: the survivors have not resumed from
        # disk yet; a replacement learns it here.
        if not self._has_version:
            self._resume_pending = bool(summary[4])
        if max_version == _NO_VERSION:
            raise self.recovery.give_up(RecoveryError("every rank of the job was lost: nothing to "
                                              "recover from"))
        if max_version != -int(summary[1]):
            raise self.recovery.give_up(RecoveryError(
                f"rank {self.frame.rank}: the survivors hold different versions "
                f"({-int(summary[1])} to {max_version}) after a failure"))
        if min_code == _LOAD:
            self._serve_checkpoint(key is None, max_version)
            return (_SERVED if key is None else _WAIT), None
        wanted = code_key(min_code)
        holder = control.reduce_int(comm, self.frame.rank if wanted in self._cache else -1,
                                    MPI.MAX)
        if holder >= 0:
            entry = control.bcast(comm, self._replayable(wanted) if self.frame.rank == holder
                                  else None, holder, "round.result")
            return (_SERVED, entry) if code == min_code else (_WAIT, None)
        if max_code != min_code:
            raise self.recovery.give_up(RecoveryError(
                f"rank {self.frame.rank}: the result of call #{wanted[1]} of "
                f"{_epoch_name(wanted)} "
                f"is needed but no living rank holds it{self._cache.missing_hint()}"))
        if not self._has_version and max_version == 0:
            # A replacement that caught up with the survivors before anyone took
            # a checkpoint: there is nothing to load, it runs on like them.
            self.frame.adopt_version(0)
            self._has_version = True
        return _EXECUTE, None

    def _replayable(self, key: Key) -> Entry:
        """The cached result of ``key`` as it is sent to a replacement: its
        call described by :func:`replay_key` (codes, picklable)."""
        entry = self._cache.get(key)
        return entry._replace(signature=replay_key(entry.signature))

    def _serve_checkpoint(self, requesting: bool, version: int) -> None:
        """Round step 2: give the requesters the committed checkpoint."""
        blob, mine = self._replicas.serve(
            self.frame.comm, requesting, self._has_version, self.checkpoints,
            lambda owner: self.recovery.local_model_lost(owner, version))
        if requesting and not self._has_version:
            self.frame.adopt_version(version)
            self.checkpoints.commit(blob, mine)
            self._has_version = True
        # Give the replacements the replicas they were keeping for their neighbours.
        self._replicas.held = self._replicas.exchange(self.frame.comm, self.checkpoints.local_blob)

    # ------------------------------------------------------------ failures
    def _recover(self) -> None:
        """Repair the communicators and enter recovery mode (Note [repair])."""
        try:
            comms = self.recovery.repair(self._has_version,
                                         self.checkpoints.local_blob is not None)
        except RabitError:
            raise
        except Exception as exc:
            raise self._internal_failure("repairing the job after a lost peer", exc) from exc
        self.use(*comms)
        self.frame.repaired()
        self._recovering = True
