"""The engine's own messages after a revoke (Note [sealed messages] in
rabit_py/engine/_control.py): the crossing that a storm of kills showed as
``UnpicklingError: invalid load key, '\\x05'`` on a repairing rank."""

import json
import pickle
import sys

import pytest

from rabit_py.engine import _control as control

from .._proc import rabit_run, run


def _program_outcomes(ranks: int, program: str, *args: str):
    """Run ``program`` on ``ranks`` ranks; its ``OUTCOMES {json}`` lines by rank."""
    code, out = run(rabit_run(ranks, sys.executable, program, *args), timeout=180)
    assert code == 0, out[-4000:]
    found = {}
    for line in out.splitlines():
        if line.startswith("OUTCOMES "):
            counts = json.loads(line[len("OUTCOMES "):])
            found[counts.pop("rank")] = counts
    assert sorted(found) == list(range(ranks)), out[-4000:]
    return found, out


def _outcomes(path: str, call: str):
    return _program_outcomes(3, "tests/programs/interrupted_exchange.py", "--path", path,
                             "--call", call)


def test_an_interrupted_mpi4py_allgather_returns_a_buffer_never_filled():
    # The cause, reproduced: mpi4py's allgather of objects (what the repair's
    # "who is alive" and the spare pool's exchanges used) returns success on a
    # rank whose peer revoked between the sizes and the bytes, and unpickles
    # memory that was never filled. Before the fix this escaped the repair as
    # an uncaught UnpicklingError.
    found, out = _outcomes("mpi4py", "allgather")
    broken = sum(c["garbage"] + c["wrong"] for c in found.values())
    assert broken >= 1, out[-4000:]
    assert "UnpicklingError" in out or "Error" in out, out[-4000:]


@pytest.mark.parametrize("call", ["allgather", "bcast"])
def test_a_sealed_exchange_is_interrupted_never_garbage(call):
    # The same interruption on rabit_py's control messages: every trial
    # either ends with an MPI error of class MPI_ERR_REVOKED (which the
    # repair loop and the call frame recover from) or returns the objects
    # sent; never another exception, never other objects.
    found, out = _outcomes("sealed", call)
    revoker = 2 if call == "allgather" else 0
    assert found[revoker]["revoker"] == 60, found
    for rank, counts in found.items():
        if rank == revoker:
            continue
        assert counts["garbage"] == 0 and counts["wrong"] == 0, (rank, counts, out[-4000:])
        assert counts["interrupted"] + counts["ok"] == 60, (rank, counts)
        assert counts["interrupted"] >= 1, (rank, counts)
    assert "GARBAGE" not in out, out[-4000:]


# ------------------------------------------------------- the seal, without MPI
def test_a_sealed_message_opens_to_the_object_sent():
    obj = {"dead": [1, 3], "state": list(range(50))}
    assert control.unseal(control.seal(obj, "repair.alive"), "repair.alive") == obj


@pytest.mark.parametrize("damage, words", [
    (lambda m: bytes(len(m)), "no seal"),                                   # never filled
    (lambda m: m[:len(m) // 2], "bytes arrived"),                           # half of it
    (lambda m: m[:-1] + bytes([m[-1] ^ 1]), "CRC-32C"),                     # one bit flipped
    (lambda m: m[:8], "shorter than its seal"),
    (lambda m: control.seal(("x", 1), "repair.holdings"), "another exchange"),
    (lambda m: pickle.dumps(("x", 1)), "no seal"),                           # a bare pickle
])
def test_a_damaged_or_foreign_message_is_an_interrupted_exchange(damage, words):
    message = control.seal(("x", 1), "repair.alive")
    with pytest.raises(control.InterruptedExchange) as caught:
        control.unseal(damage(message), "repair.alive")
    assert words in str(caught.value)
    assert caught.value.Get_error_class() == control.ERR_REVOKED


def test_a_call_stamp_keeps_the_version_and_the_call_number():
    for version, seqno in [(0, 0), (3, 17), (123456, 2 ** 31 - 1)]:
        assert control.stamp_parts(control.stamp(version, seqno)) == (version, seqno)
    assert control.stamp(1, 0) != control.stamp(0, 1)


def _hierarchy_outcomes(*flags):
    return _program_outcomes(4, "tests/programs/interrupted_hierarchy.py", *flags)[0]


def test_a_leader_whose_step_was_revoked_gives_its_node_no_partial_sum():
    # A rank killed inside a hierarchical allreduce must not leave every
    # rank's model different from the failure-free run's (docs/observed.md,
    # the _shm communicators). A leader whose leaders'
    # step is revoked must not hand its group's own sum to its node as the
    # result. Without the reducer's revoke check its node peer takes the
    # partial sum as a success:
    unchecked = _hierarchy_outcomes("--unchecked")
    assert unchecked[3]["partial"] >= 1, unchecked
    # With it, every trial is an interrupted call on every rank:
    checked = _hierarchy_outcomes()
    assert checked[2]["revoker"] == 30, checked
    for rank in (0, 1, 3):
        assert checked[rank] == {"ok": 0, "partial": 0, "interrupted": 30, "revoker": 0}, \
            (rank, checked)
    # The robust engine's protocol (Note [kept results]): the node peers wait
    # on their leader's "done" flag, and leave when it revokes the node.
    kept = _hierarchy_outcomes("--kept")
    assert kept[2]["revoker"] == 30, kept
    for rank in (0, 1, 3):
        assert kept[rank] == {"ok": 0, "partial": 0, "interrupted": 30, "revoker": 0}, \
            (rank, kept)
