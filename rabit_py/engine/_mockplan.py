"""The mock engine's fault plan: parsing and matching, with no MPI (unit-tested)."""

from __future__ import annotations

from typing import FrozenSet, Tuple

__all__ = ["KillPoint", "parse_plan", "matches"]

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


def matches(plan: FrozenSet[KillPoint], rank: int, version: int, seqno: int,
            trial: int) -> bool:
    """Whether the plan kills ``rank`` at this point of its ``trial``-th life."""
    return (rank, version, seqno, trial) in plan
