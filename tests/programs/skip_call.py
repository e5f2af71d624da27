"""One rank skips the program's only allreduce and goes on to finalize()
while the others are in it: every rank must raise CollectiveMismatchError,
whatever the timing. The exception is left uncaught (the usual case), so a
fast rank's exception handler ends the job while slower ranks may still be
exchanging the mismatch's details. Each rank prints ``OUTCOME <rank> <class>``."""

import sys

import numpy as np

import rabit_py as rabit

rank = -1


def report(exc_type, exc, tb):
    print(f"OUTCOME {rank} {exc_type.__name__}", flush=True)


sys.excepthook = report         # rabit_py's own hook calls it first
rabit.init()
rank = rabit.get_rank()
if rank != rabit.get_world_size() - 1:
    rabit.allreduce(np.ones(4), rabit.Op.SUM)
rabit.finalize()
print(f"OUTCOME {rank} none", flush=True)
