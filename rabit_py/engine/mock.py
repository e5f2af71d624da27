"""MockEngine: the robust engine plus deterministic fault injection (Rabit's mock).

``RABIT_ENGINE=mock RABIT_MOCK="rank,version,seqno,trial;..."``: the process of
``rank`` kills itself with SIGKILL when it reaches call ``seqno`` of ``version``
on its ``trial``-th life (0 for the original process, 1 for its first
replacement, ...). ``seqno`` counts collectives since the last checkpoint from 0;
a checkpoint (or finalize) is keyed by the seqno after the last collective of its
version, i.e. the number of collectives made in that version. ``version`` is
``version_number()`` at that time. Calls made before the first
``load_checkpoint`` count in version 0 with the others.

SIGKILL, not an exception or ``exit(1)``: a signal is what MPI's failure
detector sees at once (see shared/notes/ulfm.md), and it is what a real crash
looks like.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import FrozenSet, Tuple

from .robust import RobustEngine

__all__ = ["MockEngine", "parse_plan"]

KillPoint = Tuple[int, int, int, int]


def parse_plan(text: str) -> FrozenSet[KillPoint]:
    """Parse ``"rank,version,seqno,trial;..."`` into kill points.

    Spaces and empty entries are ignored.

    Raises:
        ValueError: an entry is not four non-negative integers; the message
            quotes the entry.
    """
    points = set()
    for entry in text.replace(" ", "").split(";"):
        if not entry:
            continue
        parts = entry.split(",")
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            values = ()
        if len(values) != 4 or min(values) < 0:
            raise ValueError(f"RABIT_MOCK entry {entry!r} is not 'rank,version,seqno,trial' "
                             f"(four integers >= 0)")
        points.add(values)  # type: ignore[arg-type]
    return frozenset(points)  # type: ignore[arg-type]


class MockEngine(RobustEngine):
    """A :class:`RobustEngine` that kills itself at the points of ``config.mock``."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._plan = parse_plan(self._config.mock)

    def _before_call(self, seqno: int) -> None:
        point = (self._rank, self._version, seqno, self._trial)
        if point in self._plan:
            sys.stdout.flush()
            sys.stderr.write(f"rabit_py mock: rank {self._rank} killed at version "
                             f"{self._version}, seqno {seqno}, trial {self._trial}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
