"""rabit-run's filter of the job's stderr (Note [quiet banners])."""

import io
import os
import threading
import time

import pytest

from rabit_py.launcher._output import HOLD_S, BannerFilter, WholeLines, pump

RULE = b"-" * 74 + b"\n"
ABORT = (RULE + b"MPI_ABORT was invoked on rank 2 in communicator MPI COMM 3 DUP FROM 0\n"
         b"  Proc: [[23234,1],2]\n  Errorcode: 1\n\n"
         b"NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n"
         b"You may or may not see output from other processes, depending on\n"
         b"exactly when Open MPI kills them.\n" + RULE)
OTHER = (RULE + b"There are not enough slots available in the system to satisfy the 4\n"
         b"slots that were requested by the application:\n" + RULE)


def run_through(chunks):
    keep = BannerFilter()
    return b"".join(keep.feed(c) for c in chunks) + keep.flush()


def test_the_abort_banner_and_nul_bytes_are_left_out_and_the_rest_kept():
    text = (b"Traceback (most recent call last):\nValueError: bad\n" + ABORT + b"\0"
            + b"rabit_py: rank 3: stopped\n")
    assert run_through([text]) == (b"Traceback (most recent call last):\nValueError: bad\n"
                                   b"rabit_py: rank 3: stopped\n")
    # The same, arriving byte by byte.
    assert run_through([text[i:i + 1] for i in range(len(text))]) == \
        b"Traceback (most recent call last):\nValueError: bad\nrabit_py: rank 3: stopped\n"


def test_other_banners_and_user_lines_pass_unchanged():
    assert run_through([OTHER]) == OTHER
    user = b"---- epoch 3 ----\n" + RULE + b"my own table\n" + RULE + b"done\n"
    assert run_through([user]) == user


def test_a_line_not_ended_yet_is_printed_at_once_unless_it_may_be_a_rule():
    keep = BannerFilter()
    assert keep.feed(b"gbdt:  10%|#   | 10/100\r") == b"gbdt:  10%|#   | 10/100\r"
    assert keep.feed(b"gbdt:  20%") == b"gbdt:  20%"
    assert keep.feed(b"\n---") == b"\n"             # a dash: held until its line ends
    assert keep.feed(b"-- not a rule\n") == b"----- not a rule\n"
    assert keep.feed(b"-----") == b""
    assert keep.flush() == b"-----"


# ------------------------------------------------ Note [whole lines]
def test_a_line_is_held_until_its_end_or_for_hold_s_at_most():
    lines = WholeLines(hold_s=0.1)
    assert lines.feed(b"OUTCOME 3 CollectiveMismatchError", now=10.0) == b""
    assert lines.holding and lines.wait_s(10.05) == pytest.approx(0.05)
    assert lines.held_too_long(10.05) == b""
    assert lines.feed(b"\nnext", now=10.06) == b"OUTCOME 3 CollectiveMismatchError\n"
    # "next" began at 10.06, not when the line before it did.
    assert lines.held_too_long(10.12) == b""
    assert lines.held_too_long(10.17) == b"next"
    assert not lines.holding and lines.wait_s(11.0) is None
    # A progress bar is passed on at each "\r"; the rest at the stream's end.
    assert lines.feed(b" 10%\r 20%\r 3", now=20.0) == b" 10%\r 20%\r"
    assert lines.rest() == b" 3" and lines.rest() == b""


def _relay(chunks_and_streams, hold_s):
    """Write chunks to two pipes (stdout, stderr) as given, pumped into one
    sink as rabit-run does; returns what the sink got."""
    sink = io.BytesIO()
    lock = threading.Lock()
    pipes = [os.pipe(), os.pipe()]
    threads = [pump(os.fdopen(r, "rb"), sink, lock, banners) for (r, _), banners
               in zip(pipes, (None, BannerFilter()))]
    for stream, chunk in chunks_and_streams:
        if chunk is None:
            time.sleep(hold_s)
            continue
        os.write(pipes[stream][1], chunk)
        time.sleep(0.02)
    for _, w in pipes:
        os.close(w)
    for thread in threads:
        thread.join(timeout=5)
        assert not thread.is_alive()
    return sink.getvalue()


def test_a_line_written_in_two_pieces_is_not_split_by_the_other_stream():
    # What PYTHONUNBUFFERED=1 makes of print(): the text, then its end; in
    # between, a line on stderr.
    got = _relay([(0, b"OUTCOME 3 CollectiveMismatchError"),
                  (1, b"rabit_py: every rank raised this CollectiveMismatchError\n"),
                  (0, b"\n")], HOLD_S)
    assert got == (b"rabit_py: every rank raised this CollectiveMismatchError\n"
                   b"OUTCOME 3 CollectiveMismatchError\n")


def test_a_line_not_ended_is_passed_on_after_the_hold_and_banners_still_go():
    got = _relay([(0, b"epoch 1  50%"), (None, None), (None, None),
                  (1, ABORT + b"\0rabit_py: rank 3: stopped\n"), (0, b"\n")], HOLD_S)
    assert got == b"epoch 1  50%rabit_py: rank 3: stopped\n\n"
