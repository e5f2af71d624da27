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
version. ``finalize`` is the same agreement (a shutdown pseudo-checkpoint): a
peer that dies at the very end is replaced and replays up to it.

# Note [fresh start with a store]
With a durable checkpoint folder, a fresh job's first ``load_checkpoint``
makes the ranks agree on the newest version on disk. A rank that dies before
that is done must not make the job start over from version 0 (it did: the
survivors served the replacement version 0 and went on from there, beside
the newer versions that an earlier attempt had left on disk; seen in a
storm, at the start of a restarted attempt). So each rank with a store keeps
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
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ._mpistart import MPI

from .._checkpoint import deserialize, serialize
from ..config import Config
from ..errors import (CheckpointError, CollectiveMismatchError, PeerFailure, RabitError,
                      RecoveryError)
from ..ops import OpLike, op_code
from ._cache import BOOT, Entry, ResultCache, default_budget
from ._join import JoinState, RepairTimes, is_replacement
from ._repair import join_as_replacement, repair
from ._signature import Kind
from ._spares import SparePool, serve_as_spare, spare_reporter
from ._validate import check_allreduce
from ._watchdog import FATAL_NOTICE_TAG, TIMEOUT_NOTICE_TAG, deadline
from .._status import BUG, RESTART, Reporter
from .base import CheckpointResult, PrepareFn
from ._lifecycle import abort_init, abort_job
from ._startup import duplicates, ulfm_enabled
from ._replicas import Replicas
from ._versions import NO_LAZY
from .mpi import _ERR_PROC_FAILED, _ERR_REVOKED, MpiEngine

__all__ = ["RobustEngine"]

log = logging.getLogger("rabit_py")

_AGAIN = object()       # a step of _until_done that must run again
Key = Tuple[int, int]
_LOAD = 0                       # request code of load_checkpoint (served first)
_NO_VERSION = int(np.iinfo(np.int64).min)
_SERVED, _WAIT, _EXECUTE = "served", "wait", "execute"


def _code(key: Key) -> int:
    """A key as one int64, ordered like the calls: bootstrap calls first."""
    return 1 + ((key[0] + 1) << 32) + key[1]


def _key(code: int) -> Key:
    return ((code - 1) >> 32) - 1, (code - 1) & 0xFFFFFFFF


