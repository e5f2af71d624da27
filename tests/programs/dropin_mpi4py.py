"""An mpi4py program, run either on mpi4py itself (``--real``) or switched to
rabit_py by its import line (tests/jobs/test_dropins.py compares the two).

Every rank prints ``RESULT {json}``: what each call returned or wrote, with
floats written by ``repr`` so that the comparison is bitwise.
"""

import json
import sys

import numpy as np

if "--real" in sys.argv:
    from mpi4py import MPI
else:
    from rabit_py.mpi4py import MPI


def exact(value):
    """JSON for a result: floats by repr (bitwise), arrays as lists of those."""
    if isinstance(value, np.ndarray):
        return {"dtype": str(value.dtype), "items": [exact(v) for v in value.tolist()]}
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [exact(v) for v in value]
    if isinstance(value, dict):
        return {str(k): exact(v) for k, v in sorted(value.items())}
    return value


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.size
    out = {"rank": rank, "size": size, "rank_attr": comm.rank}
    # Objects: mpi4py's order of reduction shows in float sums and in lists.
    x = 0.1 * (rank + 1) + 1e-17 * rank
    out["sum_float"] = comm.allreduce(x, op=MPI.SUM)
    # 1 in rank order ((1e16 + 1) - 1e16) + 1, 0 in mpi4py's tree (1e16 + 1) + (-1e16 + 1).
    out["sum_cancel"] = comm.allreduce([1e16, 1.0, -1e16, 1.0][rank % 4], op=MPI.SUM)
    out["sum_list"] = comm.allreduce([rank], op=MPI.SUM)
    out["sum_str"] = comm.allreduce(str(rank), op=MPI.SUM)
    out["max_tuple"] = comm.allreduce((rank % 2, rank), op=MPI.MAX)
    out["min"] = comm.allreduce(10 - rank, op=MPI.MIN)
    out["prod"] = comm.allreduce(rank + 1, op=MPI.PROD)
    out["land"] = comm.allreduce(rank, op=MPI.LAND)
    out["lor"] = comm.allreduce(rank, op=MPI.LOR)
    out["band"] = comm.allreduce(7 - rank, op=MPI.BAND)
    out["bor"] = comm.allreduce(1 << rank, op=MPI.BOR)
    out["bxor"] = comm.allreduce(rank + 3, op=MPI.BXOR)
    out["default_op"] = comm.allreduce(rank)
    out["bcast"] = comm.bcast({"from": rank, "v": [1.5, rank]} if rank == size - 1 else None,
                              root=size - 1)
    out["allgather"] = comm.allgather({"r": rank, "f": x})
    out["gather"] = comm.gather(rank * 2, root=0)
    out["scatter"] = comm.scatter([i * i for i in range(size)] if rank == 0 else None, root=0)
    out["reduce"] = comm.reduce([rank], op=MPI.SUM, root=0)
    # Buffers.
    send = np.arange(5, dtype=np.float64) * (rank + 1) + 0.1
    recv = np.empty(5)
    comm.Allreduce(send, recv, op=MPI.SUM)
    out["Allreduce"] = recv
    ints = np.array([rank, 2 * rank, 7], dtype=np.int32)
    comm.Allreduce(MPI.IN_PLACE, [ints, MPI.INT], op=MPI.MAX)
    out["Allreduce_in_place"] = ints
    flags = np.array([rank, 0, 1], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.LOR)
    out["Allreduce_lor"] = flags
    buf = np.full(4, rank, dtype=np.int64)
    comm.Bcast(buf, root=size - 1)
    out["Bcast"] = buf
    block = np.full(2, rank, dtype=np.float32)
    gathered = np.empty(2 * size, dtype=np.float32)
    comm.Allgather([block, MPI.FLOAT], [gathered, MPI.FLOAT])
    out["Allgather"] = gathered
    counts = [r + 1 for r in range(size)]
    displs = [sum(counts[:r]) + r for r in range(size)]        # a gap after each block
    vrecv = np.full(sum(counts) + size, -1, dtype=np.int64)
    comm.Allgatherv(np.full(rank + 1, rank, dtype=np.int64), [vrecv, counts, displs, MPI.INT64_T])
    out["Allgatherv"] = vrecv
    total = np.zeros(3) if rank == 0 else None
    comm.Reduce(np.ones(3) * rank, total, op=MPI.SUM, root=0)
    out["Reduce"] = total
    comm.Barrier()
    out["wtime_is_float"] = isinstance(MPI.Wtime(), float)
    print("RESULT " + json.dumps(exact(out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
