"""The signature check: ranks agree on what collective they are about to run.

# Note [signature check]
Before each collective, every rank contributes a small int64 vector describing
the call (version, call number, kind, op, dtype, shape, root, input status).
One ``Allreduce(MAX)`` of ``[fields, -fields]`` gives every rank the maximum and
the minimum of each field, so all ranks learn *together* whether everyone
agrees: they all raise or all proceed. Fields a rank cannot know (a broadcast
receiver that passed ``None`` has no dtype) are wildcards that take no part.
Only on a mismatch (the rare, slow path) do ranks ``allgather`` full
descriptions to name who differed and how.

The check itself is always the same collective, whatever call each rank is
making, so it cannot deadlock on a kind mismatch.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Kind", "Signature", "WILDCARD", "mismatched_fields",
           "describe_mismatch"]

WILDCARD = int(np.iinfo(np.int64).min)


class Kind:
    """Codes of the calls that take part in the check."""

    ALLREDUCE = 1
    BROADCAST = 2
    ALLGATHER = 3
    CHECKPOINT = 4
    LOAD_CHECKPOINT = 5
    FINALIZE = 6

    NAMES = {1: "allreduce", 2: "broadcast", 3: "allgather", 4: "checkpoint",
             5: "load_checkpoint", 6: "finalize"}


# dtype code of a broadcast root that sends a pickled object instead of an array
OBJECT_DTYPE = 99

_FIELDS = ("version", "seqno", "kind", "op", "dtype", "shape", "root", "status")
_LABELS = {"version": "version", "seqno": "call number", "kind": "call", "op": "op",
           "dtype": "dtype", "shape": "shape", "root": "root",
           "status": "input"}


@dataclasses.dataclass
class Signature:
    """One rank's description of a collective call.

    ``None`` fields are wildcards. ``shape`` is the shape that must match (the
    trailing shape for allgather). ``error`` is the exception that refused this
    rank's input, if any; the rank still takes part in the check so that its
    peers raise instead of waiting.
    """

    version: int
    seqno: int
    kind: int
    op: Optional[int] = None
    op_text: str = ""
    dtype: Optional[int] = None
    dtype_text: str = ""
    shape: Optional[Tuple[int, ...]] = None
    root: Optional[int] = None
    error: Optional[BaseException] = None

    def vector(self) -> np.ndarray:
        """The ``[fields, -fields]`` vector for the agreement allreduce."""
        shape_code = (None if self.shape is None
                      else zlib.crc32(repr(tuple(self.shape)).encode()))
        status = 0 if self.error is None else 1
        values = (self.version, self.seqno, self.kind, self.op, self.dtype,
                  shape_code, self.root, status)
        vec = np.empty(2 * len(values), dtype=np.int64)
        for i, v in enumerate(values):
            if v is None:
                vec[i] = vec[len(values) + i] = WILDCARD
            else:
                vec[i] = v
                vec[len(values) + i] = -v
        return vec

    def describe(self) -> Dict[str, Any]:
        """Readable values of the fields, for the mismatch message."""
        return {
            "version": self.version,
            "seqno": f"#{self.seqno}",
            "kind": Kind.NAMES.get(self.kind, str(self.kind)),
            "op": self.op_text or None,
            "dtype": self.dtype_text or None,
            "shape": None if self.shape is None else tuple(self.shape),
            "root": self.root,
            "status": ("ok" if self.error is None
                       else f"refused ({type(self.error).__name__}: {self.error})"),
        }

    def title(self) -> str:
        """``allreduce #3 (version 1)``."""
        return f"{Kind.NAMES.get(self.kind, self.kind)} #{self.seqno} (version {self.version})"


def mismatched_fields(reduced: np.ndarray) -> List[str]:
    """Names of the fields on which ranks disagree, from the reduced vector."""
    n = len(_FIELDS)
    maxs, neg_mins = reduced[:n], reduced[n:]
    return [name for name, hi, neg_lo in zip(_FIELDS, maxs, neg_mins)
            if hi != WILDCARD and hi != -neg_lo]


def describe_mismatch(rank: int, mine: Signature, fields: Sequence[str],
                      everyone: Sequence[Dict[str, Any]]) -> str:
    """The message of a ``CollectiveMismatchError``: which ranks differ and how.

    Args:
        rank: the rank raising the error.
        mine: its signature.
        fields: the mismatched fields (from :func:`mismatched_fields`).
        everyone: every rank's :meth:`Signature.describe`, in rank order.
    """
    lines = [f"rank {rank}: ranks disagree on collective {mine.title()}:"]
    for name in fields:
        groups: Dict[str, List[int]] = {}
        for r, desc in enumerate(everyone):
            value = desc[name]
            key = "(any)" if value is None else str(value)
            groups.setdefault(key, []).append(r)
        parts = "; ".join(f"{value} on {_ranks(rs)}" for value, rs in groups.items())
        lines.append(f"  {_LABELS[name]}: {parts}")
    if "seqno" in fields or "kind" in fields:
        hint = ("A rank skipped, added or reordered a collective call: every rank must "
                "make the same collective calls in the same order.")
    elif "status" in fields:
        hint = "Fix the input of the rank(s) that refused it; the other ranks were stopped too."
    else:
        hint = ("Every rank must pass the same op, dtype and shape (and the same root "
                "to broadcast) to each collective.")
    lines.append(hint)
    return "\n".join(lines)


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)
