"""A training loop whose allreduces, broadcasts and allgathers go through the
NCCL backend (NumPy-backed CuPy/NCCL stand-ins, tests/_fakecupy.py) on the
robust engine: with a rank killed by the mock, every rank must end with the
failure-free model bit for bit. Prints ``RESULT <json>`` per rank.

    RABIT_ENGINE=mock RABIT_MOCK=... RABIT_GPU_BACKEND=nccl \\
        rabit-run -n 4 python tests/programs/nccl_recover.py
"""

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from tests import _fakecupy  # noqa: E402

_fakecupy.install()

import numpy as np  # noqa: E402

import rabit_py as rabit  # noqa: E402

rabit.init()
engine = rabit.api._engine
# The stand-in NCCL communicators are made over the job's current ranks.
_fakecupy.BASE_COMM = lambda: engine.frame.comm
rank, size = rabit.get_rank(), rabit.get_world_size()
version, model = rabit.load_checkpoint()
if version == 0:
    model = np.zeros(64)
prepared = []
for it in range(version, 6):
    grad = _fakecupy.ndarray(np.sin(np.arange(64) * (rank + 1) + it))
    rabit.allreduce(grad, rabit.Op.SUM)                                  # seqno 0

    def fill(device_array, it=it):
        prepared.append(it)
        device_array.fill(float(rank * it))

    top = _fakecupy.ndarray(np.zeros(8))
    rabit.allreduce(top, rabit.Op.MAX, prepare_fun=fill)                # seqno 1
    # Device broadcast and allgather (NCCL too): a replacement whose calls
    # are served from the survivors' cache must get device arrays as well.
    root = it % size
    sent = (_fakecupy.ndarray(np.cos(np.arange(6) + it)) if rank == root
            else None if rank % 2 else _fakecupy.ndarray(np.zeros(6)))
    got = rabit.broadcast(sent, root)                                   # seqno 2
    assert isinstance(got, _fakecupy.ndarray), type(got)
    rows = rabit.allgather(_fakecupy.ndarray(np.full((rank % 2 + 1, 2), rank + it * 0.5)))
    assert isinstance(rows, _fakecupy.ndarray), type(rows)              # seqno 3
    model = model + 0.1 * grad.get() + top.get().sum() + got.get().sum() + rows.get().sum()
    rabit.checkpoint(model)                                             # seqno 4
nccl = engine.resources.nccl
print("RESULT " + json.dumps({
    "rank": rank, "world": rabit.get_world_size(), "pid": os.getpid(),
    "joined": getattr(engine, "joined_as", "start"),
    "model": hashlib.sha256(model.tobytes()).hexdigest(), "prepared": prepared,
    "communicators": nccl.communicators_made if nccl else 0}), flush=True)
rabit.finalize()
sys.stdout.flush()
# A stand-in NCCL operation that a dead peer never joined is still pending on
# an old MPI communicator: skip MPI_Finalize (real NCCL aborts the kernel).
os._exit(0)
