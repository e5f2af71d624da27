import pickle

import numpy as np

from rabit_py.engine._signature import (Kind, Signature, describe_mismatch,
                                        mismatched_fields)


def reduce_max(signatures):
    """What the agreement Allreduce(MAX) computes, done locally."""
    return np.max(np.stack([s.vector() for s in signatures]), axis=0)


def sig(**kw):
    base = dict(version=0, seqno=3, kind=Kind.ALLREDUCE, op=2, op_text="Op.SUM", dtype=11,
                dtype_text="float32", shape=(4,))
    base.update(kw)
    return Signature(**base)


def test_equal_signatures_agree():
    assert mismatched_fields(reduce_max([sig(), sig(), sig()])) == []


def test_each_field_difference_is_found():
    assert mismatched_fields(reduce_max([sig(), sig(shape=(5,))])) == ["shape"]
    assert mismatched_fields(reduce_max([sig(), sig(dtype=12)])) == ["dtype"]
    assert mismatched_fields(reduce_max([sig(), sig(op=0)])) == ["op"]
    assert mismatched_fields(reduce_max([sig(), sig(seqno=4)])) == ["seqno"]
    assert mismatched_fields(reduce_max([sig(), sig(kind=Kind.BROADCAST)])) == ["kind"]
    assert mismatched_fields(reduce_max([sig(), sig(error=ValueError("x"))])) == ["status"]
    # shapes with the same element count still differ
    assert mismatched_fields(reduce_max([sig(shape=(2, 3)), sig(shape=(3, 2))])) == ["shape"]


def test_wildcards_take_no_part():
    receivers = [Signature(0, 1, Kind.BROADCAST, root=0) for _ in range(3)]
    root = Signature(0, 1, Kind.BROADCAST, dtype=99, root=0)
    assert mismatched_fields(reduce_max(receivers + [root])) == []
    # a receiver passing an array must match the root's dtype
    bad = Signature(0, 1, Kind.BROADCAST, dtype=11, shape=(4,), root=0)
    assert mismatched_fields(reduce_max([root, bad])) == ["dtype"]


def test_message_names_ranks_and_values():
    sigs = [sig(), sig(), sig(shape=(5,)), sig()]
    fields = mismatched_fields(reduce_max(sigs))
    message = describe_mismatch(0, sigs[0], fields, [s.describe() for s in sigs])
    assert message.startswith("rank 0: ranks disagree on collective allreduce #3 (version 0):")
    assert "  shape: (4,) on ranks 0,1,3; (5,) on rank 2" in message
    assert "same op, dtype and shape" in message


def test_message_for_a_skipped_call():
    sigs = [sig(), Signature(0, 2, Kind.FINALIZE)]
    fields = mismatched_fields(reduce_max(sigs))
    assert "kind" in fields and "seqno" in fields
    message = describe_mismatch(1, sigs[1], fields, [s.describe() for s in sigs])
    assert "  call: allreduce on rank 0; finalize on rank 1" in message
    assert "skipped, added or reordered" in message


def test_replay_descriptions_match_with_the_checks_wildcards():
    from rabit_py.engine._signature import (allgather_call, allreduce_call, replay_key,
                                            same_call, shown)
    from rabit_py.ops import Op

    absmax = Op.create(lambda a, b: np.maximum(np.abs(a), np.abs(b)))
    mine = replay_key(allreduce_call(absmax, np.zeros((2, 3), np.float32)))
    # A replacement's op object is another one; its code is the same.
    again = replay_key(allreduce_call(Op.create(lambda a, b: np.maximum(np.abs(a), np.abs(b))),
                                      np.zeros((2, 3), np.float32)))
    assert mine == again and same_call(mine, again)
    assert replay_key(mine) == mine                      # served on by a replacement
    assert pickle.loads(pickle.dumps(mine)) == mine
    assert not same_call(mine, replay_key(allreduce_call(Op.SUM, np.zeros((2, 3), np.float32))))
    assert not same_call(mine, replay_key(allreduce_call(absmax, np.zeros((3, 2), np.float32))))
    # A broadcast receiver that passed None described its root only.
    root_side = replay_key((None, np.dtype(np.float64), (4,), 0))
    assert same_call(root_side, (None, None, None, 0))
    assert not same_call(root_side, (None, None, None, 1))
    assert not same_call(root_side, (None, np.dtype(np.float32), (4,), 0))
    # Allgather: the number of rows may differ, the row shape may not.
    rows = replay_key(allgather_call(np.zeros((5, 2))))
    assert same_call(rows, replay_key(allgather_call(np.zeros((1, 2)))))
    assert not same_call(rows, replay_key(allgather_call(np.zeros((5, 3)))))
    assert allgather_call([1, 2]) is None
    assert shown(Kind.ALLGATHER, rows) == "allgather (dtype float64, shape (*, 2))"
    assert shown(Kind.BROADCAST, (None, None, None, 0)) == "broadcast (root 0)"
    assert shown(Kind.ALLREDUCE, replay_key(allreduce_call(Op.SUM, np.zeros(3)))) == \
        "allreduce (op Op.SUM, dtype float64, shape (3,))"
    assert shown(Kind.ALLREDUCE, mine).startswith("allreduce (op custom op #")


