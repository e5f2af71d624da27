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

Replacements: ``MPI.Comm.Get_parent()`` is not null; they merge with the
survivors, receive the job's state (which ranks they replace and the
the recovery counters) from survivor 0, and split like the survivors. A
replacement that fails while joining kills itself (SIGKILL), so that the
survivors see a dead rank and replace it again instead of waiting.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._mpistart import MPI

from ..errors import RecoveryError

__all__ = ["JoinState", "RepairTimes", "repair", "join_as_replacement", "is_replacement",
           "spawn_command"]

log = logging.getLogger("rabit_py")


@dataclasses.dataclass
class JoinState:
    """What survivor 0 tells the replacements when they join."""

    dead: List[int]                  # old ranks being replaced, in spawn order
    trials: Dict[int, int]           # rank -> times it has been replaced
    recoveries: int                  # recoveries so far in this job
    # With spares (Note [spares]): the ranks taken by spawned processes, the
    # rest of ``dead`` being taken by spares; None without spares.
    spawned: Optional[List[int]] = None
    # Note [crash loop] in robust.py: ranks whose replacements have not caught
    # up yet, and how many times in a row each died before catching up.
    catching_up: List[int] = dataclasses.field(default_factory=list)
    quick_deaths: Dict[int, int] = dataclasses.field(default_factory=dict)
    # The job's settings (Config fields): a replacement takes them from here,
    # since its environment carries only what fits in one MPI info value
    # (_spawn_info).
    settings: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class RepairTimes:
    """Seconds spent in each step of the last repair (for the benchmark)."""

    shrink: float = 0.0
    spawn: float = 0.0
    merge: float = 0.0
    attempts: int = 0
    # The ranks being spawned for while a spawn is under way (for the
    # heartbeat: a rank dying then wedges the spawn; Note [stuck spawn] in
    # rabit_py/_supervisor.py), else empty.
    spawning: List[int] = dataclasses.field(default_factory=list)


def spawn_command() -> Tuple[str, List[str]]:
    """The interpreter and arguments that started this program."""
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable] + sys.argv)
    return sys.executable, argv[1:]


# What a replacement needs in its environment before it joins, most needed
# first; the other RABIT_* settings come with the join state.
_SPAWN_ENV_FIRST = ("PYTHONPATH", "PYTHONHASHSEED", "RABIT_RUN_STATUS_DIR", "RABIT_ENGINE",
                    "RABIT_SPARES", "RABIT_RECOVERY_TIMEOUT", "RABIT_RESTART_COUNT")


def spawn_environment(environ: Dict[str, str], limit: int) -> str:
    """The ``PMIX_ENVAR`` value for a replacement: ``NAME=VALUE`` lines of the
    import path and the ``RABIT_*`` settings, most needed first, as many as
    fit in ``limit`` characters (an MPI info value: 255 in Open MPI; a value
    longer than that made every spawn fail with MPI_ERR_INFO_VALUE, seen with
    a long checkpoint path and a few settings)."""
    names = [n for n in _SPAWN_ENV_FIRST if n in environ] + sorted(
        n for n in environ if n.startswith("RABIT_") and n not in _SPAWN_ENV_FIRST)
    lines: List[str] = []
    for name in names:
        line = f"{name}={environ[name]}"
        if "\n" in line or len("\n".join(lines + [line])) > limit:
            continue
        lines.append(line)
    return "\n".join(lines)


def _spawn_info() -> "MPI.Info":
    info = MPI.Info.Create()
    info.Set("wdir", os.getcwd())
    # The replacement is started by the MPI daemon, whose environment is not
    # ours: pass the import path and the settings explicitly (the rest of the
    # settings follow in JoinState.settings).
    passed = spawn_environment(dict(os.environ), MPI.MAX_INFO_VAL - 1)
    if passed:
        info.Set("PMIX_ENVAR", passed)
    return info


