"""What the survivors' repair and the spare pool share: the state that
replacements receive when they join, repair timings, how replacements are
spawned and merged in, and the loop that retries a repair after another
failure (Note [repair] in ``_repair.py``, Note [spares] in ``_spares.py``)."""

from __future__ import annotations

import abc
import dataclasses
import logging
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from .._mpistart import MPI

from ..._spawn import spawn_environment, spawn_info
from ...errors import RecoveryError
from .. import _control as control

__all__ = ["JoinState", "RepairTimes", "Replacer", "spawn_command", "spawn_environment",
           "spawn_info", "spawn_and_merge", "join_spawner", "wait_quietly", "until_repaired",
           "free_comm", "is_replacement"]

log = logging.getLogger("rabit_py")

T = TypeVar("T")


@dataclasses.dataclass
class JoinState:
    """What survivor 0 tells the replacements when they join."""

    dead: List[int]                  # old ranks being replaced, in spawn order
    trials: Dict[int, int]           # rank -> times it has been replaced
    recoveries: int                  # recoveries so far in this job
    # With spares (Note [spares]): the ranks taken by spawned processes, the
    # rest of ``dead`` being taken by spares; None without spares.
    spawned: Optional[List[int]] = None
    # Note [crash loop] in _recovery.py: ranks whose replacements have not caught
    # up yet, and how many times in a row each died before catching up.
    catching_up: List[int] = dataclasses.field(default_factory=list)
    quick_deaths: Dict[int, int] = dataclasses.field(default_factory=dict)
    # The job's settings (Config fields): a replacement takes them from here,
    # since its environment carries only what fits in one MPI info value
    # (spawn_info).
    settings: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class RepairTimes:
    """Seconds spent in each step of the last repair (for the benchmark)."""

    shrink: float = 0.0
    spawn: float = 0.0
    merge: float = 0.0
    attempts: int = 0
    # While a spawn is under way, the ranks its repair replaces (spawned for,
    # or taken over by spares), for the heartbeat: another rank dying then
    # wedges the spawn (Note [stuck spawn] in rabit_py/launcher/_supervisor.py);
    # else empty.
    spawning: List[int] = dataclasses.field(default_factory=list)


class Replacer(abc.ABC):
    """How one repair gives the dead ranks new processes: spawned ones
    (``_repair.SpawnReplacer``) or spares (``_spares.SparePool``). The one
    repair loop (``_repair.repair``) shrinks, finds the dead, and asks its
    replacer; another failure on the way starts the loop over."""

    @abc.abstractmethod
    def replace(self, shrunk: "MPI.Intracomm", my_rank: int, size: int, dead: List[int],
                make_state: Callable[[List[int]], "JoinState"], times: "RepairTimes",
                check_dead: Optional[Callable[["MPI.Intracomm", List[int]], None]],
                give_up: Optional[str]) -> Tuple["MPI.Intracomm", List[int]]:
        """One attempt, on every survivor (collective on ``shrunk``, the
        survivors' communicator; taken over: freed on success).

        Args:
            shrunk: the job's communicator shrunk to the survivors.
            my_rank: this survivor's job rank.
            size: the job's world size.
            dead: the job ranks that died.
            make_state: ``make_state(dead) -> JoinState`` (on one survivor).
            times: filled with the time of each step.
            check_dead: ``check_dead(shrunk, dead)`` raises ``RecoveryError``
                when the dead ranks cannot be recovered (collective).
            give_up: a reason not to recover (told to whoever waits to
                replace, then raised), or None.

        Returns:
            The repaired communicator (size ``size``, this process at
            ``my_rank``) and the ranks replaced.

        Raises:
            MPI.Exception: another failure: the repair starts over.
            RecoveryError: the dead ranks cannot be recovered.
        """


def spawn_command() -> Tuple[str, List[str]]:
    """The interpreter and arguments that started this program."""
    argv = list(getattr(sys, "orig_argv", []) or [sys.executable] + sys.argv)
    return sys.executable, argv[1:]


