"""The robust engine's side of a recovery: the job's recovery counters, the
decision to give up, and the repair of its communicators around
:func:`~rabit_py.engine._repair.repair` (Note [repair] in ``_repair.py``; the
rounds that follow it are in ``robust.py``, Note [robust protocol]).

# Note [crash loop]
A fault does not strike the same rank at the same point again and again; a
program that ends itself there does (``os._exit``, ``sys.exit`` or a signal
in its start-up or since the last checkpoint). So each rank keeps, for the
ranks replaced since the ranks last ran a call together (``catching_up``:
their replacements have not caught up yet), how many times in a row each
died before catching up (``quick_deaths``); the counters travel to the
replacements in the join state. At ``RABIT_CRASH_LOOP`` deaths in a row the
job ends with a ``RecoveryError`` that is not restartable.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from .._mpistart import MPI

from ..._status import BUG, RESTART
from ...config import Config
from ...errors import RecoveryError
from .. import _control as control
from .._frame import CallFrame
from ._join import JoinState, RepairTimes, Replacer, free_comm
from .._lifecycle import abort_job
from ._repair import SpawnReplacer, repair
from ._replicas import Replicas
from ._spares import SparePool
from .._startup import duplicates
from .._watchdog import deadline

__all__ = ["Recovery"]

log = logging.getLogger("rabit_py")


class Recovery:
    """The recovery state of one rank of a robust job, and its repairs.

    Args:
        frame: the engine's call frame (communicators, rank, version, reporter).
        config: the job's settings.
        replicas: the ring replicas of the local models (checked before a
            repair spawns anything).
        state: what the survivors sent when this process joined as a
            replacement or spare, else None.
        pool: the job's spare pool, or None without spares.

    Fields:
        trials: rank -> times it has been replaced in this job.
        trial: times this rank has been replaced (0: the original process).
        recoveries: in-job recoveries so far.
        repair_times: the timings of the last repair (for the benchmark).
        log: wall-clock times of each recovery on this rank (failure
            detected, communicators repaired, replay done).
    """

    def __init__(self, frame: CallFrame, config: Config, replicas: Replicas,
                 state: Optional[JoinState], pool: Optional[SparePool]) -> None:
        self.frame = frame
        self.config = config
        self.replicas = replicas
        self.pool = pool
        self.trials: Dict[int, int] = dict(state.trials) if state else {}
        self.trial = self.trials.get(frame.rank, 0)
        self.recoveries = state.recoveries if state else 0
        # Note [crash loop].
        self.catching_up: List[int] = list(state.catching_up) if state else []
        self.quick_deaths: Dict[int, int] = dict(state.quick_deaths) if state else {}
        self.repair_times = RepairTimes()
        self.repairing = False
        self.gave_up = False        # the last repair ended the job: not a recovery
        self.log: List[Dict[str, Any]] = []

    def status(self) -> Tuple[bool, List[int], int, int]:
        """(repairing now, ranks a spawn under way replaces, recoveries, processes
        replaced).
        A repair that ended the job (``RecoveryError``) is not counted as a
        recovery: rabit-run's summary counts the ones that recovered."""
        spawning = list(self.repair_times.spawning) if self.repairing else []
        done = max(0, self.recoveries - (1 if self.gave_up else 0))
        return self.repairing, spawning, done, sum(self.trials.values())

    def caught_up(self) -> None:
        """Every rank runs the same call again: the replacements caught up."""
        self.catching_up, self.quick_deaths = [], {}
        if self.log and "resumed" not in self.log[-1]:
            self.log[-1]["resumed"] = time.time()

    def give_up(self, error: RecoveryError) -> RecoveryError:
        """The job cannot be recovered in place: the engine is unusable, and
        rabit-run is told whether a restart may help. Returns ``error``."""
        self.frame.broken = self.frame.broken or str(error)
        self.gave_up = True
        self.frame.reporter.fatal(RESTART if error.restartable else BUG, str(error))
        return error

    def local_model_lost(self, owner: int, version: int) -> RecoveryError:
        """The error that ends the job when rank ``owner``'s local model of
        ``version`` died with every replica of it."""
        return self.give_up(RecoveryError(
            f"rank {self.frame.rank}: the local model of rank {owner} at version {version} is "
            f"lost with all its replicas (RABIT_REPLICAS={self.config.replicas}); the job must "
            f"restart from a durable checkpoint"))

    def release_spares(self) -> None:
        """The job is over for this rank: the spares need not wait for it."""
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.release()
            pool.free()

    @property
    def replacer(self) -> Replacer:
        """Who gives dead ranks new processes: the spare pool, else spawns."""
        return self.pool if self.pool is not None else SpawnReplacer()

    def repair(self, has_version: bool, has_local: bool) -> Tuple[Any, Any]:
        """Replace the dead ranks (Note [repair]); returns the new data and
        control communicators (the old ones are freed). ``has_version``,
        ``has_local``: whether this rank holds the committed version and a
        local model (what its replicas can give).

        Raises:
            RecoveryError: the job cannot be recovered in place (too many
                recoveries, a crash loop, a local model lost, the repair
                failing again and again); rabit-run has been told.
        """
        frame, config = self.frame, self.config
        self.recoveries += 1
        give_up = None
        if self.recoveries > config.max_recoveries:
            give_up = (f"rank {frame.rank}: a peer was lost, and "
                       + ("in-job recovery is off" if config.max_recoveries == 0 else
                          f"the job was recovered {self.recoveries - 1} time(s) already")
                       + f" (RABIT_MAX_RECOVERIES={config.max_recoveries}): the job ends "
                       f"(rabit-run --max-restarts with a checkpoint folder restarts it "
                       f"from disk)")
            if self.pool is None:
                raise self.give_up(RecoveryError(give_up))
            # With spares, they are waiting to rebuild: they must hear it too.
        start = time.perf_counter()
        self.log.append({"detected": time.time()})
        if frame.watchdog is not None:
            frame.watchdog.leave()

        def check_dead(shrunk: "MPI.Intracomm", dead: List[int]) -> None:
            self._check_dead(shrunk, dead, has_version, has_local)

        # A repair blocks in Shrink/Spawn/Merge, which no revoke can interrupt:
        # if it hangs past the recovery timeout, end the job instead.
        self.repairing = True
        replaced: List[int] = []
        broken, old = frame.comm, (frame.comm, frame.ctrl)
        try:
            with deadline(config.recovery_timeout, self._abort_repair, "repair"):
                while True:
                    new, now = repair(broken, frame.rank, frame.size, self._join_state,
                                      self.repair_times, self.replacer,
                                      check_dead=check_dead, give_up=give_up)
                    replaced += now
                    for rank in now:
                        self.trials[rank] = self.trials.get(rank, 0) + 1
                    self.catching_up, self.quick_deaths = self._after_deaths(now)
                    comms = _duplicate_repaired(new)
                    if comms is not None:
                        break
                    broken = new    # a rank died right after the repair: again
        except RecoveryError as exc:
            raise self.give_up(exc)
        finally:
            self.repairing = False
            self.repair_times.spawning = []
        for c in old + (new,):
            free_comm(c)
        self.log[-1].update(repaired=time.time(), replaced=replaced)
        log.warning("rank %d: replaced rank(s) %s in %.2f s; replaying", frame.rank,
                    replaced, time.perf_counter() - start)
        return comms

    def _join_state(self, dead: List[int]) -> JoinState:
        """What survivor 0 tells the replacements of ``dead``."""
        trials = dict(self.trials)
        for rank in dead:
            trials[rank] = trials.get(rank, 0) + 1
        catching_up, quick = self._after_deaths(dead)
        return JoinState(dead=dead, trials=trials, recoveries=self.recoveries,
                         catching_up=catching_up, quick_deaths=quick,
                         settings=dataclasses.asdict(self.config))

    def _after_deaths(self, dead: List[int]) -> Tuple[List[int], Dict[int, int]]:
        """Note [crash loop] counters once ``dead`` are replaced."""
        quick = dict(self.quick_deaths)
        for rank in dead:
            quick[rank] = quick.get(rank, 0) + 1 if rank in self.catching_up else 0
        return sorted(set(self.catching_up) | set(dead)), quick

    def _crash_loop(self, dead: List[int]) -> Optional[RecoveryError]:
        """Note [crash loop]: the error that ends the job if a dead rank's
        replacements keep dying before they catch up, else None."""
        limit = self.config.crash_loop
        for rank in dead:
            deaths = self.quick_deaths.get(rank, 0) + 1 if rank in self.catching_up else 0
            if limit and deaths >= limit:
                return RecoveryError(
                    f"rank {rank} died {deaths} times in a row right after being replaced, "
                    f"each time before it caught up with the other ranks "
                    f"(RABIT_CRASH_LOOP={limit}). A fault does not repeat like that: the "
                    f"program itself ends, crashes or hangs there (os._exit, sys.exit, a "
                    f"signal, or a hang that rabit-run ended, in its start-up or in the calls "
                    f"since the last checkpoint), and every replacement repeats it. Ending the "
                    f"job; fix the program (a restart would repeat it too)",
                    restartable=False)
        return None

    def _check_dead(self, shrunk: "MPI.Intracomm", dead: List[int], has_version: bool,
                    has_local: bool) -> None:
        """Before spawning replacements: fail at once if a dead rank's local
        model died with every rank that kept a replica of it, or if the dead
        ranks are in a crash loop (the same on every survivor)."""
        looping = self._crash_loop(dead)
        if looping is not None:
            raise self.give_up(looping)
        holdings = control.allgather(shrunk, self.replicas.holding(False, has_version, has_local),
                                     "repair.holdings")
        owner = Replicas.lost(holdings, dead)
        if owner is not None:
            raise self.local_model_lost(owner, self.frame.version)

    def _abort_repair(self, _: Any) -> None:
        """Deadline thread: the repair is stuck in MPI (Shrink, Spawn, Merge,
        a communicator's creation), where no revoke reaches: end the process
        so that the job ends (rabit-run ends the rest and restarts it)."""
        message = (f"rank {self.frame.rank}: repairing the job after a failure did not "
                   f"complete within RABIT_RECOVERY_TIMEOUT={self.config.recovery_timeout:g} s "
                   f"(stuck in MPI); ending the job for a restart from the durable checkpoint")
        self.frame.reporter.fatal(RESTART, message)
        sys.stderr.write(f"rabit_py: {message}; stuck in:\n{_main_thread_stack()}")
        sys.stderr.flush()
        abort_job(MPI.COMM_WORLD, self.frame.reporter, fallback_s=2.0)


def _duplicate_repaired(new: "MPI.Intracomm") -> Optional[Tuple[Any, Any]]:
    """The data and control communicators on a repaired one, or None if a
    rank died meanwhile (``Dup`` then raises a raw MPI error). Creating them is
    collective and may succeed on some ranks only: the ranks agree
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
            free_comm(c)
        comms = None
    return comms


def _main_thread_stack() -> str:
    """Where the main thread is (for a message about a stuck repair)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return "".join(traceback.format_stack(frame, limit=8)) if frame is not None else ""
