"""The processes of a job, seen from ``rabit-run`` (Linux ``/proc``):
listing, telling apart and killing them, and the environment forwarded to
ranks on other hosts."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Dict, List, Optional

__all__ = ["descendants", "start_time", "is_stopped", "kill_tree", "forwarded"]


def descendants(pid: int) -> List[int]:
    """Every live (not zombie) descendant of ``pid`` (Linux /proc; empty elsewhere)."""
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                # An ended rank that mpirun has not reaped (it can hang after
                # an abort): not alive.
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def start_time(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks since boot, from /proc), to
    tell it from a later process given the same PID; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else fields[19].decode()
    except (OSError, IndexError):
        return None


def is_stopped(pid: int, traced: bool = True) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, or, with ``traced``, a
    debugger): its threads, the heartbeat's included, run no more until it
    is continued."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state == b"T" or (traced and state == b"t")


def kill_tree(pid: int) -> List[int]:
    """SIGKILL every descendant of ``pid`` (ranks run in process groups of
    their own), then ``pid``'s process group. ``pid`` is stopped first, so
    that it cannot start a process (a replacement) between the listing and
    the kills, which would outlive it. Returns the PIDs killed."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        pass
    killed: List[int] = []
    for _ in range(3):          # a child may have been forking as we listed
        found = [p for p in descendants(pid) if p not in killed]
        if not found:
            break
        for child in found:
            try:
                os.kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        killed += found
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGCONT)    # a stopped process dies of SIGKILL, but be sure
    except (ProcessLookupError, PermissionError):
        pass
    return killed


def forwarded(cmd: List[str], env: Dict[str, str]) -> List[str]:
    """``cmd`` (an mpirun command) with ``-x NAME`` for every ``RABIT_*``
    variable of ``env`` and ``PYTHONPATH``: mpirun gives the ranks on other
    hosts a clean environment (as sshd does), so the job's settings must be
    named to reach them (Note [several hosts] in ``_command.py``)."""
    names = sorted(n for n in env if n.startswith("RABIT_") and "\n" not in env[n])
    if env.get("PYTHONPATH"):
        names.append("PYTHONPATH")
    flags = [word for name in names for word in ("-x", name)]
    return cmd[:1] + flags + cmd[1:]

