"""The job's error output as rabit-run passes it on (Note [quiet banners]).

# Note [quiet banners]
When a rank ends the job, Open MPI prints help banners -- a block between two
rules of dashes: "MPI_ABORT was invoked on rank N ...", "prterun noticed
that process rank N ... exited on signal ...", "prterun has exited due to
process rank N ..." -- and its output forwarding leaves stray NUL bytes.
Under rabit-run they only repeat what the failing rank already printed and
what rabit-run's verdict says at the end (which rank, why, whether it
restarts), so rabit-run leaves those banners and the NUL bytes out of the
job's stderr; everything else passes through unchanged and at once,
including lines not ended yet (a progress bar's ``\\r``), except a line that
starts with a dash, held until its end to tell a rule from text. Open MPI 5
has no setting that silences these banners (its help messages can only be
aggregated). ``rabit-run --mpi-banners`` passes everything.
"""

from __future__ import annotations

import os
import re
import threading
from typing import BinaryIO, List, Optional

__all__ = ["BannerFilter", "pump"]

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


def pump(source: BinaryIO, sink: BinaryIO, verbose: bool = False) -> threading.Thread:
    """Copy ``source`` (the job's stderr pipe) to ``sink`` through a
    :class:`BannerFilter` (unfiltered with ``verbose``) on a daemon thread,
    until the job's processes have all closed it. Returns the thread."""
    fd = source.fileno()

    def run() -> None:
        keep = BannerFilter()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            out = data if verbose else keep.feed(data)
            if out:
                try:
                    sink.write(out)
                    sink.flush()
                except (OSError, ValueError):
                    pass
        try:
            sink.write(b"" if verbose else keep.flush())
            sink.flush()
        except (OSError, ValueError):
            pass
        source.close()

    thread = threading.Thread(target=run, name="rabit-run-stderr", daemon=True)
    thread.start()
    return thread
