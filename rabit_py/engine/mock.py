"""MockEngine: the robust engine plus deterministic fault injection (Rabit's mock).

``RABIT_ENGINE=mock RABIT_MOCK="rank,version,seqno,trial;..."``: the process of
``rank`` kills itself with SIGKILL when it reaches call ``seqno`` of ``version``
on its ``trial``-th life (0 for the original process, 1 for its first
replacement, ...; a whole-job restart by rabit-run counts as a life too, as
Rabit's ``rabit_num_trial`` does, so a planned kill does not repeat forever).
``seqno`` counts collectives since the last checkpoint from 0;
a checkpoint (or finalize) is keyed by the seqno after the last collective of its
version, i.e. the number of collectives made in that version. ``version`` is
``version_number()`` at that time. The count restarts at 0 after
``load_checkpoint`` too, so calls made before it (start-up broadcasts) are
numbered 0, 1, ... of version 0 as well.

SIGKILL, not an exception or ``exit(1)``: a signal is what MPI's failure
detector sees at once (see shared/notes/ulfm.md), and it is what a real crash
looks like.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ..ops import OpLike
from ._lifecycle import kill_self
from ._mockplan import matches, parse_plan
from .base import PrepareFn
from .robust import RobustEngine

__all__ = ["MockEngine", "parse_plan", "matches"]

class MockEngine(RobustEngine):
    """A :class:`RobustEngine` that kills itself at the points of ``config.mock``."""

    kind = "mock"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._plan = parse_plan(self.config.mock)

    def allreduce(self, data: Any, op: OpLike, prepare_fun: Optional[PrepareFn] = None) -> Any:
        self._before_call(self.frame.seqno)
        return super().allreduce(data, op, prepare_fun)

    def _before_call(self, seqno: int) -> None:
        trial = self.trial + self.config.restart_count
        if matches(self._plan, self.frame.rank, self.frame.version, seqno, trial):
            kill_self(f"rabit_py mock: rank {self.frame.rank} killed at version "
                      f"{self.frame.version}, seqno {seqno}, trial {trial} "
                      f"(time {time.time():.6f})")
