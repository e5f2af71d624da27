"""The job's output as rabit-run passes it on: whole lines (Note [whole
lines]), without Open MPI's banners (Note [quiet banners]).

# Note [whole lines]
A line that a rank prints can reach mpirun's output in two pieces, its text
and its end: Python writes them with two system calls when stdout is
unbuffered (``PYTHONUNBUFFERED=1``, the usual setting in containers and on
this project's machines; ``print`` then writes the text, then ``"\\n"``), and
Open MPI forwards each as it reads it. Once the job's stdout and stderr are
merged (``2>&1``, a log file, a test's pipe), a line of the other stream
could land between them (docs/observed.md). rabit-run therefore passes both streams on itself, a line at a time: a line
not ended yet is held until its end comes, or for ``HOLD_S`` at most (a
progress bar that redraws itself with ``"\\r"`` is passed on at each
``"\\r"``), and the two streams write under one lock. Lines of different
ranks on the same stream are joined by Open MPI, as it forwards them, before
rabit-run sees them.

# Note [quiet banners]
When a rank ends the job, Open MPI prints help banners -- a block between two
rules of dashes: "MPI_ABORT was invoked on rank N ...", "prterun noticed
that process rank N ... exited on signal ...", "prterun has exited due to
process rank N ..." -- and its output forwarding leaves stray NUL bytes.
Under rabit-run they only repeat what the failing rank already printed and
what rabit-run's verdict says at the end (which rank, why, whether it
restarts), so rabit-run leaves those banners and the NUL bytes out of the
job's stderr; everything else passes through unchanged (as whole lines,
Note [whole lines]), except a line that starts with a dash, held until its
end (however long) to tell a rule from text. Open MPI 5
has no setting that silences these banners (its help messages can only be
aggregated). ``rabit-run --mpi-banners`` passes everything.
"""

from __future__ import annotations

import os
import re
import select
import threading
import time
from typing import BinaryIO, List, Optional

__all__ = ["BannerFilter", "WholeLines", "pump", "HOLD_S"]

HOLD_S = 0.1        # seconds a line not ended yet is held (Note [whole lines])

_RULE = re.compile(rb"^-{20,}\s*$")
# The first line of a banner that repeats what rabit_py and rabit-run say.
_QUIET = re.compile(rb"^\s*(MPI_ABORT was invoked on rank|prterun noticed that process rank|"
                    rb"prterun has exited due to process rank|Primary job\s+terminated normally|"
                    rb"prterun detected that one or more processes exited)")
_MAX_HELD = 60          # lines: a "banner" longer than this is not one of them


class BannerFilter:
    """Feed it the job's stderr as it comes; it returns what to print."""

    def __init__(self) -> None:
        self._partial = b""             # the current line, not ended yet, held
        self._block: Optional[List[bytes]] = None   # lines since an opening rule

    def feed(self, data: bytes) -> bytes:
        """The part of ``data`` (and of what came before) to print now."""
        data = self._partial + data.replace(b"\0", b"")
        self._partial = b""
        out: List[bytes] = []
        lines = data.split(b"\n")
        last = lines.pop()              # after the last newline: not ended
        for line in lines:
            out.append(self._line(line + b"\n"))
        if last:
            if self._block is not None or last.startswith(b"-"):
                self._partial = last    # a rule or a banner's line: wait for its end
            else:
                out.append(last)        # e.g. a progress bar: print it now
        return b"".join(out)

    def flush(self) -> bytes:
        """What is still held (at the end of the output)."""
        held = b"".join(self._block or []) + self._partial
        self._block, self._partial = None, b""
        return held

    def _line(self, line: bytes) -> bytes:
        if self._block is None:
            if _RULE.match(line):
                self._block = [line]
                return b""
            return line
        self._block.append(line)
        if _RULE.match(line):
            block, self._block = self._block, None
            if len(block) > 2 and _QUIET.match(block[1]):
                return b""
            return b"".join(block)
        if len(self._block) > _MAX_HELD or (len(self._block) == 2 and not _QUIET.match(line)
                                           and not line.strip() == b""):
            # Not one of the banners left out: print it as it comes.
            block, self._block = self._block, None
            return b"".join(block)
        return b""


class WholeLines:
    """Feed it a stream's bytes as they come; it returns the part that ends
    a line (at a ``"\\n"`` or ``"\\r"``) and holds the rest, which
    :meth:`held_too_long` gives up after ``hold_s`` (Note [whole lines])."""

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self._held = b""
        self._since = 0.0

    @property
    def holding(self) -> bool:
        """Whether a line not ended yet is held."""
        return bool(self._held)

    def feed(self, data: bytes, now: float) -> bytes:
        """What of ``data`` (after what is held) ends a line; ``now``: the
        time (``time.monotonic()``) it came."""
        if not data:
            return b""
        held = self._held
        data = held + data
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if end < len(data) and (end > 0 or not held):
            self._since = now           # a new line began
        self._held = data[end:]
        return data[:end]

    def held_too_long(self, now: float) -> bytes:
        """What is held, if it has been for ``hold_s`` by ``now``; else nothing."""
        if self._held and now - self._since >= self.hold_s:
            return self.rest()
        return b""

    def wait_s(self, now: float) -> Optional[float]:
        """How long to wait for more before :meth:`held_too_long` (None: no limit)."""
        return max(0.0, self._since + self.hold_s - now) if self._held else None

    def rest(self) -> bytes:
        """Everything held (at the end of the stream)."""
        held, self._held = self._held, b""
        return held


def pump(source: BinaryIO, sink: BinaryIO, lock: threading.Lock,
         banners: Optional[BannerFilter] = None) -> threading.Thread:
    """Copy ``source`` (a pipe of the job's output) to ``sink`` a line at a
    time (:class:`WholeLines`), through ``banners`` when given, writing under
    ``lock`` (shared by the pumps of one job), on a daemon thread, until the
    job's processes have all closed it. Returns the thread."""
    fd = source.fileno()

    def write(out: bytes) -> None:
        if out:
            with lock:
                try:
                    sink.write(out)
                    sink.flush()
                except (OSError, ValueError):
                    pass

    def run() -> None:
        lines = WholeLines()
        while True:
            try:
                ready, _, _ = select.select([fd], [], [], lines.wait_s(time.monotonic()))
                data = os.read(fd, 65536) if ready else None
            except (OSError, ValueError):
                break
            if data == b"":
                break
            now = time.monotonic()
            if data is not None:
                write(lines.feed(data if banners is None else banners.feed(data), now))
            write(lines.held_too_long(now))
        write(lines.rest() + (banners.flush() if banners is not None else b""))
        source.close()

    thread = threading.Thread(target=run, name="rabit-run-output", daemon=True)
    thread.start()
    return thread
