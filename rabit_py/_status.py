"""The status folder: how the processes of a job tell ``rabit-run`` how they do.

# Note [status folder]
``rabit-run`` makes one folder per attempt and gives it to the job in
``RABIT_RUN_STATUS_DIR`` (``Config.run_status_dir``). Each process writes
small whole files there, named after it: ``rank-R`` for a rank (each new
process of rank R, a replacement, writes under the same name), ``spare-W``
for a spare (W: its rank in ``MPI_COMM_WORLD``):

- ``NAME.started``: the engine started: ``PID HOST`` (each new process of a
  rank rewrites it);
- ``NAME.beat``: a heartbeat, rewritten about once a second by the engine's
  watchdog thread (never on the call path): ``BEAT VERSION SEQNO KIND STATE
  PID HOST RECOVERIES REPLACED`` (the last two: the job's in-job recoveries
  and replaced processes so far, as this rank knows them) and SPAWNING,
  STATE being ``call`` (inside a collective), ``repair`` (repairing the job
  after a failure), ``spawn`` (repairing, inside a spawn of processes for the
  ranks listed in SPAWNING, comma-separated; ``-`` in other states), ``user``
  (in the program's own code), ``prepare`` (in the program's ``prepare_fun``,
  inside the call: its own code too) or ``done``; a parameter server
  (``server-I``, Note [server processes] in ``_servers.py``) beats from a
  thread of its own with STATE ``serve`` and SEQNO the requests it handled;
- ``NAME.fatal``: the job cannot go on; first line ``restart`` (a restart from
  the durable checkpoint may help), ``bug`` (it would not: the program must
  change), ``setup`` (the job cannot start as it is set up: ranks with
  different settings, an unusable checkpoint folder) or ``abort`` (the
  program ended the job on purpose: ``rabit.abort``), and the time it was
  written (seconds since the epoch: the earliest report is the cause); then
  the reason;
- ``NAME.overdue``: the rank has waited in a collective past the collective
  timeout and asks rabit-run to end the ranks that hold it (Note [hung ranks]
  in ``engine/_watchdog.py``): ``VERSION SEQNO KIND WAITED TIME`` (the call,
  the seconds it lasted, when written); written once per such call;
- ``NAME.ok`` / ``NAME.failed``: how the engine ended, as the process exits
  (``failed`` holds the reason when one is known);
- ``job.done``: every rank of the job reached ``finalize`` together (written
  by each rank that sees the folder, after the finalize agreement).

Every write goes to a temporary name and is renamed, so a reader sees whole
files only; the files are tiny and written rarely, so the folder may live on a
filesystem that every host shares (nothing depends on the launching host's
``/tmp``). Writes never raise: a status report must not break the job.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Dict, FrozenSet, Optional, Sequence, Tuple

__all__ = ["Reporter", "Report", "read_reports", "job_done", "process_alive", "RESTART", "BUG",
           "SETUP", "ABORT", "STATES", "STATUS_DIR_VARIABLE"]

#: The variable that gives the job the folder (read into Config.run_status_dir).
STATUS_DIR_VARIABLE = "RABIT_RUN_STATUS_DIR"

RESTART = "restart"
BUG = "bug"
SETUP = "setup"
ABORT = "abort"         # the program ended the job on purpose (rabit.abort)
STATES = ("call", "repair", "spawn", "user", "prepare", "done", "serve")


class Reporter:
    """Writes one process's files in the status folder (a no-op without one).

    Args:
        folder: the status folder, or None (nothing is written).
        name: ``rank-R`` or ``spare-W``.
    """

    def __init__(self, folder: Optional[str], name: str) -> None:
        self.folder = folder if folder and os.path.isdir(folder) else None
        self.name = name
        self._beats = 0
        # gethostname(2), as socket.gethostname() reads it; the socket module
        # costs 4-7 ms of every start and every replacement's (its enums).
        self._host = os.uname().nodename

    @classmethod
    def for_rank(cls, folder: Optional[str], rank: int) -> "Reporter":
        """The reporter of job rank ``rank``."""
        return cls(folder, f"rank-{rank}")

    def _write(self, kind: str, text: str = "") -> None:
        if self.folder is None:
            return
        path = os.path.join(self.folder, f"{self.name}.{kind}")
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError:
            pass

    def started(self) -> None:
        """The engine started."""
        self._write("started", f"{os.getpid()} {self._host}\n")

    def beat(self, version: int, seqno: int, kind: int, state: str, recoveries: int = 0,
             replaced: int = 0, spawning: Sequence[int] = ()) -> None:
        """A heartbeat: where this process is now, the in-job recoveries and
        replaced processes of the job so far, and in state ``spawn`` the
        ranks that the repair under way replaces (see the note)."""
        self._beats += 1
        spawned = ",".join(map(str, spawning)) or "-"
        self._write("beat", f"{self._beats} {version} {seqno} {kind} {state} {os.getpid()} "
                            f"{self._host} {recoveries} {replaced} {spawned}\n")

    def overdue(self, version: int, seqno: int, kind: int, waited: float) -> bool:
        """This rank's call ``(version, seqno, kind)`` has lasted ``waited``
        seconds, past the collective timeout: rabit-run may end the ranks
        that hold it. Whether there is a folder to say it in."""
        if self.folder is None:
            return False
        self._write("overdue", f"{version} {seqno} {kind} {waited:.3f} {time.time():.6f}\n")
        return True

    def fatal(self, category: str, reason: str) -> None:
        """The job cannot go on (``RESTART``, ``BUG``, ``SETUP`` or ``ABORT``); the first
        report of a process wins."""
        if self.folder is not None and not os.path.exists(
                os.path.join(self.folder, f"{self.name}.fatal")):
            self._write("fatal", f"{category} {time.time():.6f}\n{reason}\n")

    def job_done(self, size: int) -> None:
        """Every rank of the job (``size`` ranks) reached ``finalize``
        together: ``job.done``, written by each rank that sees the folder, so
        that rabit-run learns it even when most ranks run on hosts that
        cannot see the folder (Note [several hosts] in ``launcher/_command.py``)."""
        Reporter(self.folder, "job")._write("done", f"{size}\n")

    def exited(self, clean: bool, reason: str = "") -> None:
        """How the engine ended, as the process exits."""
        self._write("ok" if clean else "failed", reason)


@dataclasses.dataclass
class Report:
    """What one name (``rank-R`` / ``spare-W``) reported."""

    started: bool = False
    started_by: Optional[Tuple[int, str]] = None     # (pid, host) of the last process
    beat: Optional[Tuple[int, int, int, int, str, int, str, int, int]] = None
    fatal: Optional[Tuple[str, str]] = None      # (category, reason)
    fatal_at: float = 0.0                        # when the fatal report was written
    ok: bool = False
    failed: Optional[str] = None                 # the reason ("" if none known)

    @property
    def position(self) -> Optional[Tuple[int, int, int]]:
        """(version, seqno, kind) of the last heartbeat."""
        return None if self.beat is None else self.beat[1:4]   # type: ignore[return-value]

    spawning: FrozenSet[int] = frozenset()       # state spawn: the ranks being replaced
    #: (version, seqno, kind, seconds waited, when written): Note [hung ranks]
    overdue: Optional[Tuple[int, int, int, float, float]] = None

    @property
    def state(self) -> Optional[str]:
        return None if self.beat is None else self.beat[4]


def job_done(folder: str) -> bool:
    """Whether a rank wrote ``job.done`` in ``folder``."""
    return os.path.exists(os.path.join(folder, "job.done"))


def read_reports(folder: str) -> Dict[str, Report]:
    """Everything the processes reported in ``folder``, by name. Never raises."""
    reports: Dict[str, Report] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return reports
    for file in names:
        name, _, kind = file.rpartition(".")
        if not name or file.endswith(".tmp") or name == "job":
            continue
        report = reports.setdefault(name, Report())
        if kind == "started":
            report.started = True
            try:
                with open(os.path.join(folder, file)) as f:
                    pid, host = f.read().split()
                report.started_by = (int(pid), host)
            except (OSError, ValueError):
                pass
        elif kind == "ok":
            report.ok = True
        elif kind in ("failed", "fatal", "beat", "overdue"):
            try:
                with open(os.path.join(folder, file)) as f:
                    text = f.read()
            except OSError:
                continue
            if kind == "failed":
                report.failed = text.strip()
            elif kind == "fatal":
                first, _, reason = text.partition("\n")
                words = first.split()
                report.fatal = (words[0] if words else "", reason.strip())
                try:
                    report.fatal_at = float(words[1])
                except (IndexError, ValueError):
                    report.fatal_at = 0.0
            elif kind == "overdue":
                fields = text.split()
                try:
                    report.overdue = (int(fields[0]), int(fields[1]), int(fields[2]),
                                      float(fields[3]), float(fields[4]))
                except (IndexError, ValueError):
                    pass
            else:
                fields = text.split()
                try:
                    report.beat = (int(fields[0]), int(fields[1]), int(fields[2]),
                                   int(fields[3]), fields[4], int(fields[5]), fields[6],
                                   int(fields[7]), int(fields[8]))
                    if len(fields) > 9 and fields[9] != "-":
                        report.spawning = frozenset(map(int, fields[9].split(",")))
                except (IndexError, ValueError):
                    pass
    return reports


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` (on this node) is running: not gone, not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True
