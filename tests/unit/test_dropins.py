"""The drop-ins' behaviour that needs no job: outside a job, argument forms,
and the order in which mpi4py combines objects (tests/jobs/test_dropins.py runs
them in real jobs)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import rabit_py
import rabit_py.collective as collective
import rabit_py.rabit as rabit
from rabit_py import mpi4py as dropin
from rabit_py.config import from_rabit_args


# ------------------------------------------------------------------ Rabit's arguments
def test_rabit_arguments_become_settings():
    argv = ["prog.py", "--flag", "mock=0,0,1,0", b"mock=1,2,3,0", b"DMLC_TASK_ID=7",
            "rabit_tracker_uri=10.0.0.1", "rabit_timeout_sec=30", "rabit_local_replica=2",
            "rabit_debug=1"]
    engine, settings = from_rabit_args(argv, "mock")
    assert engine == "mock"
    assert settings == {"mock": "0,0,1,0;1,2,3,0", "timeout": 30.0, "replicas": 2,
                        "log_level": "DEBUG"}
    assert from_rabit_args(None) == ("auto", {})
    assert from_rabit_args(["mock=0,0,1,0"], "standard") == ("auto", {})   # Rabit ignores it too
    assert from_rabit_args([b"dmlc_timeout=5"], "mpi") == ("auto", {"timeout": 5.0})


def test_bad_rabit_arguments_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="lib='nccl' is not one of Rabit's libraries"):
        from_rabit_args([], "nccl")
    with pytest.raises(TypeError, match="a list of 'key=value' strings"):
        from_rabit_args("mock=0,0,1,0")
    with pytest.raises(ValueError, match="rabit_timeout_sec='soon'"):
        from_rabit_args(["rabit_timeout_sec=soon"])
    # Through rabit_py.init, before anything starts.
    with pytest.raises(ValueError, match="lib='nccl'"):
        rabit_py.init(["prog.py"], lib="nccl")
    with pytest.raises(ValueError, match="lib='nccl'"):
        rabit.init(["prog.py"], lib="nccl")


def test_rabit_operator_names_have_rabits_values():
    assert (rabit_py.MAX, rabit_py.MIN, rabit_py.SUM, rabit_py.BITOR) == (0, 1, 2, 3)
    assert (rabit.MAX, rabit.MIN, rabit.SUM, rabit.BITOR) == (0, 1, 2, 3)
    assert [int(op) for op in rabit.Op] == [0, 1, 2, 3] and rabit.Op.OR == rabit.BITOR


# ------------------------------------------------------------------ outside a job
def test_rabit_outside_a_job_is_one_rank_with_rabits_in_place_rule():
    assert rabit.get_rank() == 0 and rabit.get_world_size() == 1
    assert not rabit.is_distributed() and rabit.version_number() == 0
    assert rabit.load_checkpoint() == (0, None)
    assert rabit.load_checkpoint(True) == (0, None, None)
    assert rabit.get_processor_name() == socket.gethostname().encode()
    owned = np.arange(6.0).reshape(2, 3).copy()
    out = rabit.allreduce(owned, rabit.SUM)
    assert out.shape == (6,) and np.shares_memory(out, owned)
    view = np.arange(8, dtype=np.int32)[2:6]
    out = rabit.allreduce(view, rabit.MAX)
    assert out.tolist() == [2, 3, 4, 5] and not np.shares_memory(out, view)
    filled = np.zeros(3)
    out = rabit.allreduce(filled[:2], rabit.SUM, prepare_fun=lambda b: b.fill(4.0))
    assert out.tolist() == [4.0, 4.0], "the prepared values must reach a copied buffer"
    assert rabit.broadcast({"a": 1}, 0) == {"a": 1}
    with pytest.raises(AssertionError, match="need to pass in data"):
        rabit.broadcast(None, 0)


def test_rabit_refuses_what_rabit_refuses():
    with pytest.raises(TypeError, match="only takes in numpy.ndarray"):
        rabit.allreduce([1, 2], rabit.SUM)
    with pytest.raises(TypeError, match="data type float16 not supported"):
        rabit.allreduce(np.zeros(2, np.float16), rabit.SUM)
    with pytest.raises(ValueError, match="not one of Rabit's operators"):
        rabit.allreduce(np.zeros(2), 4)
    with pytest.raises(rabit_py.NotInitializedError):
        rabit.checkpoint({"w": 1})


def test_collective_outside_a_job_is_one_rank_and_never_writes_its_input():
    assert collective.get_rank() == 0 and collective.get_world_size() == 1
    assert collective.is_distributed() is False
    assert collective.get_processor_name() == socket.gethostname()
    data = np.arange(6, dtype=np.int16).reshape(3, 2)
    out = collective.allreduce(data, collective.Op.SUM)
    assert out.shape == (6,) and out.tolist() == list(range(6))
    assert not np.shares_memory(out, data)
    assert collective.broadcast([1, 2], 0) == [1, 2]
    for bad in ([1.0], np.array([True]), np.array([1 + 2j]), np.array(["x"])):
        with pytest.raises(TypeError):
            collective.allreduce(bad, collective.Op.SUM)
    with pytest.raises(AssertionError):
        collective.broadcast(None, 0)


def test_collective_has_xgboosts_operator_values_and_config():
    assert [(op.name, int(op)) for op in collective.Op] == [
        ("MAX", 0), ("MIN", 1), ("SUM", 2), ("BITWISE_AND", 3), ("BITWISE_OR", 4),
        ("BITWISE_XOR", 5)]
    args = {"dmlc_tracker_uri": "x"}
    config = collective.Config(retry=2, timeout=9, worker_port=lambda: 1234)
    assert config.get_comm_config(dict(args)) == {"dmlc_tracker_uri": "x", "dmlc_retry": 2,
                                                   "dmlc_timeout": 9}
    config.update_worker_args(args)
    assert args == {"dmlc_tracker_uri": "x", "dmlc_retry": 2, "dmlc_timeout": 9,
                    "dmlc_worker_port": 1234}
    with pytest.raises(ValueError, match="federated communicator is not supported"):
        collective.init(dmlc_communicator="federated")


# ------------------------------------------------------------------ mpi4py
@pytest.mark.parametrize("size, shape", [
    (1, "0"), (2, "(01)"), (3, "((01)2)"), (4, "((01)(23))"), (5, "(((01)(23))4)"),
    (6, "(((01)(23))(45))"), (8, "(((01)(23))((45)(67)))")])
def test_objects_are_combined_in_mpi4pys_tree_order(size, shape):
    # mpi4py's reduce toward rank 0: at step m, rank r (a multiple of 2m)
    # takes op(own, value of r + m). A non-associative op shows the shape.
    assert dropin._tree_reduce([str(r) for r in range(size)], lambda a, b: f"({a}{b})") == shape


def test_buffer_specs_name_the_memory_mpi4py_names():
    buf = np.arange(10, dtype=np.float64)
    assert dropin._message(buf, "x").tolist() == list(range(10))
    assert dropin._message([buf, "d"], "x").base is not None
    assert dropin._message([buf, 3, "d"], "x").tolist() == [0, 1, 2]
    assert dropin._message([buf, (3, 4), "d"], "x").tolist() == [4, 5, 6]
    assert dropin._message([buf, 2, 8, "d"], "x").tolist() == [8, 9]
    as_ints = dropin._message([buf, "i8"], "x")
    assert as_ints.dtype == np.int64 and np.shares_memory(as_ints, buf)
    raw = bytearray(8)
    dropin._message([raw, "i4"], "x")[1] = 7
    assert raw[4] == 7
    with pytest.raises(ValueError, match="past the buffer"):
        dropin._message([buf, (5, 8), "d"], "x")
    with pytest.raises(BufferError, match="not contiguous"):
        dropin._message(buf[::2], "x")
    with pytest.raises(TypeError, match="does not expose a buffer"):
        dropin._message(3.0, "x")
    whole, counts, displs = dropin._vector([buf, [1, 2, 3], "d"], 3, "x")
    assert counts == [1, 2, 3] and displs == [0, 1, 3] and whole.size == 10
    _, _, displs = dropin._vector([buf, ([1, 1], [0, 5]), "d"], 2, "x")
    assert displs == [0, 5]
    with pytest.raises(ValueError, match="2 counts for 3 ranks"):
        dropin._vector([buf, [1, 2], "d"], 3, "x")


def test_refused_calls_say_why_by_kind():
    assert "point-to-point" in dropin._why("Send") and "point-to-point" in dropin._why("recv")
    assert "new communicator" in dropin._why("Split") and "new communicator" in dropin._why("Dup")
    assert "nonblocking" in dropin._why("Ibcast") and "nonblocking" in dropin._why("Iallreduce")
    assert "not built" in dropin._why("Alltoall") and "not built" in dropin._why("Scan")
    with pytest.raises(ValueError, match="root=4 is not a rank of the 4 ranks"):
        dropin._check_root(4, 4, "bcast")


def test_rabit_call_forms_map_onto_init_and_leave_rabit_pys_own_alone():
    from rabit_py.api import _rabit_call_form

    assert _rabit_call_form(["prog", "mock=0,0,1,0"], "mock", {}) == (
        "mock", None, {"mock": "0,0,1,0"})
    assert _rabit_call_form("robust", None, {"lib": "standard", "timeout": 5}) == (
        "robust", None, {"timeout": 5})
    assert _rabit_call_form("auto", None, {"args": ["rabit_timeout_sec=9"]}) == (
        "auto", None, {"timeout": 9.0})
    # rabit_py's own form, even with a string where a communicator goes: init
    # refuses it as before (TypeError), it is not taken for Rabit's lib.
    assert _rabit_call_form("auto", "COMM_WORLD", {"check": False}) == (
        "auto", "COMM_WORLD", {"check": False})