# Note [quiet spawn]
# ~~~~~~~~~~~~~~~~~~
# New processes start while the survivors wait, and a process waiting inside
# MPI mostly spins: in a collective MPI_Comm_spawn every survivor but the
# spawning one polled until the new processes had started Python, imported
# the program's modules and initialised MPI, and all of them polled again in
# the merge until the newcomers reached ``init()``. Where ranks share cores
# (4 ranks on the development VM's 2), the newcomer then started on a
# fraction of a core: its imports took 70-140 ms instead of 55, and a
# replacement that slept 1 s at start cost every survivor but the spawning
# one 1.0 s of CPU. So the survivors wait asleep:
#
# 1. The spawning survivor (``root``) opens an MPI port and spawns on
#    MPI_COMM_SELF; inside PMIx_Spawn it blocks without spinning. The others
#    wait for it in an MPI_Ibarrier on ``comm`` that they test between short
#    sleeps.
# 2. The newcomers, once in their join, enter an MPI_Ibarrier with the root
#    (which it tests between sleeps likewise).
# 3. The root enters the survivors' Ibarrier, then sends the newcomers the
#    port's name (an empty one if that barrier failed: they end at once
#    instead of waiting for a port that nobody accepts on); all survivors
#    accept on the port, the newcomers connect to it (MPI_Comm_accept/connect:
#    2-3 ms here, everyone being there), and the intercommunicator is merged
#    with the survivors first, in their order, as the collective spawn's merge
#    did.
#
# Connecting every survivor to the newcomers matters: an intercommunicator
# built over the root's merge alone (MPI_Intercomm_create) gave a
# communicator whose first collective hung, since only the root's process
# had been connected to the newcomers' job. A failure on the way reaches the
# sleepers like any other: the root's next attempt revokes their
# communicator, and their Ibarrier fails. So a survivor that dies while a
# replacement starts is replaced in the same job (inside the collective
# spawn, a death wedged the repair, and rabit-run ended the job: Note [stuck
# spawn]); only from the accept on, every survivor inside MPI with the
# newcomers, does a death still wedge it, and only from there do the
# survivors report the spawn in their heartbeat (``times.spawning``).

_QUIET_POLL_S = 0.0005


def wait_quietly(request: "MPI.Request") -> None:
    """Wait for ``request`` between short sleeps instead of spinning in MPI
    (Note [quiet spawn]). Raises ``MPI.Exception`` as ``Wait`` would."""
    while not request.Test():
        time.sleep(_QUIET_POLL_S)


