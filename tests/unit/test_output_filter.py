"""rabit-run's filter of the job's stderr (Note [quiet banners])."""

from rabit_py.launcher._output import BannerFilter

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
