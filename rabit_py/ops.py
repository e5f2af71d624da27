"""Reduction operators, the dtypes they accept, and custom reducers.

``Op.MAX`` ... ``Op.BITXOR`` are small ints (Rabit's codes first, so that a Rabit
user's ``op=2`` still means SUM). ``Op.create(fn)`` makes a :class:`CustomOp`.
This module knows NumPy, not MPI: the engine maps these codes to MPI operators.
"""

from __future__ import annotations

import zlib
from typing import Callable, Dict, NamedTuple, Optional, Union

import numpy as np

__all__ = ["Op", "CustomOp", "MAX", "MIN", "SUM", "PROD", "BITOR", "BITAND", "BITXOR",
           "OpLike", "OpInfo", "OPS", "check_op_dtype", "op_name", "op_code", "DTYPES",
           "dtype_code"]

ReduceFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


class CustomOp:
    """A user-defined reducer, made with :meth:`Op.create`.

    Attributes:
        fn: ``fn(a, b)`` returns the combination of two arrays of the caller's
            shape and dtype (it must not keep references to them).
        commute: whether ``fn(a, b) == fn(b, a)``; if False, MPI applies it in
            rank order.
        name: shown in error messages.
        code: a stable number identifying the reducer across ranks (from its
            module and qualified name), used by the signature check.
    """

    __slots__ = ("fn", "commute", "name", "code")

    def __init__(self, fn: ReduceFn, commute: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"Op.create needs a callable fn(a, b), got {type(fn).__name__}")
        self.fn = fn
        self.commute = bool(commute)
        module = getattr(fn, "__module__", "") or ""
        qualname = (getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
                    or type(fn).__qualname__)
        self.name = f"{module}.{qualname}" if module else qualname
        # Offset past the built-in codes; crc32 is stable across processes,
        # unlike hash() of a str.
        self.code = 1000 + zlib.crc32(f"{self.name}/{self.commute}".encode())

    def __repr__(self) -> str:
        return f"Op.create({self.name}, commute={self.commute})"


class Op:
    """Reduction operators for :func:`rabit_py.allreduce`: pass a member
    (``rabit.Op.SUM``) or a custom reducer made with :meth:`create`."""

    #: element-wise maximum
    MAX = 0
    #: element-wise minimum
    MIN = 1
    #: element-wise sum (floating-point sums are bitwise identical from run to run)
    SUM = 2
    #: bitwise OR (integer and bool arrays)
    BITOR = 3
    #: element-wise product
    PROD = 4
    #: bitwise AND (integer and bool arrays)
    BITAND = 5
    #: bitwise XOR (integer and bool arrays)
    BITXOR = 6

    @staticmethod
    def create(fn: ReduceFn, commute: bool = True) -> CustomOp:
        """Make a custom reducer.

        Args:
            fn: ``fn(a, b)`` returns the element-wise (or any shape-preserving)
                combination of two NumPy arrays of the shape and dtype passed to
                ``allreduce``. It is called with whole arrays, never pieces.
            commute: False if the order of the operands matters; ranks are then
                combined in rank order.

        Returns:
            A :class:`CustomOp` to pass as ``op``.

        Raises:
            TypeError: ``fn`` is not callable.
        """
        return CustomOp(fn, commute)


# Rabit's module-level names for the operators (``rabit.MAX``), same values.
MAX, MIN, SUM, BITOR = Op.MAX, Op.MIN, Op.SUM, Op.BITOR
PROD, BITAND, BITXOR = Op.PROD, Op.BITAND, Op.BITXOR

OpLike = Union[int, CustomOp]


class OpInfo(NamedTuple):
    """What each layer calls a built-in op (the one table of them)."""

    name: str
    ufunc: np.ufunc                 # NumPy: shared-memory and host reductions
    mpi: str                        # the mpi4py.MPI operator's name
    mpi_bool: str                   # its name on C_BOOL (MPI has only logical ones)
    nccl: Optional[str]             # the NCCL operator's name, None if NCCL has none


OPS: Dict[int, OpInfo] = {
    Op.MAX: OpInfo("MAX", np.maximum, "MAX", "LOR", "NCCL_MAX"),
    Op.MIN: OpInfo("MIN", np.minimum, "MIN", "LAND", "NCCL_MIN"),
    Op.SUM: OpInfo("SUM", np.add, "SUM", "", "NCCL_SUM"),
    Op.BITOR: OpInfo("BITOR", np.bitwise_or, "BOR", "LOR", None),
    Op.PROD: OpInfo("PROD", np.multiply, "PROD", "", "NCCL_PROD"),
    Op.BITAND: OpInfo("BITAND", np.bitwise_and, "BAND", "LAND", None),
    Op.BITXOR: OpInfo("BITXOR", np.bitwise_xor, "BXOR", "LXOR", None),
}
_NAMES = {code: info.name for code, info in OPS.items()}
_BIT_OPS = frozenset({Op.BITOR, Op.BITAND, Op.BITXOR})
_ORDER_OPS = frozenset({Op.MAX, Op.MIN})
_ARITH_OPS = frozenset({Op.SUM, Op.PROD})

# Every dtype rabit_py reduces, with its signature-check code. Order is fixed:
# codes travel between ranks.
DTYPES = tuple(np.dtype(t) for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "float16", "float32", "float64", "complex64", "complex128"))
_DTYPE_CODES = {dt: i + 1 for i, dt in enumerate(DTYPES)}


def dtype_code(dtype: np.dtype) -> int:
    """The signature-check code of a dtype (0 for one rabit_py cannot reduce)."""
    dtype = np.dtype(dtype)
    # A byte-swapped array would be reduced as garbage by MPI: refuse it.
    return _DTYPE_CODES.get(dtype, 0) if dtype.isnative else 0


def op_name(op: OpLike) -> str:
    """A readable name for an op, for messages."""
    if isinstance(op, CustomOp):
        return repr(op)
    return "Op." + _NAMES.get(op, f"<invalid {op!r}>")


def op_code(op: OpLike) -> int:
    """The signature-check code of an op."""
    return op.code if isinstance(op, CustomOp) else int(op)


def check_op_dtype(op: OpLike, dtype: np.dtype) -> None:
    """Refuse an op/dtype pair that has no meaning.

    Raises:
        ValueError: ``op`` is not an ``Op`` code nor a ``CustomOp``.
        TypeError: the dtype is not reducible, or the op does not apply to it
            (bit ops on floats, MAX on complex, SUM/PROD on bool).
    """
    if isinstance(op, CustomOp):
        return
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)) or int(op) not in _NAMES:
        raise ValueError(
            f"op={op!r} is not a reduction operator; use rabit.Op.MAX, MIN, SUM, PROD, "
            f"BITOR, BITAND, BITXOR or rabit.Op.create(fn)")
    dtype = np.dtype(dtype)
    if dtype_code(dtype) == 0:
        raise TypeError(
            f"allreduce does not support dtype {dtype}; supported: "
            f"{', '.join(str(d) for d in DTYPES)}")
    kind = dtype.kind
    if op in _BIT_OPS and kind not in "biu":
        raise TypeError(
            f"{op_name(op)} needs an integer or bool array, got {dtype}; "
            f"view the bits as an integer dtype (e.g. a.view(np.uint32)) if that is what you mean")
    if op in _ORDER_OPS and kind == "c":
        raise TypeError(f"{op_name(op)} is undefined for complex dtype {dtype}")
    if op in _ARITH_OPS and kind == "b":
        raise TypeError(
            f"{op_name(op)} on a bool array is ambiguous; use Op.BITOR/BITAND (logical or/and), "
            f"or convert to an integer dtype to count")
