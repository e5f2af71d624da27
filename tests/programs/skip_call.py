"""One rank skips the program's only allreduce and goes on to finalize()
while the others are in it: every rank must raise CollectiveMismatchError,
whatever the timing. The exception is left uncaught (the usual case), so a
fast rank's exception handler ends the job while slower ranks may still be
exchanging the mismatch's details. Each rank writes the class of what it
raised (or ``none``) to the file ``<folder>/outcome-<rank>``, ``folder``
being the first argument: a file is read back as written, whatever the job's
end does to its output (Note [whole lines] in rabit_py/launcher/_output.py)."""

import os
import sys

import numpy as np

import rabit_py as rabit

folder = sys.argv[1]
rank = -1


def record(outcome: str) -> None:
    with open(os.path.join(folder, f"outcome-{rank}"), "w") as f:
        f.write(outcome)


def report(exc_type, exc, tb):
    record(exc_type.__name__)


sys.excepthook = report         # rabit_py's own hook calls it first
rabit.init()
rank = rabit.get_rank()
if rank != rabit.get_world_size() - 1:
    rabit.allreduce(np.ones(4), rabit.Op.SUM)
rabit.finalize()
record("none")
