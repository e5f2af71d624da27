import numpy as np
import pytest

from rabit_py.ops import DTYPES, Op, check_op_dtype, dtype_code, op_code, op_name

BUILTIN = [Op.MAX, Op.MIN, Op.SUM, Op.PROD, Op.BITOR, Op.BITAND, Op.BITXOR]


def test_rabit_codes_are_kept():
    # A Rabit user's numeric codes keep their meaning.
    assert (Op.MAX, Op.MIN, Op.SUM, Op.BITOR) == (0, 1, 2, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", BUILTIN)
def test_op_dtype_table(op, dtype):
    bit = op in (Op.BITOR, Op.BITAND, Op.BITXOR)
    ok = {"b": op not in (Op.SUM, Op.PROD), "i": True, "u": True,
          "f": not bit, "c": op in (Op.SUM, Op.PROD)}[dtype.kind]
    if ok:
        check_op_dtype(op, dtype)
    else:
        with pytest.raises(TypeError, match=op_name(op)):
            check_op_dtype(op, dtype)


@pytest.mark.parametrize("bad", [7, -1, "SUM", 2.0, True, None])
def test_invalid_ops(bad):
    with pytest.raises(ValueError, match="is not a reduction operator"):
        check_op_dtype(bad, np.float32)


def test_unsupported_dtypes_have_no_code():
    for dtype in (np.dtype(object), np.dtype("U3"), np.dtype(">f8"), np.dtype("datetime64[s]")):
        assert dtype_code(dtype) == 0
        with pytest.raises(TypeError, match="does not support dtype"):
            check_op_dtype(Op.SUM, dtype)
    assert len({dtype_code(d) for d in DTYPES}) == len(DTYPES)


def absmax(a, b):
    return np.where(abs(a) > abs(b), a, b)


def test_custom_op_codes_are_stable_and_distinct():
    a, b = Op.create(absmax), Op.create(absmax)
    assert op_code(a) == op_code(b) >= 1000
    assert op_code(Op.create(absmax, commute=False)) != op_code(a)
    assert op_code(Op.create(np.maximum)) != op_code(Op.create(np.minimum))
    assert "absmax" in op_name(a)
    check_op_dtype(a, np.dtype(object))  # custom reducers decide for themselves


def test_custom_op_needs_a_callable():
    with pytest.raises(TypeError, match="needs a callable"):
        Op.create(3)
