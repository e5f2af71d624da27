"""Unit tests of the engine's MPI-free parts: input checks (_validate), the
broadcast header (_broadcast), the watchdog and timeout messages
(_watchdog), and how an uncaught error is classified (_lifecycle)."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest

from rabit_py._status import Reporter, read_reports
from rabit_py.engine import _broadcast as bc
from rabit_py.engine._lifecycle import is_restartable, is_secondary
from rabit_py.engine._signature import Kind
from rabit_py.engine._validate import (check_allgather, check_allreduce, check_array_broadcast,
                                       check_root)
from rabit_py.engine._watchdog import Watchdog, deadline, timeout_message
from rabit_py.errors import CollectiveTimeoutError, RabitError, RecoveryError, TrainingError
from rabit_py.ops import DTYPES, Op

# ------------------------------------------------------------------ _validate


def test_allreduce_accepts_every_valid_op_and_dtype_pair():
    for dtype in DTYPES:
        data = np.zeros(3, dtype=dtype)
        ok = [op for op in range(7) if check_allreduce(data, op) is None]
        kind = dtype.kind
        if kind == "b":
            assert ok == [Op.MAX, Op.MIN, Op.BITOR, Op.BITAND, Op.BITXOR]
        elif kind in "iu":
            assert ok == list(range(7))
        elif kind == "f":
            assert ok == [Op.MAX, Op.MIN, Op.SUM, Op.PROD]
        else:
            assert ok == [Op.SUM, Op.PROD], dtype


@pytest.mark.parametrize("data, op, kind, words", [
    ([1.0, 2.0], Op.SUM, TypeError, "NumPy array, got list"),
    (np.zeros((4, 4))[:, 1], Op.SUM, ValueError, "strided view"),
    (np.zeros(3, dtype=">f8"), Op.SUM, TypeError, "does not support dtype"),
    (np.zeros(3, dtype=object), Op.SUM, TypeError, "does not support dtype"),
    (np.zeros(3), Op.BITOR, TypeError, "needs an integer or bool array"),
    (np.zeros(3, dtype=np.complex64), Op.MAX, TypeError, "undefined for complex"),
    (np.zeros(3, dtype=bool), Op.SUM, TypeError, "ambiguous"),
    (np.zeros(3), 9, ValueError, "is not a reduction operator"),
    (np.zeros(3), True, ValueError, "is not a reduction operator"),
])
def test_allreduce_refusals_say_what_to_do(data, op, kind, words):
    error = check_allreduce(data, op)
    assert isinstance(error, kind) and words in str(error), error


def test_a_read_only_array_is_refused_in_place_but_fine_to_gather():
    data = np.zeros(4)
    data.flags.writeable = False
    assert "read-only" in str(check_allreduce(data, Op.SUM))
    assert "read-only" in str(check_array_broadcast(data))
    assert check_allgather(data) is None
    assert check_allgather(np.zeros((4, 4))[:, 1]) is None      # views are copied


def test_allgather_needs_an_axis_to_concatenate():
    assert "ndim >= 1" in str(check_allgather(np.array(1.0)))


@pytest.mark.parametrize("root, size, kind", [
    (0, 1, None), (3, 4, None), (np.int64(2), 4, None),
    (4, 4, ValueError), (-1, 4, ValueError), (True, 4, TypeError), ("0", 4, TypeError),
    (1.0, 4, TypeError)])
def test_broadcast_roots(root, size, kind):
    error = check_root(root, size)
    assert (error is None) if kind is None else isinstance(error, kind), error


# ----------------------------------------------------------------- _broadcast


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (1, 2, 3, 4), (1, 2, 3, 4, 5)])
def test_an_array_header_carries_its_shape_and_dtype(shape):
    data = np.zeros(shape, dtype=np.float32)
    header, payload, error = bc.root_header(data)
    assert payload is None and error is None and len(header) == bc.HEADER_LEN
    assert header[0] == bc.ARRAY and header[1] == data.nbytes
    assert bc.header_dtype(header) == np.float32
    # More dimensions than the header holds travel in a second message.
    assert bc.inline_shape(header) == (shape if len(shape) <= bc.INLINE_DIMS else None)


def test_an_object_is_pickled_and_an_unpicklable_one_becomes_an_error_header():
    header, payload, error = bc.root_header({"a": [1, 2]})
    assert header[0] == bc.OBJECT and header[1] == len(payload) and error is None
    assert pickle.loads(payload) == {"a": [1, 2]}
    header, payload, error = bc.root_header(threading.Lock())
    assert header[0] == bc.ERROR and header[1] == len(payload)
    assert isinstance(error, TypeError) and b"lock" in payload


def test_a_device_header_is_an_array_header_with_another_mode():
    assert bc.array_header(bc.DEVICE, (2, 3), np.dtype(np.int64))[1:] == \
        bc.array_header(bc.ARRAY, (2, 3), np.dtype(np.int64))[1:]


def test_small_payloads_ride_in_the_header_message():
    fits = bc.INLINE_BYTES // 8
    assert bc.inlined(bc.root_header(np.zeros(fits))[0])
    assert not bc.inlined(bc.root_header(np.zeros(fits + 1))[0])
    assert bc.inlined(bc.root_header(np.zeros(()))[0])                 # 0-d
    assert bc.inlined(bc.root_header(np.zeros((0, 3)))[0])             # empty
    assert not bc.inlined(bc.root_header(np.zeros((1, 1, 1, 1, 2)))[0])  # shape sent apart
    assert bc.inlined(bc.root_header({"lr": 0.1})[0])
    assert not bc.inlined(bc.root_header(b"x" * 1000)[0])
    assert not bc.inlined(bc.array_header(bc.DEVICE, (2,), np.dtype(np.float32)))
    assert bc.MESSAGE_LEN * 8 == bc.HEADER_LEN * 8 + bc.INLINE_BYTES


# ------------------------------------------------------------------ _watchdog


def test_the_watchdog_fires_once_for_a_call_that_overstays():
    fired = []
    dog = Watchdog(0.2, fired.append)
    try:
        dog.enter(("call", 1))
        time.sleep(0.6)
        assert fired == [("call", 1)] and dog.fired == ("call", 1)
    finally:
        dog.stop()


def test_the_watchdog_does_not_fire_for_calls_that_end_in_time():
    fired = []
    dog = Watchdog(0.3, fired.append)
    try:
        for i in range(5):
            dog.enter(i)
            time.sleep(0.1)
            dog.leave()
        assert not dog.in_call
        time.sleep(0.4)
        assert fired == [] and dog.fired is None
    finally:
        dog.stop()


def test_an_overdue_call_given_a_grace_is_left_alone_if_it_ends_meanwhile():
    # Note [hung ranks]: asked once per call; the call then has the grace,
    # and when it ends within it (the hung rank was ended) nothing fires and
    # the next call is watched again. Margins of seconds: a loaded machine.
    fired, asked = [], []
    dog = Watchdog(0.2, fired.append, on_overdue=lambda token, waited: asked.append(
        (token, waited)) or True, overdue_grace=2.0)
    try:
        dog.enter("first")
        time.sleep(0.6)
        assert [t for t, _ in asked] == ["first"] and asked[0][1] >= 0.2 and fired == []
        dog.leave()
        time.sleep(2.0)
        assert fired == [] and dog.fired is None and len(asked) == 1
        dog.enter("second")
        deadline = time.monotonic() + 15
        while not fired and time.monotonic() < deadline:     # 0.2 s + 2 s of grace
            time.sleep(0.05)
        assert [t for t, _ in asked] == ["first", "second"] and fired == ["second"]
    finally:
        dog.stop()


def test_an_overdue_call_not_given_a_grace_fires_at_once():
    fired, asked = [], []
    dog = Watchdog(0.2, fired.append, on_overdue=lambda token, waited: asked.append(token)
                   and False, overdue_grace=5)
    try:
        dog.enter("call")
        deadline = time.monotonic() + 15
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert asked == ["call"] and fired == ["call"] and dog.fired == "call"
    finally:
        dog.stop()


def test_an_overdue_request_is_read_back_by_rabit_run(tmp_path):
    reporter = Reporter(str(tmp_path), "rank-1")
    assert reporter.overdue(3, 7, 1, 45.25)
    assert not Reporter(None, "rank-1").overdue(3, 7, 1, 45.25)     # no folder: not asked
    request = read_reports(str(tmp_path))["rank-1"].overdue
    assert request[:4] == (3, 7, 1, 45.25) and abs(request[4] - time.time()) < 60


def test_the_heartbeat_runs_outside_calls_and_a_failing_one_does_not_stop_it():
    beats = []

    def beat():
        beats.append(time.monotonic())
        if len(beats) == 1:
            raise OSError("the status folder is gone")

    dog = Watchdog(0, lambda _: None, heartbeat=beat, period=0.05)
    try:
        time.sleep(0.4)
    finally:
        dog.stop()
    assert len(beats) >= 4


def test_a_deadline_fires_only_when_the_block_overstays():
    fired = []
    with deadline(0.5, fired.append, "quick"):
        time.sleep(0.05)
    with deadline(0.1, fired.append, "slow"):
        time.sleep(0.4)
    with deadline(0, fired.append, "no limit"):
        time.sleep(0.05)
    assert fired == ["slow"]


def test_timeout_messages_name_who_did_not_arrive_and_who_waited_elsewhere():
    token = (Kind.ALLREDUCE, 3, 7)
    here = (3, 7, Kind.ALLREDUCE)
    positions = {0: here + (1,), 1: here + (0,), 3: (3, 6, Kind.BROADCAST, 0)}
    text = timeout_message(0, 4, 30, token, positions)
    assert text.startswith("rank 0: allreduce #7 (version 3) did not complete within 30 s.")
    assert "Rank(s) 2 did not arrive (ranks 0,1 were waiting in it)." in text
    assert "Rank 3 was waiting in broadcast #6 (version 3) instead." in text
    other = timeout_message(1, 4, 30, token, positions)
    assert other.startswith("rank 1: allreduce #7 (version 3) was aborted: rank(s) 0 timed out")
    alone = timeout_message(0, 2, 5, token, {0: here + (1,)})
    assert "Rank(s) 1 did not arrive" in alone


# ----------------------------------------------------------------- _lifecycle


def test_what_a_restart_may_cure():
    assert is_restartable(CollectiveTimeoutError("late"))
    assert is_restartable(OSError("disk"))
    assert is_restartable(RecoveryError("lost", restartable=True))
    assert not is_restartable(RecoveryError("lost for good", restartable=False))
    assert not is_restartable(ValueError("a bug"))
    try:
        try:
            raise OSError("disk")
        except OSError as cause:
            raise RuntimeError("wrapped") from cause
    except RuntimeError as wrapped:
        assert is_restartable(wrapped)


def test_errors_that_only_report_another_ranks_are_secondary():
    assert is_secondary(TrainingError("rank 2 failed", 2, secondary=True))
    assert not is_secondary(TrainingError("rank 2 failed", 2))
    error = RabitError("rank 1 stopped the job")
    error.secondary = True
    assert is_secondary(error) and not is_secondary(ValueError("x"))


class _Group:
    def __init__(self, size):
        self.size = size

    def Get_size(self):
        return self.size

    def Free(self):
        pass


class _Comm:
    """A stand-in communicator: its peers failed or not, revoked or not."""

    def __init__(self, failed=0, revoked=False):
        self.failed, self.revoked, self.revokes = failed, revoked, 0

    def Get_rank(self):
        return 1

    def Get_size(self):
        return 4

    def Is_revoked(self):
        return self.revoked

    def Get_failed(self):
        return _Group(self.failed)

    def Revoke(self):
        self.revokes += 1

    def Iprobe(self, **_):
        return False


def test_an_mpi_error_of_another_class_after_a_peer_died_is_a_lost_peer():
    # Open MPI's libnbc collectives report a dead peer as MPI_ERR_OTHER.
    # MPI through rabit_py's start: a bare singleton leaves its shared-memory
    # file in /dev/shm (Note in engine/_mpistart.py).
    from rabit_py.engine._mpistart import MPI

    from rabit_py.config import Config
    from rabit_py.engine._frame import CallFrame
    from rabit_py.errors import PeerFailure

    frame = CallFrame(Config(), ulfm=True, recovers=True)
    frame.use(_Comm(failed=1), _Comm())
    error = frame.failure(MPI.Exception(MPI.ERR_OTHER))
    assert isinstance(error, PeerFailure) and "a peer process failed" in str(error)
    assert frame.broken is None
    # Without a dead peer it stays an MPI error, and the engine is broken.
    frame = CallFrame(Config(), ulfm=True, recovers=True)
    frame.use(_Comm(failed=0), _Comm())
    started = time.monotonic()
    error = frame.failure(MPI.Exception(MPI.ERR_OTHER))
    assert type(error) is RabitError and "MPI error in collective" in str(error)
    assert frame.broken is not None and time.monotonic() - started < 3


def test_an_error_is_told_to_be_rabit_pys_or_the_programs(tmp_path):
    # robust.py: an error out of rabit_py's own code while the job recovers
    # is a fault's consequence (restartable), one out of the program's own
    # code (a prepare_fun) is a bug.
    import pickle
    from rabit_py.engine._lifecycle import raised_by_rabit_py
    from rabit_py.engine import _control as control

    def caught(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            return exc
        raise AssertionError("no error")

    ours = caught(lambda: control.unseal(b"\x05" * 40, "round.result"))
    assert raised_by_rabit_py(ours)
    # A library called by rabit_py (pickle, in C and in Python) still counts as rabit_py's.
    ours_via_library = caught(lambda: control.seal(lambda: 0, "x"))    # pickle raises
    assert raised_by_rabit_py(ours_via_library)
    program = tmp_path / "prog.py"
    program.write_text("def prepare(buf):\n    raise ValueError('bad batch')\n")
    namespace: dict = {}
    exec(compile(program.read_text(), str(program), "exec"), namespace)
    assert not raised_by_rabit_py(caught(lambda: namespace["prepare"](None)))
    assert not raised_by_rabit_py(caught(lambda: pickle.loads(b"\x05")))  # no rabit_py frame


# --- Note [UCX memory hooks]: UCX's memory events are turned off only where
# no RDMA device exists and the user set nothing.

def _hooks(monkeypatch, devices, preset=None):
    from rabit_py.engine import _mpistart

    monkeypatch.delenv("UCX_MEM_EVENTS", raising=False)
    if preset is not None:
        monkeypatch.setenv("UCX_MEM_EVENTS", preset)

    def listdir(path):
        assert path == "/sys/class/infiniband"
        if devices is None:
            raise FileNotFoundError(path)
        return devices

    monkeypatch.setattr(_mpistart.os, "listdir", listdir)
    return _mpistart.quiet_ucx_memory_hooks()


def test_ucx_memory_events_off_without_rdma_devices(monkeypatch):
    import os
    assert _hooks(monkeypatch, None) is True
    assert os.environ["UCX_MEM_EVENTS"] == "no"
    assert _hooks(monkeypatch, []) is True              # the class exists, no device in it
    assert os.environ["UCX_MEM_EVENTS"] == "no"


def test_ucx_memory_events_left_alone_with_rdma_or_a_user_setting(monkeypatch):
    import os
    assert _hooks(monkeypatch, ["mlx5_0"]) is False
    assert "UCX_MEM_EVENTS" not in os.environ
    assert _hooks(monkeypatch, None, preset="yes") is False
    assert os.environ["UCX_MEM_EVENTS"] == "yes"


# --- Note [checksum import]: the C function, loaded without the package's
# __init__, or the plain import where the layout is another.

def test_crc32c_is_the_package_function_without_importing_the_package():
    import subprocess
    import sys
    code = ("import sys; from rabit_py.engine._checksum import crc32c; "
            "print(crc32c(b'123456789'), 'crc32c' in sys.modules, "
            "'importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(0xE3069283), "False", "False"]      # CRC-32C's check value


def test_crc32c_falls_back_to_the_plain_import(monkeypatch):
    import importlib.util

    from rabit_py.engine import _checksum
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    fallback = _checksum._load()
    assert fallback(b"123456789") == 0xE3069283
