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

A call is described once, as a :data:`Call` (``allreduce_call``,
``allgather_call``, the engine's ``broadcast_input``): the same description
feeds this check and the robust engine's replay check, which compares a
replacement's call with the one whose result the survivors kept
(:func:`replay_key`, :func:`same_call`; ``None`` fields match anything, as
here).

The check itself is always the same collective, whatever call each rank is
making, so it cannot deadlock on a kind mismatch.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..ops import dtype_code, op_code, op_name

__all__ = ["Kind", "Signature", "WILDCARD", "N_FIELDS", "shape_code", "fill_vector",
           "agrees", "mismatched_fields", "describe_mismatch", "Call", "OBJECT",
           "call_values", "call_signature", "shown", "allreduce_call", "allgather_call",
           "replay_key", "same_call", "CheckVector"]

WILDCARD = int(np.iinfo(np.int64).min)


class Kind:
    """Codes of the calls that take part in the check."""

    ALLREDUCE = 1
    BROADCAST = 2
    ALLGATHER = 3
    CHECKPOINT = 4
    LOAD_CHECKPOINT = 5
    FINALIZE = 6
    LAZY_CHECKPOINT = 7     # told apart in the check: it exchanges no local models

    NAMES = {1: "allreduce", 2: "broadcast", 3: "allgather", 4: "checkpoint",
             5: "load_checkpoint", 6: "finalize", 7: "lazy_checkpoint"}


# The dtype of a broadcast root that sends a pickled object instead of an array.
OBJECT = "object"
OBJECT_DTYPE = 99

# What a rank says of its call: (op, dtype, shape, root), None for "any".
# allgather passes -1 as the first dimension, which may differ between ranks.
Call = Tuple[Any, Any, Optional[Tuple[int, ...]], Optional[int]]

_FIELDS = ("version", "seqno", "kind", "op", "dtype", "shape", "root", "status")
_LABELS = {"version": "version", "seqno": "call number", "kind": "call", "op": "op",
           "dtype": "dtype", "shape": "shape", "root": "root",
           "status": "input"}


N_FIELDS = len(_FIELDS)


def shape_code(shape: Tuple[Any, ...]) -> int:
    """A non-negative number for a shape. ``hash`` of a tuple of ints is not
    salted per process (only str/bytes hashes are), so ranks agree on it."""
    return hash(tuple(shape)) & 0x3FFFFFFFFFFFFFFF


def fill_vector(vec: np.ndarray, values: Sequence[Optional[int]]) -> np.ndarray:
    """Write ``[fields, -fields]`` into ``vec`` (length ``2 * N_FIELDS``).

    ``values`` are the fields in ``_FIELDS`` order, ``None`` for a wildcard.
    Negating ``WILDCARD`` wraps to itself, so wildcards are ``WILDCARD`` in
    both halves and take no part in the MAX.
    """
    vec[:N_FIELDS] = [WILDCARD if v is None else v for v in values]
    np.negative(vec[:N_FIELDS], out=vec[N_FIELDS:])
    return vec


def agrees(reduced: np.ndarray) -> bool:
    """Whether the reduced vector shows every field equal on all ranks.

    For each field, max == -(max of -x) == min when all contributors agree; an
    all-wildcard field is ``WILDCARD`` in the first half. (Python ints: a
    16-element ``tolist`` beats NumPy's per-call overhead here.)
    """
    values = reduced.tolist()
    # An all-wildcard field is WILDCARD in both halves (one list comparison
    # is 0.45 us cheaper than a generator over the pairs).
    return values[:N_FIELDS] == [lo if lo == WILDCARD else -lo for lo in values[N_FIELDS:]]


class CheckVector:
    """The vector this rank contributes to the check, filled on the hot path.

    A call's fields but its version and call number repeat from call to call
    (a training loop makes the same few calls over and over), so each distinct
    call is packed once into a template of ``[fields, -fields]`` bytes and
    each check copies it and writes the two numbers that change. After the
    ``Allreduce(MAX)``, a vector that came back as it went out means that
    every rank sent these very fields (every field's maximum and minimum are
    this rank's), the check's common outcome, decided by one comparison of
    bytes; anything else goes through :func:`agrees` (wildcards, mismatches).
    Filling it thus costs 0.3 us where :func:`call_values` and
    :func:`fill_vector` cost 1.6 us (8-byte allreduce, development VM).
    """

    _LIMIT = 256                # distinct calls remembered (shapes may vary)

    def __init__(self) -> None:
        self.vec = np.empty(2 * N_FIELDS, dtype=np.int64)
        self._bytes = memoryview(self.vec).cast("B")
        self._templates: Dict[Tuple[int, Optional[Call]], bytes] = {}

    def fill(self, version: int, seqno: int, kind: int, call: Optional[Call],
             error: Optional[BaseException]) -> Optional[bytes]:
        """Write this rank's vector for a call into :attr:`vec`; returns the
        bytes written, or None for a refused input (``error``), whose vector
        is written the slow way and always goes through :func:`agrees`."""
        if error is not None:
            fill_vector(self.vec, call_values(version, seqno, kind, call, error))
            return None
        key = (kind, call)
        template = self._templates.get(key)
        if template is None:
            if len(self._templates) >= self._LIMIT:
                self._templates.clear()
            template = fill_vector(self.vec, call_values(0, 0, kind, call, None)).tobytes()
            self._templates[key] = template
        self._bytes[:] = template
        _PAIR.pack_into(self.vec, 0, version, seqno)
        _PAIR.pack_into(self.vec, _NEGATED, -version, -seqno)
        return self.vec.tobytes()

    def agreed(self, sent: Optional[bytes]) -> bool:
        """Whether the reduced :attr:`vec` shows every rank agreeing, ``sent``
        being what :meth:`fill` returned."""
        return (sent is not None and self.vec.tobytes() == sent) or agrees(self.vec)


# version and call number lead each half of the vector.
_PAIR = struct.Struct("=2q")
_NEGATED = N_FIELDS * 8


def mismatched_fields(reduced: np.ndarray) -> List[str]:
    """Names of the fields on which ranks disagree, from the reduced vector."""
    values = reduced.tolist()           # Python ints: -INT64_MIN does not overflow
    maxs, neg_mins = values[:N_FIELDS], values[N_FIELDS:]
    return [name for name, hi, neg_lo in zip(_FIELDS, maxs, neg_mins)
            if hi != WILDCARD and hi != -neg_lo]


def allreduce_call(op: Any, data: Any) -> Call:
    """The description of an allreduce of ``data`` (NumPy or device array)."""
    return (op, data.dtype, tuple(data.shape), None)


def allgather_call(data: Any) -> Optional[Call]:
    """The description of an allgather of ``data``: its dtype and trailing
    shape (the number of rows may differ between ranks); None for an input
    that is not an array (the call refuses it)."""
    shape = getattr(data, "shape", None)
    if shape is None or not hasattr(data, "dtype"):
        return None
    return (None, data.dtype, (-1,) + tuple(shape[1:]), None)


def replay_key(call: Optional[Call]) -> Optional[Call]:
    """A call's description as the robust engine's result cache sends it to a
    replacement: picklable (an op's code, not the op object: a custom op's
    function need not pickle, and the replacement's own op object is another
    one). Idempotent."""
    if call is None:
        return None
    op, dtype, shape, root = call
    return (None if op is None else op_code(op), dtype,
            None if shape is None else tuple(shape), root)


def same_call(a: Optional[Call], b: Optional[Call]) -> bool:
    """Whether two :func:`replay_key` descriptions (of calls of one kind) can
    be of the same call: every field equal where both ranks described it
    (None: nothing described)."""
    if a is None or b is None:
        return True
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def shown(kind: int, call: Optional[Call]) -> str:
    """A :func:`replay_key` description for a message: ``broadcast (dtype
    float64, shape (4,), root 0)``; fields described as "any" are left out."""
    op, dtype, shape, root = call if call is not None else (None, None, None, None)
    parts = []
    if op is not None:
        parts.append(f"op {op_name(op) if op < 1000 else f'custom op #{op}'}")
    if dtype is not None:
        parts.append(f"dtype {dtype}")
    if shape is not None:
        parts.append(f"shape {_shape_text(shape)}")
    if root is not None:
        parts.append(f"root {root}")
    name = Kind.NAMES.get(kind, str(kind))
    return f"{name} ({', '.join(parts)})" if parts else name


def call_values(version: int, seqno: int, kind: int, call: Optional[Call],
                error: Optional[BaseException]) -> Tuple[Optional[int], ...]:
    """The fields of a call in ``_FIELDS`` order (the fast path: no texts).

    A refused call (``error``) describes nothing but its position and status.
    """
    if call is None or error is not None:
        return (version, seqno, kind, None, None, None, None, 0 if error is None else 1)
    op, dtype, shape, root = call
    return (version, seqno, kind,
            None if op is None else op_code(op),
            None if dtype is None else (OBJECT_DTYPE if dtype is OBJECT else dtype_code(dtype)),
            None if shape is None else shape_code(shape),
            root, 0)


def call_signature(version: int, seqno: int, kind: int, call: Optional[Call],
                   error: Optional[BaseException]) -> "Signature":
    """The readable signature of a call (the slow path, for messages)."""
    if call is None or error is not None:
        return Signature(version, seqno, kind, error=error)
    op, dtype, shape, root = call
    return Signature(version, seqno, kind,
                     op=None if op is None else op_code(op),
                     op_text="" if op is None else op_name(op),
                     dtype=None if dtype is None else (
                         OBJECT_DTYPE if dtype is OBJECT else dtype_code(dtype)),
                     dtype_text="" if dtype is None else str(dtype),
                     shape=shape, root=root)


@dataclasses.dataclass
class Signature:
    """One rank's description of a collective call, for messages.

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
    shape: Optional[Tuple[Any, ...]] = None
    root: Optional[int] = None
    error: Optional[BaseException] = None

    def values(self) -> Tuple[Optional[int], ...]:
        """The fields in ``_FIELDS`` order."""
        return (self.version, self.seqno, self.kind, self.op, self.dtype,
                None if self.shape is None else shape_code(self.shape), self.root,
                0 if self.error is None else 1)

    def vector(self) -> np.ndarray:
        """The ``[fields, -fields]`` vector for the agreement allreduce."""
        return fill_vector(np.empty(2 * N_FIELDS, dtype=np.int64), self.values())

    def describe(self) -> Dict[str, Any]:
        """Readable values of the fields, for the mismatch message."""
        return {
            "version": self.version,
            "seqno": f"#{self.seqno}",
            "kind": Kind.NAMES.get(self.kind, str(self.kind)),
            "op": self.op_text or None,
            "dtype": self.dtype_text or None,
            "shape": None if self.shape is None else _shape_text(self.shape),
            "root": self.root,
            "status": ("ok" if self.error is None
                       else f"refused ({type(self.error).__name__}: {self.error})"),
        }

    def title(self) -> str:
        """``allreduce #3 (version 1)``."""
        return f"{Kind.NAMES.get(self.kind, self.kind)} #{self.seqno} (version {self.version})"


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


def _shape_text(shape: Tuple[int, ...]) -> str:
    dims = ["*" if d == -1 else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)
