"""A call that returns success with another rank's data never filled in (what
ULFM gave a survivor whose peer was killed inside an allgather, across
namespace hosts) must not reach the program: the robust engine sees the
CRC-32C that the data carries (Note [call stamps]), counts the call as
interrupted, recovers and returns what a clean call returns."""

import numpy as np
import pytest

import rabit_py as rabit
from rabit_py.engine._broadcast import HEADER_LEN, INLINE_BYTES, MESSAGE_LEN

from .conftest import WORLD, needs_ranks

SIZE = WORLD.Get_size()
RANK = WORLD.Get_rank()


class TornOnce:
    """The engine's communicator, whose next ``Allgather`` (rows in the
    records) or ``Allgatherv``, or next ``Bcast`` of an array payload (in the
    header's message, or its own), returns with the data from another rank
    garbled."""

    def __init__(self, comm, what: str) -> None:
        self._comm, self._what, self.torn = comm, what, False

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def Allgather(self, send, recv):
        self._comm.Allgather(send, recv)
        if self._what == "allgather" and not self.torn:
            self.torn = True            # the other rank's rows, inline in its record
            recv.view(np.uint8)[(RANK + 1) % SIZE, 24:] ^= 0x5A

    def Allgatherv(self, send, recv):
        self._comm.Allgatherv(send, recv)
        if self._what == "allgather_large" and not self.torn:
            self.torn = True
            out, (counts, displs), _ = recv
            other = (RANK + 1) % SIZE
            flat = out.reshape(-1).view(np.uint8)
            size = out.itemsize
            flat[displs[other] * size:(displs[other] + counts[other]) * size] ^= 0x5A

    def Bcast(self, buf, root=0):
        self._comm.Bcast(buf, root=root)
        if RANK == root or self.torn or not isinstance(buf, np.ndarray):
            return
        if self._what == "broadcast_large" and buf.dtype != np.int64:
            self.torn = True                    # the payload's own message
            buf.reshape(-1).view(np.uint8)[:] ^= 0x5A
        elif self._what == "broadcast" and buf.dtype == np.int64 and buf.size == MESSAGE_LEN:
            self.torn = True                    # the payload in the header's message
            buf.view(np.uint8)[HEADER_LEN * 8:] ^= 0x5A


def robust_session():
    from rabit_py.engine._startup import ulfm_enabled
    if not ulfm_enabled():
        pytest.skip("needs MPI fault tolerance (rabit-run)")
    rabit.init(engine="robust", timeout=60)


@needs_ranks(2)
@pytest.mark.parametrize("what", ["allgather", "allgather_large", "broadcast",
                                  "broadcast_large"])
def test_a_torn_call_is_recovered_not_returned(what):
    robust_session()
    try:
        frame = rabit.api._engine.frame
        torn = TornOnce(frame.comm, what)
        frame.comm = torn
        if what.startswith("allgather"):
            # Up to 4 x 3 float32 rows ride in a rank's record; 4 x 30 do not.
            width = 3 if what == "allgather" else 30
            got = rabit.allgather(np.full((RANK + 1, width), RANK, dtype=np.float32))
            want = np.concatenate([np.full((r + 1, width), r, dtype=np.float32)
                                   for r in range(SIZE)])
        else:
            # 6 float64 ride in the header's message (INLINE_BYTES), 64 do not.
            n = 6 if what == "broadcast" else 64
            assert (n * 8 <= INLINE_BYTES) == (what == "broadcast")
            got = rabit.broadcast(np.arange(float(n)) * 7 if RANK == 0 else np.zeros(n), 0)
            want = np.arange(float(n)) * 7
        assert got.tobytes() == want.tobytes()
        # The job goes on; a broadcast's root saw nothing wrong and joins the
        # recovery at this next call.
        assert rabit.allreduce(np.ones(2), rabit.Op.SUM).tolist() == [SIZE, SIZE]
        assert torn.torn or RANK == 0 and what.startswith("broadcast")
        assert rabit.api._engine.frame.comm is not torn     # repaired: a new one
        assert rabit.engine_info().recoveries == 1
    finally:
        rabit.finalize()