# --- CheckVector: the hot path's fill and verdict must equal the slow path's.

from rabit_py.engine._signature import (CheckVector, OBJECT, agrees,  # noqa: E402
                                        call_values, fill_vector)

CALLS = [
    (Kind.ALLREDUCE, (2, np.dtype(np.float32), (4,), None)),
    (Kind.ALLREDUCE, (0, np.dtype(np.int64), (2, 3), None)),
    (Kind.BROADCAST, (None, np.dtype(np.float64), (7,), 1)),
    (Kind.BROADCAST, (None, OBJECT, None, 0)),          # the root of an object
    (Kind.BROADCAST, (None, None, None, 0)),            # a receiver that passed None
    (Kind.ALLGATHER, (None, np.dtype(np.uint8), (-1, 5), None)),
    (Kind.LAZY_CHECKPOINT, None),
]


def slow_vector(version, seqno, kind, call, error=None):
    return fill_vector(np.empty(16, np.int64), call_values(version, seqno, kind, call, error))


def test_check_vector_writes_what_the_slow_path_writes():
    check = CheckVector()
    for version, seqno in [(0, 0), (3, 17), (2**40, 2**31 - 1), (1, 5)]:
        for kind, call in CALLS:
            sent = check.fill(version, seqno, kind, call, None)
            expected = slow_vector(version, seqno, kind, call)
            assert np.array_equal(check.vec, expected), (version, seqno, kind, call)
            assert sent == expected.tobytes()


def test_check_vector_verdict_equals_agrees():
    def verdict(rank_calls, me):
        vectors = [slow_vector(1, 9, kind, call) for kind, call in rank_calls]
        check = CheckVector()
        sent = check.fill(1, 9, *rank_calls[me], None)
        check.vec[:] = np.max(np.stack(vectors), axis=0)
        return check.agreed(sent), agrees(check.vec)

    same = [CALLS[0]] * 3
    assert verdict(same, 0) == (True, True)
    # a receiver's wildcards differ from the reduced vector, yet all agree
    root, receiver = CALLS[3], CALLS[4]
    assert verdict([root, receiver, receiver], 1) == (True, True)
    assert verdict([root, receiver, receiver], 0) == (True, True)
    # a different shape, op, kind: every rank sees the mismatch
    for other in (CALLS[1], CALLS[2], CALLS[6]):
        for me in (0, 1):
            assert verdict([CALLS[0], other], me) == (False, False)


def test_check_vector_call_number_and_version_are_checked():
    check, other = CheckVector(), CheckVector()
    sent = check.fill(2, 5, *CALLS[0], None)
    other.fill(2, 6, *CALLS[0], None)                   # one call ahead
    check.vec[:] = np.maximum(check.vec, other.vec)
    assert not check.agreed(sent)
    assert mismatched_fields(check.vec) == ["seqno"]
    sent = check.fill(2, 5, *CALLS[0], None)
    other.fill(3, 5, *CALLS[0], None)                   # one version ahead
    check.vec[:] = np.maximum(check.vec, other.vec)
    assert mismatched_fields(check.vec) == ["version"]


def test_check_vector_refused_input_takes_the_slow_path():
    check = CheckVector()
    error = ValueError("bad input")
    assert check.fill(1, 2, Kind.ALLREDUCE, CALLS[0][1], error) is None
    assert np.array_equal(check.vec, slow_vector(1, 2, Kind.ALLREDUCE, CALLS[0][1], error))
    assert check.agreed(None)                          # everyone refused alike
    ok = slow_vector(1, 2, Kind.ALLREDUCE, CALLS[0][1])
    check.vec[:] = np.maximum(check.vec, ok)
    assert not check.agreed(None)
    assert mismatched_fields(check.vec) == ["status"]


def test_check_vector_remembers_a_bounded_number_of_calls():
    check = CheckVector()
    for n in range(1, 3 * CheckVector._LIMIT):
        call = (2, np.dtype(np.float32), (n,), None)
        check.fill(0, n, Kind.ALLREDUCE, call, None)
        assert len(check._templates) <= CheckVector._LIMIT
        assert np.array_equal(check.vec, slow_vector(0, n, Kind.ALLREDUCE, call))
