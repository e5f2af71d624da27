"""Note [xgboost hang]: the guard ends a rank whose XGBoost communication
thread ended while an XGBoost call still waits on it, and only then."""

import sys
import threading
import time

import pytest

pytest.importorskip("xgboost")

from rabit_py.xgboost._session import HangGuard, thread_ids  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the guard reads /proc/self/task")


class FakeCommThread:
    """A thread standing for XGBoost's communication loop."""

    def __init__(self):
        self.stop = threading.Event()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.started.wait(5)

    def _run(self):
        self.tid = threading.get_native_id()
        self.started.set()
        self.stop.wait()

    def end(self):
        self.stop.set()
        self.thread.join(5)


def guard_for(comm, grace=0.3):
    ended = []
    guard = HangGuard(frozenset({comm.tid}), grace=grace, rank=3, end=ended.append)
    return guard, ended


def test_a_call_left_waiting_after_the_thread_ended_ends_the_process():
    comm = FakeCommThread()
    assert comm.tid in thread_ids()
    guard, ended = guard_for(comm)
    with guard.inside("the training from round 7"):
        comm.end()
        time.sleep(1.5)
    guard.close()
    assert len(ended) == 1
    assert "rank 3: XGBoost's communication thread ended while the training from round 7" \
        in ended[0] and "a replacement takes its place" in ended[0]


def test_a_call_that_returns_after_the_thread_ended_is_left_alone():
    comm = FakeCommThread()
    guard, ended = guard_for(comm, grace=2.0)
    with guard.inside("the training from round 0"):
        comm.end()
        time.sleep(0.6)           # XGBoost returned its error in time
    time.sleep(2.5)
    guard.close()
    assert ended == []


def test_the_thread_ending_outside_a_call_is_left_alone():
    comm = FakeCommThread()
    guard, ended = guard_for(comm)
    comm.end()                    # the communicator closed between calls
    time.sleep(1.0)
    with guard.inside("the training from round 4"):   # watches only live threads
        time.sleep(1.0)
    guard.close()
    assert ended == []
