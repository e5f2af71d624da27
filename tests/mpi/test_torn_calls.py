"""A call that returns success with another rank's data never filled in (what
ULFM gave a survivor whose peer was killed inside an allgather, across
namespace hosts) must not reach the program: the robust engine sees the
CRC-32C that the data carries (Note [call stamps]), counts the call as
interrupted, recovers and returns what a clean call returns."""

import numpy as np
import pytest

import rabit_py as rabit

from .conftest import WORLD, needs_ranks

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()


class TornOnce:
    """The engine's communicator, whose next ``Allgatherv``, or next ``Bcast``
    of an array payload, returns with the data from another rank garbled."""

    def __init__(self, comm, what: str) -> None:
        self._comm, self._what, self.torn = comm, what, False

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Allgatherv(self, send, recv):
        self._comm.Allgatherv(send, recv)
        if self._what == "allgather" and not self.torn:
            self.torn = True
            out, (counts, displs), _ = recv
            other = (RANK + 1) % SIZE
            flat = out.reshape(-1).view(np.uint8)
            size = out.itemsize
            flat[displs[other] * size:(displs[other] + counts[other]) * size] ^= 0x5A

    def Bcast(self, buf, root=0):
        self._comm.Bcast(buf, root=root)
        payload = isinstance(buf, np.ndarray) and buf.dtype != np.int64
        if self._what == "broadcast" and payload and RANK != root and not self.torn:
            self.torn = True
            buf.reshape(-1).view(np.uint8)[:] ^= 0x5A


def robust_session():
    from rabit_py.engine._startup import ulfm_enabled
    if not ulfm_enabled():
        pytest.skip("needs MPI fault tolerance (rabit-run)")
    rabit.init(engine="robust", timeout=60)


@needs_ranks(2)
@pytest.mark.parametrize("what", ["allgather", "broadcast"])
def test_a_torn_call_is_recovered_not_returned(what):
    robust_session()
    try:
        frame = rabit.api._engine.frame
        torn = TornOnce(frame.comm, what)
        frame.comm = torn
        rows = np.full((RANK + 1, 3), RANK, dtype=np.float32)
        if what == "allgather":
            got = rabit.allgather(rows)
            want = np.concatenate([np.full((r + 1, 3), r, dtype=np.float32)
                                   for r in range(SIZE)])
        else:
            got = rabit.broadcast(np.arange(6.0) * 7 if RANK == 0 else np.zeros(6), 0)
            want = np.arange(6.0) * 7
        assert got.tobytes() == want.tobytes()
        # The job goes on; a broadcast's root saw nothing wrong and joins the
        # recovery at this next call.
        assert rabit.allreduce(np.ones(2), rabit.Op.SUM).tolist() == [SIZE, SIZE]
        assert torn.torn or RANK == 0 and what == "broadcast"
        assert rabit.api._engine.frame.comm is not torn     # repaired: a new one
        assert rabit.engine_info().recoveries == 1
    finally:
        rabit.finalize()