def spawn_and_merge(comm: "MPI.Intracomm", count: int, root: int, state: Optional["JoinState"],
                    times: "RepairTimes", replaced: List[int]) -> "MPI.Intracomm":
    """Spawn ``count`` processes of this program (``comm``'s ``root`` spawns;
    collective on ``comm``), merge them in after ``comm``'s members and send
    them ``state`` (that of the merged communicator's rank 0, ``comm``'s rank
    0): what spawned replacements (Note [repair]) and a spare pool's rebuild
    (Note [spares]) share; the survivors wait asleep (Note [quiet spawn]).
    ``times.spawning`` is set to ``replaced`` (the ranks this repair
    replaces) from the moment every survivor is inside MPI with the
    newcomers, where a death would wedge the repair (Note [stuck spawn]); the
    caller clears it once the new processes are in. ``times.spawn``: on the
    root, the spawn; on the others, their wait until the newcomers are ready.

    Returns:
        The merged communicator (errors returned); the intermediate
        communicators are freed.

    Raises:
        MPI.Exception: a process died meanwhile (the repair starts over).
    """
    t0 = time.perf_counter()
    is_root = comm.Get_rank() == root
    port: Optional[str] = MPI.Open_port() if is_root else None
    try:
        if is_root:
            program, args = spawn_command()
            inter = MPI.COMM_SELF.Spawn(program, args=args, maxprocs=count, root=0,
                                        info=spawn_info())
            times.spawn += time.perf_counter() - t0
            t0 = time.perf_counter()
            try:
                inter.Set_errhandler(MPI.ERRORS_RETURN)
                wait_quietly(inter.Ibarrier())          # the newcomers are in their join
                # The port's name once every survivor is there too; an empty
                # name tells the newcomers that this attempt failed, so that
                # they end now instead of at their join's deadline.
                name = bytearray(MPI.MAX_PORT_NAME)
                try:
                    wait_quietly(comm.Ibarrier())
                    name[:len(port.encode())] = port.encode()  # type: ignore[union-attr]
                finally:
                    inter.Bcast([name, MPI.CHAR], root=MPI.ROOT)
            finally:
                free_comm(inter)
        else:
            wait_quietly(comm.Ibarrier())
        if not is_root:
            times.spawn += time.perf_counter() - t0
            t0 = time.perf_counter()
        times.spawning = list(replaced)
        connected = comm.Accept(port, root=root)
    finally:
        if port is not None:
            _close_port(port)
    connected.Set_errhandler(MPI.ERRORS_RETURN)
    try:
        merged = connected.Merge(high=False)
    finally:
        free_comm(connected)
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    control.bcast(merged, state, 0, "repair.join_state")
    times.merge += time.perf_counter() - t0
    return merged


def join_spawner() -> Optional[Tuple["MPI.Intracomm", int]]:
    """A spawned process's side of :func:`spawn_and_merge` (Note [quiet
    spawn]): the merged communicator (errors returned) and how many members
    come before the new processes; None when the repair that spawned this
    process failed before it could join. Raises ``MPI.Exception``."""
    parent = MPI.Comm.Get_parent()
    parent.Set_errhandler(MPI.ERRORS_RETURN)
    parent.Ibarrier().Wait()
    name = bytearray(MPI.MAX_PORT_NAME)
    parent.Bcast([name, MPI.CHAR], root=0)
    port = bytes(name).split(b"\0", 1)[0].decode()
    if not port:
        return None
    connected = MPI.COMM_WORLD.Connect(port, root=0)
    connected.Set_errhandler(MPI.ERRORS_RETURN)
    try:
        merged = connected.Merge(high=True)
        before = connected.Get_remote_size()
    finally:
        free_comm(connected)
    merged.Set_errhandler(MPI.ERRORS_RETURN)
    return merged, before


def _close_port(port: str) -> None:
    try:
        MPI.Close_port(port)
    except MPI.Exception:
        pass


def until_repaired(attempt: Callable[[int], T], who: str, times: "RepairTimes",
                   max_attempts: int = 10) -> T:
    """Run ``attempt(n)`` until it returns: another failure during a repair
    (``MPI.Exception``) starts it over, up to ``max_attempts`` times. The one
    retry loop of a survivor's repair and a spare's rebuild.

    Raises:
        RecoveryError: every attempt failed.
    """
    last: Optional[BaseException] = None
    for n in range(1, max_attempts + 1):
        times.attempts = n
        try:
            return attempt(n)
        except MPI.Exception as exc:
            times.spawning = []
            last = exc
            log.info("%s: repair attempt %d failed (%s); retrying", who, n,
                     exc.Get_error_string())
    raise RecoveryError(f"{who}: could not repair the job after {max_attempts} attempts: "
                        f"{last}")


def free_comm(comm: Any) -> None:
    """Free ``comm``, ignoring errors (a communicator of a dead part of the job)."""
    try:
        comm.Free()
    except Exception:  # noqa: BLE001 - freeing a communicator of a dead job part
        pass


def is_replacement() -> bool:
    """Whether this process was spawned to replace a dead rank."""
    return MPI.Comm.Get_parent() != MPI.COMM_NULL
