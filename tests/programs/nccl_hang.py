"""A NCCL collective (allreduce, broadcast or allgather) that a peer never
joins, with the NumPy-backed CuPy/NCCL stand-ins (tests/_fakecupy.py): every
rank must get CollectiveTimeoutError (not hang), and later device allreduces
a clear refusal.

    rabit-run -n 2 python tests/programs/nccl_hang.py TIMEOUT_SECONDS [COLLECTIVE]
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from tests import _fakecupy  # noqa: E402

_fakecupy.install()

import numpy as np  # noqa: E402

import rabit_py as rabit  # noqa: E402


def report(tag: str, rank: int, message: str) -> None:
    print(f"{tag} " + json.dumps({"rank": rank, "message": message}), flush=True)


rabit.init(engine="mpi", timeout=float(sys.argv[1]))
rank = rabit.get_rank()
first = _fakecupy.ndarray(np.ones(4))
rabit.allreduce(first, rabit.Op.SUM)            # sets NCCL up; works
report("FIRST", rank, str(first.get().tolist()))
if rank == 1:
    _fakecupy.HANG_RANKS.add(1)                  # this rank's NCCL work never starts
collective = sys.argv[2] if len(sys.argv) > 2 else "allreduce"
try:
    if collective == "allreduce":
        rabit.allreduce(_fakecupy.ndarray(np.ones(4)), rabit.Op.SUM)
    elif collective == "broadcast":
        rabit.broadcast(_fakecupy.ndarray(np.ones(4)) if rank == 0 else None, 0)
    else:
        rabit.allgather(_fakecupy.ndarray(np.ones((rank + 1, 2))))
    report("NO_TIMEOUT", rank, "")
except rabit.CollectiveTimeoutError as exc:
    report("TIMEOUT", rank, str(exc))
try:
    rabit.allreduce(_fakecupy.ndarray(np.ones(4)), rabit.Op.SUM)
    report("NOT_REFUSED", rank, "")
except rabit.RabitError as exc:
    report("REFUSED", rank, str(exc))
sys.stdout.flush()
os._exit(0)     # the stand-in's unfinished MPI requests must not hold MPI_Finalize