class RobustEngine(MpiEngine):
    """The public API with in-job recovery (see Note [robust protocol]).

    Raises:
        RabitError: MPI fault tolerance is not enabled; the message says how to
            launch the job.
    """

    def __init__(self, config: Config, comm: Optional[Any] = None) -> None:
        #: how this process joined: "start", "spare" or "spawned" (for the tests).
        self.joined_as = "spawned" if comm is None and is_replacement() else "start"
        state: Optional[JoinState] = None
        pool: Optional[SparePool] = None
        if self.joined_as == "spawned":
            comm, _, state, pool = join_as_replacement(config.recovery_timeout)
            if pool is not None:
                pool.target = config.spares
            if comm is None:
                # Spawned as a new spare (Note [spare refill] in _spares.py).
                comm, state = serve_as_spare(pool, config)
                self.joined_as = "spare"
        elif not ulfm_enabled():
            raise RabitError(
                "engine='robust' needs MPI fault tolerance, which this job was started "
                "without: launch it with `rabit-run -n N python ...` or `mpirun --with-ft "
                "ulfm --prtemca state_base_recoverable 1 ...`, or use engine='mpi' (no recovery)")
        elif config.spares:
            if comm is not None:
                raise ValueError("spares (RABIT_SPARES) are taken from MPI.COMM_WORLD: they "
                                 "cannot be used with init(comm=...)")
            # Collective over every process: a rank that never calls init()
            # must not hang the others (as in MpiEngine's own start).
            world_rank = MPI.COMM_WORLD.Get_rank()
            reporter = spare_reporter(config) if world_rank >= MPI.COMM_WORLD.Get_size() - \
                config.spares else Reporter.for_rank(config.run_status_dir, world_rank)
            with deadline(config.timeout,
                          lambda _: abort_init(MPI.COMM_WORLD, reporter, world_rank,
                                                config.timeout), "init"):
                pool, comm = SparePool.start(config.spares)
            if comm is None:
                comm, state = serve_as_spare(pool, config)
                self.joined_as = "spare"
        replacement = self.joined_as != "start"
        if state is not None and state.settings:
            # The job's settings, whatever reached this process's environment.
            config = dataclasses.replace(Config(**state.settings), log_level=config.log_level)
        # A replacement's settings come from the survivors (JoinState), and
        # only the job's start has every rank in the check.
        super().__init__(config, comm, check_settings=not replacement)
        if replacement:
            # The survivors agree that every rank made its communicators
            # (RobustEngine._duplicate_repaired); ours are made.
            comm.Agree(1)
        if replacement or pool is not None:
            comm.Free()                 # ours, not the caller's: the engine runs on a Dup
        self._pool = pool
        if pool is not None:
            atexit.register(self._release_spares)
        self._cache = ResultCache(config.cache_budget or default_budget())
        self._warned_budget = False
        self._last_cached: Optional[Key] = None
        self._epoch = BOOT
        self._recovering = replacement
        self._has_version = not replacement
        # Note [fresh start with a store]: the disk resume of the first
        # load_checkpoint is still to be done (replacements learn it in the
        # recovery round).
        self._resume_pending = self._checkpoints.store is not None and not replacement
        self._replicas = Replicas(config.replicas)
        self._trials: Dict[int, int] = dict(state.trials) if state else {}
        self._trial = self._trials.get(self._rank, 0)
        self._recoveries = state.recoveries if state else 0
        # Note [crash loop]: ranks replaced since the ranks last ran a call
        # together (their replacements have not caught up yet), and how many
        # times in a row each died before catching up.
        self._catching_up: List[int] = list(state.catching_up) if state else []
        self._quick_deaths: Dict[int, int] = dict(state.quick_deaths) if state else {}
        self.repair_times = RepairTimes()
        # For the benchmark: wall-clock times of each recovery on this rank
        # (failure detected, communicator repaired, replay done).
        self.recovery_log: List[Dict[str, Any]] = []
        if replacement:
            log.info("rank %d: joined the job as a replacement (trial %d)",
                     self._rank, self._trial)

    @property
    def replays_results(self) -> bool:
        return True

    def device_allreduce(self, data: Any, op: OpLike, prepare_fun: Optional[PrepareFn],
                         reduce: Callable[[], None]) -> Any:
        """As :meth:`allreduce`, for a device array reduced by ``reduce()``
        (NCCL): numbered, its result kept (a host copy) and served to a
        replacement, run again after a failure from a copy of the input
        (on the device) unless ``prepare_fun`` remakes it."""
        backup = data.copy() if prepare_fun is None and self._size > 1 else None

        def run() -> None:
            if backup is not None:
                data[...] = backup
            super(RobustEngine, self).device_allreduce(data, op, prepare_fun, reduce)

        return self._numbered_allreduce(data, op, None, run, data.get,
                                        lambda payload: data.set(np.ascontiguousarray(payload)),
                                        device=True)

    # ------------------------------------------------------------ collectives
    def allreduce(self, data: np.ndarray, op: OpLike,
                  prepare_fun: Optional[PrepareFn] = None) -> np.ndarray:
        error = check_allreduce(data, op)
        key = self._next_key()
        signature = (() if error else
                     (Kind.ALLREDUCE, op_code(op), data.dtype.str, tuple(data.shape)))

        def execute() -> np.ndarray:
            # Reduced out of place into the buffer the cache keeps: an MPI
            # call that fails half-way leaves ``data`` as it was, so the call
            # can run again after a recovery, and the result is copied once
            # (Note [result cache]).
            self._seqno = key[1]
            out = self._cache.buffer_like(data) if error is None else None
            MpiEngine._allreduce(self, data, op, prepare_fun, error, out)
            self._check_revoked()
            assert out is not None
            np.copyto(data, out)
            self._cache.put_owned(key, Kind.ALLREDUCE, signature, out)
            self._thin(key)
            return data

        def serve(entry: Entry) -> np.ndarray:
            np.copyto(data, entry.payload)
            return data

        return self._call(Kind.ALLREDUCE, key, signature, execute, serve, error)

    def _numbered_allreduce(self, data: Any, op: OpLike, error: Optional[BaseException],
                            run: Callable[[], None], result: Callable[[], np.ndarray],
                            load: Callable[[np.ndarray], Any], device: bool = False) -> Any:
        """The robust frame of an allreduce of ``data`` (host or device):
        numbered; ``run()`` executes it (restoring the input first), then
        ``result()`` (a host array) is kept for replay; a replacement's call is
        served by ``load(payload)`` instead. Returns ``data``."""
        key = self._next_key()
        signature = (() if error else
                     (Kind.ALLREDUCE, op_code(op), data.dtype.str, tuple(data.shape)))

        def execute() -> Any:
            self._seqno = key[1]
            run()
            self._check_revoked()
            self._cache.put_array(key, Kind.ALLREDUCE, signature, result(), device)
            self._thin(key)
            return data

        def serve(entry: Entry) -> Any:
            load(entry.payload)
            return data

        return self._call(Kind.ALLREDUCE, key, signature, execute, serve, error)

    def broadcast(self, data: Any, root: int = 0) -> Any:
        key = self._next_key()
        signature = (Kind.BROADCAST, root)

        def execute() -> Any:
            self._seqno = key[1]
            result = super(RobustEngine, self).broadcast(data, root)
            self._check_revoked()
            if self._broadcast_device:
                # A device array (NCCL): its host copy is kept (a receiver that
                # passed a NumPy array got one already).
                transport = self.device_transport()
                host = transport.to_host(result) if transport.carries(result) else result
                self._cache.put_array(key, Kind.BROADCAST, signature, host, device=True)
            elif isinstance(result, np.ndarray) and self._broadcast_payload is None:
                self._cache.put_array(key, Kind.BROADCAST, signature, result)
            else:
                self._cache.put_bytes(key, Kind.BROADCAST, signature,
                                      bytes(self._broadcast_payload or b""))
            self._thin(key)
            return result

        def serve(entry: Entry) -> Any:
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

        return self._call(Kind.BROADCAST, key, signature, execute, serve, None)

    def allgather(self, data: np.ndarray) -> np.ndarray:
        return self._numbered_allgather(lambda: super(RobustEngine, self).allgather(data),
                                        lambda result: result, lambda payload: payload.copy())

    def device_allgather(self, data: Any) -> Any:
        """As :meth:`allgather`, for a device array on the device transport:
        numbered, its result kept (a host copy) and served to a replacement
        as a new device array."""
        transport = self.device_transport()
        return self._numbered_allgather(
            lambda: super(RobustEngine, self).device_allgather(data), transport.to_host,
            transport.upload, device=True)

    def _numbered_allgather(self, gather: Callable[[], Any], to_host: Callable[[Any], np.ndarray],
                            load: Callable[[np.ndarray], Any], device: bool = False) -> Any:
        """The robust frame of an allgather: numbered; ``gather()`` executes
        it and ``to_host(result)`` is kept for replay; a replacement's call
        gets ``load(payload)`` instead."""
        key = self._next_key()
        signature = (Kind.ALLGATHER,)

        def execute() -> Any:
            self._seqno = key[1]
            result = gather()
            self._check_revoked()
            self._cache.put_array(key, Kind.ALLGATHER, signature, to_host(result), device)
            self._thin(key)
            return result

        return self._call(Kind.ALLGATHER, key, signature, execute,
                          lambda entry: load(entry.payload), None)

    def _thin(self, key: Key) -> None:
        """Keep the result of ``key``; drop the previous call's unless this
        rank is one of its holders (``result_copies``; Note [result cache])."""
        if self._cache.full and not self._warned_budget:
            self._warned_budget = True
            log.warning(
                "rank %d: the results kept for replay since the last checkpoint passed the "
                "cache budget (RABIT_CACHE_BUDGET=%d bytes) at call #%d of version %d. "
                "Results past it are not kept, so a failure before the next checkpoint ends "
                "the job for a restart from the durable checkpoint (rabit-run "
                "--checkpoint-dir, --max-restarts) instead of an in-job recovery. Checkpoint "
                "more often (rabit.checkpoint), or raise RABIT_CACHE_BUDGET.",
                self._rank, self._cache.budget, key[1], self._version)
        previous, self._last_cached = self._last_cached, key
        copies = self._config.result_copies
        if (previous is None or previous == key or previous[0] == BOOT or copies == 0
                or copies >= self._size):
            return
        if (previous[1] - self._rank) % self._size >= copies:
            self._cache.drop(previous)

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
        key = (self._epoch, self._seqno)
        self._before_call(key[1])

        def execute() -> None:
            self._sync(Kind.CHECKPOINT, error)
            replicas = self._guarded(Kind.CHECKPOINT,
                                     lambda: self._replicas.exchange(self._comm, local_blob))
            self._guarded(Kind.CHECKPOINT, lambda: self._comm.Agree(1), agreement=True)
            # Committed at every living rank (the agreement is uniform).
            self._checkpoints.commit(global_blob, local_blob, lazy)
            self._replicas.held = replicas
            self._version += 1
            self._start_epoch()
            if self._checkpoints.store is not None:
                on_disk = global_blob
                if on_disk is None and self._rank == 0 and lazy is not NO_LAZY:
                    on_disk = serialize(lazy, "global model")
                self._checkpoints.save(self._version, on_disk, local_blob)

        self._call(Kind.CHECKPOINT, key, (Kind.CHECKPOINT,), execute, None, error)

    def load_checkpoint(self, with_local: bool = False) -> CheckpointResult:
        self._before_call(self._seqno)

        def step() -> Any:
            if not (self._recovering or not self._has_version):
                self._sync(Kind.LOAD_CHECKPOINT, None)
                if self._resume_pending:
                    self._resume_from_disk()
                return None
            if self._has_version and self._resume_pending:
                # Note [fresh start with a store]: rounds at this call
                # until every rank reached it, then the resume together.
                key = (self._epoch, self._seqno)
                if self._guarded(Kind.LOAD_CHECKPOINT,
                                 lambda: self._round(key))[0] != _EXECUTE:
                    return _AGAIN
                self._recovering = False
                self._catching_up, self._quick_deaths = [], {}
                self._resume_from_disk()
                return None
            # A replacement (or any rank while recovering) asks the survivors.
            if self._guarded(Kind.LOAD_CHECKPOINT, lambda: self._round(None))[0] == _SERVED:
                if self._resume_pending:
                    return _AGAIN       # learned in the round: resume with the others
                return None
            return _AGAIN

        self._until_done(step)
        self._start_epoch()
        return self._checkpoints.result(self._version, with_local)

    def _resume_from_disk(self) -> None:
        """A fresh start with a checkpoint folder: the ranks agree on the newest
        version on disk, load it and copy the local models to their ring
        replicas (Note [fresh start with a store]). Raises ``PeerFailure``
        if a rank is lost meanwhile."""
        self._guarded(Kind.LOAD_CHECKPOINT, self._load_durable)
        if self._version > 0:
            self._replicas.held = self._guarded(
                Kind.LOAD_CHECKPOINT,
                lambda: self._replicas.exchange(self._comm, self._checkpoints.local_blob))
        self._resume_pending = False

    def finalize(self) -> None:
        if not self._finalized and self._broken is None:
            self._before_call(self._seqno)
        try:
            super().finalize()
        finally:
            self._release_spares()

    def _release_spares(self) -> None:
        """The job is over for this rank: the spares need not wait for it."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.release()
            pool.free()

    def _finalize_sync(self) -> None:
        def execute() -> None:
            self._sync(Kind.FINALIZE, None)
            self._guarded(Kind.FINALIZE, lambda: self._comm.Agree(1), agreement=True)

        self._call(Kind.FINALIZE, (self._epoch, self._seqno), (Kind.FINALIZE,), execute,
                   None, None)

    # ------------------------------------------------------------ the protocol
    def _before_call(self, seqno: int) -> None:
        """Hook run at the start of every call (the mock kills here)."""

    def _next_key(self) -> Key:
        key = (self._epoch, self._seqno)
        self._before_call(key[1])
        return key

    def _start_epoch(self) -> None:
        """A checkpoint committed or the checkpoint was loaded: new numbering."""
        if self._epoch == BOOT or self._epoch != self._version:
            self._epoch = self._version
            self._seqno = 0
            self._cache.drop_epochs_before(self._version)

    def _call(self, kind: int, key: Key, signature: tuple, execute: Callable[[], Any],
              serve: Optional[Callable[[Entry], Any]], error: Optional[BaseException]) -> Any:
        """Run one call: normally, or by rounds while recovering."""

        def step() -> Any:
            if self._recovering:
                if error is not None:
                    raise error
                outcome, entry = self._guarded(kind, lambda: self._round(key))
                if outcome == _WAIT:
                    return _AGAIN
                if outcome == _SERVED:
                    self._seqno = key[1] + 1
                    if entry.signature != signature:
                        raise CollectiveMismatchError(
                            f"rank {self._rank}: after recovery, call #{key[1]} of version "
                            f"{self._version} is {Kind.NAMES.get(kind)} {signature[1:]} but "
                            f"the other ranks ran {Kind.NAMES.get(entry.kind)} "
                            f"{entry.signature[1:]}: the program must make the same calls on "
                            f"every run")
                    self._cache.put_entry(key, entry)
                    return serve(entry) if serve is not None else None
                self._recovering = False        # _EXECUTE: everyone is at this call
                self._catching_up, self._quick_deaths = [], {}   # everyone caught up
                if self.recovery_log and "resumed" not in self.recovery_log[-1]:
                    self.recovery_log[-1]["resumed"] = time.time()
            return execute()

        return self._until_done(step)

    def _until_done(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` until it returns something else than ``_AGAIN``. The
        one place where a lost peer (PeerFailure, from any MPI call of the
        step) is caught: the job is repaired (Note [repair]) and the step
        runs again, as a round of the recovery protocol or for real."""
        while True:
            try:
                result = step()
            except PeerFailure:
                self._recover()
                continue
            if result is not _AGAIN:
                return result

    def _round(self, key: Optional[Key]) -> Tuple[str, Optional[Entry]]:
        """One round of the recovery protocol; ``key`` None asks for the checkpoint."""
        comm = self._comm
        code = _LOAD if key is None else _code(key)
        version = self._version if self._has_version else _NO_VERSION
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
            raise self._give_up(RecoveryError("every rank of the job was lost: nothing to "
                                              "recover from"))
        if max_version != -int(summary[1]):
            raise self._give_up(RecoveryError(
                f"rank {self._rank}: the survivors hold different versions "
                f"({-int(summary[1])} to {max_version}) after a failure"))
        if min_code == _LOAD:
            self._serve_checkpoint(key is None, max_version)
            return (_SERVED if key is None else _WAIT), None
        wanted = _key(min_code)
        holder = comm.allreduce(self._rank if wanted in self._cache else -1, op=MPI.MAX)
        if holder >= 0:
            entry = comm.bcast(self._cache.get(wanted) if self._rank == holder else None,
                               root=holder)
            return (_SERVED, entry) if code == min_code else (_WAIT, None)
        if max_code != min_code:
            raise self._give_up(RecoveryError(
                f"rank {self._rank}: the result of call #{wanted[1]} of "
                f"{'the start-up calls' if wanted[0] == BOOT else f'version {wanted[0]}'} "
                f"is needed but no living rank holds it{self._cache.missing_hint()}"))
        if not self._has_version and max_version == 0:
            # A replacement that caught up with the survivors before anyone took
            # a checkpoint: there is nothing to load, it runs on like them.
            self._version, self._has_version = 0, True
        return _EXECUTE, None

    def _serve_checkpoint(self, requesting: bool, version: int) -> None:
        """Round step 2: give the requesters the committed checkpoint."""
        blob, mine = self._replicas.serve(
            self._comm, requesting, self._has_version, self._checkpoints,
            lambda owner: self._local_model_lost(owner, version))
        if requesting and not self._has_version:
            self._version = version
            self._checkpoints.commit(blob, mine)
            self._has_version = True
        # Give the replacements the replicas they were keeping for their neighbours.
        self._replicas.held = self._replicas.exchange(self._comm, self._checkpoints.local_blob)

    def _local_model_lost(self, owner: int, version: int) -> RecoveryError:
        return self._give_up(RecoveryError(
            f"rank {self._rank}: the local model of rank {owner} at version {version} is lost "
            f"with all its replicas (RABIT_REPLICAS={self._config.replicas}); the job must "
            f"restart from a durable checkpoint"))

    def _give_up(self, error: RecoveryError) -> RecoveryError:
        """The job cannot be recovered in place: this engine is unusable, and
        rabit-run is told whether a restart may help. Returns ``error``."""
        self._broken = self._broken or str(error)
        self._reporter.fatal(RESTART if error.restartable else BUG, str(error))
        return error

    def _crash_loop(self, dead: List[int]) -> Optional[RecoveryError]:
        """Note [crash loop]: the error that ends the job if a dead rank's
        replacements keep dying before they catch up, else None."""
        limit = self._config.crash_loop
        for rank in dead:
            deaths = self._quick_deaths.get(rank, 0) + 1 if rank in self._catching_up else 0
            if limit and deaths >= limit:
                return RecoveryError(
                    f"rank {rank} died {deaths} times in a row right after being replaced, "
                    f"each time before it caught up with the other ranks "
                    f"(RABIT_CRASH_LOOP={limit}). A fault does not repeat like that: the "
                    f"program itself ends or crashes there (os._exit, sys.exit or a signal in "
                    f"its start-up or in the calls since the last checkpoint), and every "
                    f"replacement repeats it. Ending the job; fix the program (a restart "
                    f"would repeat it too).", restartable=False)
        return None

    def _check_dead(self, shrunk: "MPI.Intracomm", dead: List[int]) -> None:
        """Before spawning replacements: fail at once if a dead rank's local
        model died with every rank that kept a replica of it, or if the dead
        ranks are in a crash loop (the same on every survivor)."""
        looping = self._crash_loop(dead)
        if looping is not None:
            raise self._give_up(looping)
        holdings = shrunk.allgather(self._replicas.holding(
            False, self._has_version, self._checkpoints.local_blob is not None))
        owner = Replicas.lost(holdings, dead)
        if owner is not None:
            raise self._local_model_lost(owner, self._version)

    # ------------------------------------------------------------ failures
    def _guarded(self, kind: int, fn: Callable[[], Any], agreement: bool = False) -> Any:
        """Run MPI work of the current call under the watchdog, with MPI errors
        turned into ``PeerFailure`` or a timeout, and its outcome trusted only
        if the communicator was not revoked meanwhile (Note [revoked
        success]); ``agreement``: ``fn`` is an ``Agree``, whose outcome is
        uniform even on a revoked communicator and must stand."""
        self._token = (kind, self._version, self._seqno)
        if self._watchdog is not None:
            self._watchdog.enter(self._token)
        try:
            result = fn()
            if not agreement:
                self._check_revoked()
            return result
        except MPI.Exception as exc:
            raise self._failure(exc) from exc
        except (RabitError, PeerFailure):
            raise
        except Exception as exc:
            # mpi4py unpickles inside its call: a half-filled message from a
            # revoked collective (Note [revoked success]) raises before
            # _check_revoked can run (seen: UnpicklingError: invalid load
            # key '\x00').
            if not agreement and self._ulfm and self._interrupted_by_failure():
                raise self._failure(MPI.Exception(_ERR_REVOKED)) from exc
            raise
        finally:
            self._leave()

    def _interrupted_by_failure(self, wait: float = 1.0) -> bool:
        """After a collective raised outside MPI (mpi4py unpickling half a
        message): whether a peer failed or the communicator was revoked. The
        revoke can come a moment after the call returned (seen in a storm:
        UnpicklingError on one rank at the disk resume, MPI_ERR_REVOKED on
        the others 11 ms later), so this waits up to ``wait`` s for either;
        only this error path pays it."""
        deadline = time.monotonic() + wait
        while True:
            if self._comm.Is_revoked():
                return True
            try:
                failed = self._comm.Get_failed()
                count = failed.Get_size()
                failed.Free()
            except MPI.Exception:
                return True
            if count > 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def _failure(self, exc: "MPI.Exception") -> BaseException:
        error_class = exc.Get_error_class()
        fired = self._watchdog is not None and self._watchdog.fired is not None
        if fired or error_class not in (_ERR_REVOKED, _ERR_PROC_FAILED):
            return super()._failure(exc)
        notice = self._notice(wait=0.05 if error_class == _ERR_REVOKED else 0.0)
        tag, sender = notice if notice is not None else (None, None)
        if tag == FATAL_NOTICE_TAG:
            self._broken = (f"rank {self._rank}: rank {sender} stopped the job with an uncaught "
                            f"exception (see its traceback); a replacement would repeat the "
                            f"bug, so the job is not recovered")
            error = RabitError(self._broken)
            error.secondary = True      # type: ignore[attr-defined] # that rank reports it
            return error
        if tag == TIMEOUT_NOTICE_TAG:
            return super()._failure(exc)
        if error_class == _ERR_PROC_FAILED:
            try:
                self._comm.Revoke()     # wake the ranks blocked in later calls
            except MPI.Exception:
                pass
        return PeerFailure(f"rank {self._rank}: a peer process failed "
                           f"({exc.Get_error_string()})", error_class)

    def _abort_repair(self, _: Any) -> None:
        """Deadline thread: the repair is stuck in MPI (Shrink, Spawn, Merge,
        a communicator's creation), where no revoke reaches: end the process
        so that the job ends (rabit-run ends the rest and restarts it)."""
        message = (f"rank {self._rank}: repairing the job after a failure did not complete "
                   f"within RABIT_RECOVERY_TIMEOUT={self._config.recovery_timeout:g} s (stuck "
                   f"in MPI); ending the job for a restart from the durable checkpoint")
        self._reporter.fatal(RESTART, message)
        sys.stderr.write(f"rabit_py: {message}; stuck in:\n{_main_thread_stack()}")
        sys.stderr.flush()
        abort_job(MPI.COMM_WORLD, self._reporter, fallback_s=2.0)

    def _peer_failed(self, failure: PeerFailure) -> BaseException:
        return failure

    def _duplicate_repaired(self, new: "MPI.Intracomm") -> Optional[Tuple[Any, Any]]:
        """The data and control communicators on a repaired one, or None if a
        rank died meanwhile (seen: a raw MPI error from Dup). Creating them
        is collective and may succeed on some ranks only: the ranks agree
        (uniformly, even with new failures) whether it worked everywhere."""
        comms: Optional[Tuple[Any, Any]] = None
        try:
            comms = duplicates(new)
        except MPI.Exception:
            pass
        try:
            agreed = bool(new.Agree(int(comms is not None)))
        except MPI.Exception:
            agreed = False
        if not agreed and comms is not None:
            for c in comms:
                try:
                    c.Free()
                except MPI.Exception:
                    pass
            comms = None
        return comms

    def _recovery_counts(self) -> Tuple[int, int]:
        return self._recoveries, sum(self._trials.values())

    def _spawning(self) -> List[int]:
        return list(self.repair_times.spawning)

    def _after_deaths(self, dead: List[int]) -> Tuple[List[int], Dict[int, int]]:
        """Note [crash loop] counters once ``dead`` are replaced."""
        quick = dict(self._quick_deaths)
        for rank in dead:
            quick[rank] = quick.get(rank, 0) + 1 if rank in self._catching_up else 0
        return sorted(set(self._catching_up) | set(dead)), quick

    def _recover(self) -> None:
        """Repair the communicator and enter recovery mode (Note [repair])."""
        self._recoveries += 1
        give_up = None
        if self._recoveries > self._config.max_recoveries:
            give_up = (f"rank {self._rank}: {self._recoveries - 1} recoveries already in this "
                       f"job (RABIT_MAX_RECOVERIES={self._config.max_recoveries}); giving up")
            if self._pool is None:
                raise self._give_up(RecoveryError(give_up))
            # With spares, they are waiting to rebuild: they must hear it too.
        start = time.perf_counter()
        self.recovery_log.append({"detected": time.time()})

        def make_state(dead: List[int]) -> JoinState:
            trials = dict(self._trials)
            for rank in dead:
                trials[rank] = trials.get(rank, 0) + 1
            catching_up, quick = self._after_deaths(dead)
            return JoinState(dead=dead, trials=trials, recoveries=self._recoveries,
                             catching_up=catching_up, quick_deaths=quick,
                             settings=dataclasses.asdict(self._config))

        if self._watchdog is not None:
            self._watchdog.leave()
        # A repair blocks in Shrink/Spawn/Merge, which no revoke can interrupt:
        # if it hangs past the recovery timeout, end the job instead.
        self._repairing = True
        replaced: List[int] = []
        broken, old = self._comm, (self._comm, self._ctrl)
        try:
            with deadline(self._config.recovery_timeout, self._abort_repair, "repair"):
                while True:
                    new, now = repair(broken, self._rank, self._size, make_state,
                                      self.repair_times, check_dead=self._check_dead,
                                      pool=self._pool, give_up=give_up)
                    replaced += now
                    for rank in now:
                        self._trials[rank] = self._trials.get(rank, 0) + 1
                    self._catching_up, self._quick_deaths = self._after_deaths(now)
                    comms = self._duplicate_repaired(new)
                    if comms is not None:
                        break
                    broken = new    # a rank died right after the repair: again
        except RecoveryError as exc:
            raise self._give_up(exc)
        finally:
            self._repairing = False
            self.repair_times.spawning = []
        self._use(*comms)
        self._membership += 1
        for c in old + (new,):
            try:
                c.Free()
            except MPI.Exception:
                pass
        self._recovering = True
        self._header_sent = None
        self.recovery_log[-1].update(repaired=time.time(), replaced=replaced)
        log.warning("rank %d: replaced rank(s) %s in %.2f s; replaying", self._rank,
                    replaced, time.perf_counter() - start)


def _main_thread_stack() -> str:
    """Where the main thread is (for a message about a stuck repair)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return "".join(traceback.format_stack(frame, limit=8)) if frame is not None else ""
