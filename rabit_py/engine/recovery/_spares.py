"""Hot spares: processes started with the job that wait to replace a dead rank.

# Note [spares]
With ``RABIT_SPARES=k`` (``rabit-run --spares k``) the job is started with
``n + k`` processes; the last ``k`` of ``MPI.COMM_WORLD`` are spares. Every
process keeps a *pool* communicator (all workers and spares); the workers run
the job on a ``Split`` of it. A spare stays inside ``init()``: its program is
imported and MPI is initialized, so when a rank dies it takes the dead rank's
number without the cost of spawning (a new interpreter, imports, MPI_Init:
about 0.2 s of a 0.4 s recovery on the machine measured).

A spare waits on one receive per worker (``RELEASE_TAG``). A receive from a
process that dies fails (ULFM raises ``MPI_ERR_PROC_FAILED`` for a named
source known dead), which wakes the spare at the same time as the survivors.
Then every living pool member *rebuilds* together:

1. ``Shrink`` the pool; allgather every member's job rank (-1 for spares):
   the job ranks missing are the dead ones;
2. the member with the smallest job rank (the leader) broadcasts the join
   state (which ranks are replaced, the recovery counters, or why the job
   cannot be recovered, in which case everyone raises ``RecoveryError``);
3. the first spares take the dead ranks in order; if there are fewer spares
   than dead ranks, the rest are spawned (from the pool, so that they join
   it: the spawned processes merge in and are pool members from then on);
4. ``Split`` of the pool: workers keyed by job rank; spares left over get no
   communicator and go back to waiting on the rebuilt pool;
5. ``Agree`` on the rebuilt pool, so that the rebuild succeeded everywhere or
   is started again everywhere (another failure on the way).

At a clean finalize every worker sends each spare a release message; a spare
that gets one leaves: ``init()`` ends the process with status 0 (code
before ``init()`` runs on spares too; nothing after it does).

# Note [spare refill]
Once the spares are used up, every further failure costs a spawn (a new
interpreter, imports, MPI_Init: 0.6-0.9 s here with two busy loops beside
the job), and a rank that dies *during* a spawn wedges it in Open MPI (the
survivors wait until RABIT_RECOVERY_TIMEOUT). So a rebuild that has to spawn
anyway spawns the job's number of spares more (``target``), which join the
pool as spares (role -1 in ``JoinState.spawned``): the next failure is served
at once again, and in a burst only about every other failure needs a spawn.
A rebuild served by spares alone spawns nothing (that would put a spawn's
cost and risk on every failure).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .._mpistart import MPI

from ..._status import RESTART, Reporter
from ...config import Config
from ...errors import RecoveryError
from .. import _control as control
from ._join import (JoinState, RepairTimes, Replacer, free_comm, is_replacement,
                    spawn_and_merge, until_repaired)
from .._lifecycle import abort_job
from .._tags import RELEASE_TAG
from .._watchdog import deadline

__all__ = ["SparePool", "RELEASE_TAG", "serve_as_spare", "spare_reporter"]

log = logging.getLogger("rabit_py")

_POLL_SECONDS = 0.002


@dataclasses.dataclass
class _Rebuilt:
    pool: "MPI.Intracomm"
    roles: List[int]
    work: Optional["MPI.Intracomm"]
    job_rank: int
    state: Optional[JoinState] = None


class SparePool(Replacer):
    """The pool communicator of workers and spares (Note [spares]).

    Args:
        pool: a communicator of every worker and spare (``errhandler`` set to
            return errors); the pool takes ownership.
        roles: each pool member's job rank, -1 for a spare.
        target: the job's number of spares, restored when a rebuild has to
            spawn (Note [spare refill]).
    """

    def __init__(self, pool: "MPI.Intracomm", roles: List[int], target: int = 0) -> None:
        self.pool = pool
        self.roles = roles
        self.target = target
        self._pending_boxes: List[np.ndarray] = []

    @classmethod
    def start(cls, spares: int) -> Tuple["SparePool", Optional["MPI.Intracomm"]]:
        """At start-up, on every process of ``MPI.COMM_WORLD``: the pool, and
        the workers' communicator (None on a spare).

        Raises:
            ValueError: ``spares`` leaves no worker.
        """
        world = MPI.COMM_WORLD
        size = world.Get_size()
        if spares >= size:
            raise ValueError(f"spares={spares} but the job has only {size} process(es): "
                             f"start it with more (rabit-run -n N --spares {spares} starts "
                             f"N + {spares})")
        workers = size - spares
        pool = world.Dup()
        pool.Set_errhandler(MPI.ERRORS_RETURN)
        roles = list(range(workers)) + [-1] * spares
        return cls(pool, roles, spares), _work_comm(pool, roles[pool.Get_rank()])

    # ------------------------------------------------------------ spare side
    def rebuild_as_spare(self) -> Optional[Tuple["MPI.Intracomm", int, JoinState]]:
        """On a spare, after a worker died: rebuild with the others. Returns
        (job communicator, job rank, join state) when this spare took a dead
        rank's place, None when it stays a spare.

        Raises:
            RecoveryError: the job cannot be recovered (the message says why).
        """
        times = RepairTimes()
        # The workers' attempts are those of _repair.repair, one _attempt
        # each; a spare has no job communicator to shrink, only the pool.
        rebuilt = until_repaired(lambda _: self._attempt(-1, 0, None, None, times),
                                 f"spare (pool rank {self.pool.Get_rank()})", times)
        if rebuilt.work is None:
            return None
        return rebuilt.work, rebuilt.job_rank, rebuilt.state

    def wait_for_failure(self) -> bool:
        """On a spare: block until a worker dies (True: rebuild next) or the
        job ends (False: this spare was released)."""
        me = self.pool.Get_rank()
        # Buffer messages: mpi4py's pickled irecv unpickles into a buffer of
        # its own (Note [sealed messages] in _control.py).
        boxes = {src: np.zeros(1, dtype=np.int64)
                 for src, role in enumerate(self.roles) if role >= 0 and src != me}
        requests = {src: self.pool.Irecv(box, source=src, tag=RELEASE_TAG)
                    for src, box in boxes.items()}
        released = False
        try:
            # Note [release every worker]
            # A spare waits for the release of
            # *every* worker, not the first one. A receive cancelled here
            # whose message then arrives makes MPI_Finalize hang in Open MPI
            # 5 (a plain mpi4py program with --with-ft ulfm: 8 of 8 runs
            # hung; waiting for all: 8 of 8 exited in 0.4 s).
            while requests:
                for src, request in list(requests.items()):
                    try:
                        done = request.Test()
                    except MPI.Exception:
                        del requests[src]
                        log.debug("spare %d: worker at pool rank %d failed", me, src)
                        if not released:
                            return True
                        continue    # the job had finished: a late death changes nothing
                    if done:
                        del requests[src]
                        released = True
                if requests:
                    time.sleep(_POLL_SECONDS)
            return not released
        finally:
            for request in requests.values():
                try:
                    request.Cancel()
                    request.Free()
                except Exception:  # noqa: BLE001 - a receive from a dead process
                    pass
            # A freed receive may still be completed by MPI: its buffer lives
            # as long as the pool.
            self._pending_boxes.extend(boxes.values())

    # ------------------------------------------------------------ worker side
    def replace(self, shrunk: "MPI.Intracomm", my_rank: int, size: int, dead: List[int],
                make_state: Callable[[List[int]], JoinState], times: RepairTimes,
                check_dead: Optional[Callable[["MPI.Intracomm", List[int]], None]],
                give_up: Optional[str]) -> Tuple["MPI.Intracomm", List[int]]:
        """One attempt of the survivors' repair (``_repair.repair``): rebuild
        with the spares (Note [spares]); ``give_up`` or what ``check_dead``
        raises is told to the spares first, then raised."""
        lost, lost_error = give_up, None
        if lost is None and check_dead is not None:
            try:
                check_dead(shrunk, dead)
            except RecoveryError as exc:
                lost, lost_error = str(exc), exc      # the spares must hear it too
        try:
            rebuilt = self._attempt(my_rank, size, make_state, lost, times)
        except RecoveryError:
            if lost_error is not None:
                raise lost_error from None      # with its restartable flag
            raise
        assert rebuilt.work is not None and rebuilt.state is not None
        free_comm(shrunk)
        return rebuilt.work, rebuilt.state.dead

    def release(self) -> None:
        """At a clean finalize: tell every spare that the job is over."""
        me = self.pool.Get_rank()
        for dest, role in enumerate(self.roles):
            if role < 0 and dest != me:
                try:
                    self.pool.Send(np.ones(1, dtype=np.int64), dest=dest, tag=RELEASE_TAG)
                except MPI.Exception:
                    pass                # a dead spare needs no release

    def free(self) -> None:
        free_comm(self.pool)

    # ------------------------------------------------------------ both
    def _attempt(self, job_rank: int, size: int, make_state: Any, lost: Optional[str],
                 times: RepairTimes) -> _Rebuilt:
        """One rebuild (Note [spares]); the pool is the rebuilt one after it.
        On another failure the pool is revoked, so that every member leaves
        the attempt and starts over, and ``MPI.Exception`` raised."""
        try:
            rebuilt = self._rebuild(job_rank, size, make_state, lost, times)
        except MPI.Exception:
            # Every member leaves the attempt, and until_repaired starts over.
            try:
                self.pool.Revoke()
            except MPI.Exception:
                pass
            raise
        old, self.pool, self.roles = self.pool, rebuilt.pool, rebuilt.roles
        if old is not self.pool:
            free_comm(old)
        return rebuilt

    def _rebuild(self, job_rank: int, size: int, make_state: Any, lost: Optional[str],
                 times: RepairTimes) -> _Rebuilt:
        t0 = time.perf_counter()
        shrunk = self.pool.Shrink()
        shrunk.Set_errhandler(MPI.ERRORS_RETURN)
        try:
            gathered = control.allgather(shrunk, (job_rank, size, lost, self.target),
                                        "spares.members")
            roles = [g[0] for g in gathered]
            workers = [i for i, r in enumerate(roles) if r >= 0]
            if not workers:
                raise RecoveryError("every worker of the job was lost: the spares have "
                                    "nothing to recover from")
            leader = min(workers, key=lambda i: roles[i])
            size = gathered[leader][1]
            dead = sorted(set(range(size)) - set(roles))
            # The leader is a worker: it has make_state (spares pass None).
            state: JoinState = control.bcast(
                shrunk, make_state(dead) if shrunk.Get_rank() == leader else None, leader,
                "spares.join_state")
            times.shrink += time.perf_counter() - t0
            reason = next((g[2] for g in gathered if g[2]), None)
            if reason:
                raise RecoveryError(reason)
            spares = [i for i, r in enumerate(roles) if r < 0]
            taken = dict(zip(spares, state.dead))
            spawned = state.dead[len(spares):]
            pool = shrunk
            if spawned:
                # Note [spare refill]: the leader's target decides (a spare's is 0).
                # Every rank this repair replaces, spares' included: one that a
                # spare takes over died before the shrink and cannot wedge the
                # spawn (Note [stuck spawn]).
                spawned = spawned + [-1] * gathered[leader][3]
                pool = spawn_and_merge(shrunk, len(spawned), leader,
                                       dataclasses.replace(state, spawned=spawned), times,
                                       state.dead)
                times.spawning = []
            t0 = time.perf_counter()
            me = shrunk.Get_rank()
            new_rank = job_rank if job_rank >= 0 else taken.get(me, -1)
            rebuilt = self._split(pool, new_rank, state)
            if pool is not shrunk:
                free_comm(shrunk)
            times.merge += time.perf_counter() - t0
            return rebuilt
        except BaseException:
            if self.pool is not shrunk:
                self.pool = shrunk      # retry from the shrunk pool
            raise

    @staticmethod
    def _split(pool: "MPI.Intracomm", job_rank: int,
               state: Optional[JoinState] = None) -> _Rebuilt:
        """Steps 4 and 5 of Note [spares]; also run by spawned replacements."""
        work = _work_comm(pool, job_rank)
        roles = control.allgather(pool, job_rank, "spares.roles")
        pool.Agree(1)
        return _Rebuilt(pool, roles, work, job_rank, state)


def _work_comm(pool: "MPI.Intracomm", job_rank: int) -> Optional["MPI.Intracomm"]:
    """The workers' communicator, ranked by job rank (collective on the
    pool); None on a spare (``job_rank`` -1)."""
    work = pool.Split(0 if job_rank >= 0 else MPI.UNDEFINED, key=max(job_rank, 0))
    if work == MPI.COMM_NULL:
        return None
    work.Set_errhandler(MPI.ERRORS_RETURN)
    return work


def join_pool_as_spawned(merged: "MPI.Intracomm", my_rank: int
                         ) -> Tuple[Optional["MPI.Intracomm"], SparePool]:
    """A process spawned by a pool rebuild: finish the rebuild with the pool
    (split, roles, agreement) and keep the pool. ``my_rank`` -1: spawned as a
    new spare (Note [spare refill]); it gets no job communicator (None)."""
    rebuilt = SparePool._split(merged, my_rank)
    return rebuilt.work, SparePool(rebuilt.pool, rebuilt.roles)


def exit_released(rank_in_pool: int) -> None:
    """A spare that the job did not need: leave without running the program."""
    log.info("spare (pool rank %d): the job ended without needing this spare; exiting",
             rank_in_pool)
    sys.exit(0)


def serve_as_spare(pool: SparePool, config: Config) -> Tuple[Any, JoinState]:
    """A spare's life inside ``init()`` (Note [spares] in ``_spares.py``): wait;
    after a worker died, rebuild with the survivors; return (job
    communicator, join state) once this spare took a dead rank's place. A
    released spare, or one told that the job is lost, ends the process."""
    me = pool.pool.Get_rank()
    log.debug("spare (pool rank %d): waiting to replace a failed rank", me)
    while True:
        if not pool.wait_for_failure():
            pool.free()
            exit_released(me)
        # Like a survivor's repair, a rebuild that hangs must not hang the job.
        try:
            with deadline(config.recovery_timeout,
                          lambda _: _abort_spare(me, config), "rebuild"):
                joined = pool.rebuild_as_spare()
        except RecoveryError as exc:
            sys.stderr.write(f"rabit_py: spare (pool rank {me}): the job cannot be recovered "
                             f"({exc}); this spare ends\n")
            sys.stderr.flush()
            sys.stdout.flush()
            # Not sys.exit: MPI_Finalize can block for good once a peer died
            # without finalizing. And status 0: mpirun ends the whole job at
            # the second non-zero exit, which would cut short the workers
            # (still reporting the error, or saving what they can); the
            # workers' own status tells how the job ended.
            os._exit(0)
        if joined is not None:
            comm, rank, state = joined
            log.info("spare (pool rank %d): took the place of rank %d", me, rank)
            return comm, state


def spare_reporter(config: Config) -> Reporter:
    if is_replacement():    # a spawned spare: its world is the spawn's, named by PID
        return Reporter(config.run_status_dir, f"spare-p{os.getpid()}")
    return Reporter(config.run_status_dir, f"spare-{MPI.COMM_WORLD.Get_rank()}")


def _abort_spare(me: int, config: Config) -> None:
    message = (f"spare (pool rank {me}): rebuilding the job after a failure did not complete "
               f"within RABIT_RECOVERY_TIMEOUT={config.recovery_timeout:g} s (stuck in MPI); "
               f"ending the job for a restart from the durable checkpoint")
    reporter = spare_reporter(config)
    reporter.fatal(RESTART, message)
    sys.stderr.write(f"rabit_py: {message}\n")
    sys.stderr.flush()
    abort_job(MPI.COMM_WORLD, reporter, fallback_s=2.0)
