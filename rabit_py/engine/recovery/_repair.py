"""Repairing a communicator after failures, with ULFM (see shared/notes/ulfm.md).

# Note [repair]
Survivors: revoke the broken communicator (so that every rank leaves its
blocked call), shrink it to the living, learn which ranks died, spawn one
replacement per dead rank running the same program, merge, and split with the
old rank numbers as keys, so each replacement gets the number of the rank it
replaces and the world size is restored. Before spawning, the survivors check
together (``check_dead``) that what the dead ranks need can be recovered at
all, so that no replacement is started for a job that is lost anyway. Any MPI
error on the way (another rank died) starts the repair again from the
communicator in hand.

Who gives the dead ranks new processes is the repair's ``Replacer``
(``_join.py``): spawned ones (``SpawnReplacer``, above) or the job's spares
(``SparePool``, Note [spares] in ``_spares.py``). Either way each attempt of
:func:`repair` revokes, shrinks, finds the dead and asks the replacer; a
spare, which has no job communicator to shrink, runs the pool's side of the
same attempts. Both are retried by one loop (``_join.until_repaired``), and
new processes are spawned and merged in by one function
(``_join.spawn_and_merge``).

Replacements: ``MPI.Comm.Get_parent()`` is not null; they merge with the
survivors, receive the job's state (which ranks they replace and the
the recovery counters) from survivor 0, and split like the survivors. A
replacement that fails while joining kills itself (SIGKILL), so that the
survivors see a dead rank and replace it again instead of waiting.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, List, Optional, Tuple

from .._mpistart import MPI

from ...errors import RecoveryError
from .. import _control as control
from .._lifecycle import kill_self
from ._join import (JoinState, RepairTimes, Replacer, free_comm, join_spawner, spawn_and_merge,
                    until_repaired)
from ._spares import join_pool_as_spawned

__all__ = ["repair", "SpawnReplacer", "join_as_replacement"]

log = logging.getLogger("rabit_py")


def repair(comm: "MPI.Intracomm", my_rank: int, size: int,
           make_state: Any, times: RepairTimes, replacer: Replacer, max_attempts: int = 10,
           check_dead: Optional[Callable[["MPI.Intracomm", List[int]], None]] = None,
           give_up: Optional[str] = None) -> Tuple["MPI.Intracomm", List[int]]:
    """Survivor side of Note [repair]: the one repair loop.

    Args:
        comm: the broken communicator (ranks numbered as in the job).
        my_rank: this process's rank in the job.
        size: the job's world size.
        make_state: ``make_state(dead) -> JoinState`` on survivor 0.
        times: filled with the time of each step.
        replacer: who gives the dead ranks new processes (spawned ones, or
            the job's spare pool: Note [spares]).
        check_dead: ``check_dead(shrunk, dead)``, called by every survivor
            (collectively on the shrunk communicator) before replacing;
            raises ``RecoveryError`` when the dead ranks cannot be recovered.
        give_up: a reason not to recover (whoever waits to replace is told
            it before everyone raises ``RecoveryError``).

    Returns:
        The repaired communicator (size ``size``, this process at ``my_rank``)
        and the ranks that were replaced.

    Raises:
        RecoveryError: the repair failed ``max_attempts`` times in a row, or
            ``check_dead`` found the dead ranks unrecoverable.
    """
    current = comm

    def attempt(n: int) -> Tuple["MPI.Intracomm", List[int]]:
        nonlocal current
        try:
            current.Revoke()
        except MPI.Exception:
            pass
        t0 = time.perf_counter()
        log.debug("rank %d: repair attempt %d: shrinking", my_rank, n)
        shrunk = current.Shrink()
        shrunk.Set_errhandler(MPI.ERRORS_RETURN)
        current = shrunk            # another failure: start over from it
        alive = control.allgather(shrunk, my_rank, "repair.alive")
        dead = sorted(set(range(size)) - set(alive))
        times.shrink += time.perf_counter() - t0
        if not dead:
            # Revoked without a death (e.g. a timeout elsewhere): same members.
            new = shrunk.Split(0, key=my_rank)
            new.Set_errhandler(MPI.ERRORS_RETURN)
            shrunk.Free()
            return new, []
        log.debug("rank %d: dead ranks %s; replacing", my_rank, dead)
        return replacer.replace(shrunk, my_rank, size, dead, make_state, times,
                                check_dead, give_up)

    return until_repaired(attempt, f"rank {my_rank}", times, max_attempts)


class SpawnReplacer(Replacer):
    """Dead ranks replaced by processes spawned for them (Note [repair])."""

    def replace(self, shrunk: "MPI.Intracomm", my_rank: int, size: int, dead: List[int],
                make_state: Callable[[List[int]], JoinState], times: RepairTimes,
                check_dead: Optional[Callable[["MPI.Intracomm", List[int]], None]],
                give_up: Optional[str]) -> Tuple["MPI.Intracomm", List[int]]:
        if give_up is not None:
            raise RecoveryError(give_up)
        if check_dead is not None:
            check_dead(shrunk, dead)
        merged = spawn_and_merge(shrunk, len(dead), 0,
                                 make_state(dead) if shrunk.Get_rank() == 0 else None, times,
                                 dead)
        t0 = time.perf_counter()
        new = merged.Split(0, key=my_rank)
        new.Set_errhandler(MPI.ERRORS_RETURN)
        times.merge += time.perf_counter() - t0
        times.spawning = []
        if new.Get_size() != size or new.Get_rank() != my_rank:
            raise RecoveryError(f"rank {my_rank}: the repaired communicator has size "
                                f"{new.Get_size()} and puts this process at rank "
                                f"{new.Get_rank()}")
        for c in (merged, shrunk):
            free_comm(c)
        return new, list(dead)


def join_as_replacement(timeout: float = 0.0
                        ) -> Tuple[Optional["MPI.Intracomm"], int, JoinState, Any]:
    """Replacement side of Note [repair].

    Args:
        timeout: seconds joining may take (0: no limit). Joining blocks in
            MPI (merge, split), where nothing can interrupt it: it can stay
            in ``PMIx_Get`` for good when a survivor dies during the join. Past the
            timeout the process ends itself (SIGKILL), as after an error.

    Returns:
        The job's communicator, this process's rank in it, the join state, and
        the job's spare pool (None when the job has no spares). A process
        spawned as a new spare (Note [spare refill] in ``_spares.py``) gets
        no communicator (None) and rank -1.
    """
    from .._watchdog import deadline

    with deadline(timeout, lambda _: _end_replacement(f"joining did not complete within "
                                                      f"{timeout:g} s"), "join"):
        return _join()


def _end_replacement(why: str) -> None:
    kill_self(f"rabit_py: a replacement could not join the job ({why}); ending it so "
              f"that the survivors replace it again")


def _join() -> Tuple[Optional["MPI.Intracomm"], int, JoinState, Any]:
    try:
        joined = join_spawner()
        if joined is None:
            kill_self("rabit_py: a replacement is not needed: the repair that started it "
                      "failed before it could join (the survivors repair again); ending it")
        merged, before = joined  # type: ignore[misc]
        state: JoinState = control.bcast(merged, None, 0, "repair.join_state")
        index = merged.Get_rank() - before
        if state.spawned is not None:
            my_rank = state.spawned[index]
            comm, pool = join_pool_as_spawned(merged, my_rank)
            return comm, my_rank, state, pool
        my_rank = state.dead[index]
        comm = merged.Split(0, key=my_rank)
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        free_comm(merged)
        return comm, my_rank, state, None
    except MPI.Exception as exc:
        _end_replacement(str(exc))
        raise  # unreachable