def repair(comm: "MPI.Intracomm", my_rank: int, size: int,
           make_state: Any, times: RepairTimes, max_attempts: int = 10,
           check_dead: Optional[Callable[["MPI.Intracomm", List[int]], None]] = None,
           pool: Any = None, give_up: Optional[str] = None
           ) -> Tuple["MPI.Intracomm", List[int]]:
    """Survivor side of Note [repair].

    Args:
        comm: the broken communicator (ranks numbered as in the job).
        my_rank: this process's rank in the job.
        size: the job's world size.
        make_state: ``make_state(dead) -> JoinState`` on survivor 0.
        times: filled with the time of each step.
        check_dead: ``check_dead(shrunk, dead)``, called by every survivor
            (collectively on the shrunk communicator) before spawning; raises
            ``RecoveryError`` when the dead ranks cannot be recovered.
        pool: the job's :class:`~rabit_py.engine._spares.SparePool` when it
            has spares: dead ranks are replaced from it (Note [spares]).
        give_up: with a pool, a reason not to recover (the spares are told it
            before everyone raises ``RecoveryError``).

    Returns:
        The repaired communicator (size ``size``, this process at ``my_rank``)
        and the ranks that were replaced.

    Raises:
        RecoveryError: the repair failed ``max_attempts`` times in a row, or
            ``check_dead`` found the dead ranks unrecoverable.
    """
    current = comm
    replaced: List[int] = []
    last_error: Optional[BaseException] = None
    for attempt in range(1, max_attempts + 1):
        times.attempts = attempt
        shrunk = None
        try:
            try:
                current.Revoke()
            except MPI.Exception:
                pass
            t0 = time.perf_counter()
            log.debug("rank %d: repair attempt %d: shrinking", my_rank, attempt)
            shrunk = current.Shrink()
            shrunk.Set_errhandler(MPI.ERRORS_RETURN)
            alive = shrunk.allgather(my_rank)
            dead = sorted(set(range(size)) - set(alive))
            times.shrink += time.perf_counter() - t0
            log.debug("rank %d: dead ranks %s; spawning", my_rank, dead)
            if not dead:
                # Revoked without a death (e.g. a timeout elsewhere): same members.
                new = shrunk.Split(0, key=my_rank)
                new.Set_errhandler(MPI.ERRORS_RETURN)
                shrunk.Free()
                return new, replaced
            if pool is not None:
                lost = give_up
                lost_error: Optional[RecoveryError] = None
                if lost is None and check_dead is not None:
                    try:
                        check_dead(shrunk, dead)
                    except RecoveryError as exc:
                        lost, lost_error = str(exc), exc   # the spares must hear it too
                try:
                    new, replaced_now, _ = pool.repair(my_rank, size, make_state, lost, times)
                except RecoveryError:
                    if lost_error is not None:
                        raise lost_error from None    # with its restartable flag
                    raise
                _free(shrunk)
                return new, replaced + replaced_now
            if check_dead is not None:
                check_dead(shrunk, dead)
            t0 = time.perf_counter()
            program, args = spawn_command()
            times.spawning = list(dead)
            inter = shrunk.Spawn(program, args=args, maxprocs=len(dead), root=0,
                                 info=_spawn_info())
            times.spawn += time.perf_counter() - t0
            log.debug("rank %d: spawned; merging", my_rank)
            t0 = time.perf_counter()
            merged = inter.Merge(high=False)
            merged.Set_errhandler(MPI.ERRORS_RETURN)
            state = make_state(dead) if merged.Get_rank() == 0 else None
            merged.bcast(state, root=0)
            new = merged.Split(0, key=my_rank)
            new.Set_errhandler(MPI.ERRORS_RETURN)
            times.merge += time.perf_counter() - t0
            times.spawning = []
            if new.Get_size() != size or new.Get_rank() != my_rank:
                raise RecoveryError(f"rank {my_rank}: the repaired communicator has size "
                                    f"{new.Get_size()} and puts this process at rank "
                                    f"{new.Get_rank()}")
            for c in (inter, merged, shrunk):
                _free(c)
            replaced += dead
            return new, replaced
        except MPI.Exception as exc:
            # Another failure during the repair: start over from what we have.
            times.spawning = []
            last_error = exc
            log.info("rank %d: repair attempt %d failed (%s); retrying", my_rank, attempt,
                     exc.Get_error_string())
            if shrunk is not None:
                current = shrunk
    raise RecoveryError(f"rank {my_rank}: could not repair the communicator after "
                        f"{max_attempts} attempts: {last_error}")


def is_replacement() -> bool:
    """Whether this process was spawned to replace a dead rank."""
    return MPI.Comm.Get_parent() != MPI.COMM_NULL


def join_as_replacement(timeout: float = 0.0
                        ) -> Tuple[Optional["MPI.Intracomm"], int, JoinState, Any]:
    """Replacement side of Note [repair].

    Args:
        timeout: seconds joining may take (0: no limit). Joining blocks in
            MPI (merge, split), where nothing can interrupt it: seen stuck for
            good in ``PMIx_Get`` when a survivor died during the join. Past the
            timeout the process ends itself (SIGKILL), as after an error.

    Returns:
        The job's communicator, this process's rank in it, the join state, and
        the job's spare pool (None when the job has no spares). A process
        spawned as a new spare (Note [spare refill] in ``_spares.py``) gets
        no communicator (None) and rank -1.
    """
    from ._watchdog import deadline

    with deadline(timeout, lambda _: _end_replacement(f"joining did not complete within "
                                                      f"{timeout:g} s"), "join"):
        return _join()


def _end_replacement(why: str) -> None:
    sys.stderr.write(f"rabit_py: a replacement could not join the job ({why}); ending it so "
                     f"that the survivors replace it again\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _join() -> Tuple[Optional["MPI.Intracomm"], int, JoinState, Any]:
    try:
        parent = MPI.Comm.Get_parent()
        parent.Set_errhandler(MPI.ERRORS_RETURN)
        merged = parent.Merge(high=True)
        merged.Set_errhandler(MPI.ERRORS_RETURN)
        state: JoinState = merged.bcast(None, root=0)
        index = merged.Get_rank() - parent.Get_remote_size()
        if state.spawned is not None:
            from ._spares import join_pool_as_spawned
            my_rank = state.spawned[index]
            comm, pool = join_pool_as_spawned(merged, my_rank)
            return comm, my_rank, state, pool
        my_rank = state.dead[index]
        comm = merged.Split(0, key=my_rank)
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        _free(merged)
        return comm, my_rank, state, None
    except MPI.Exception as exc:
        _end_replacement(str(exc))
        raise  # unreachable


def _free(comm: Any) -> None:
    try:
        comm.Free()
    except Exception:  # noqa: BLE001 - freeing a communicator of a dead job part
        pass
