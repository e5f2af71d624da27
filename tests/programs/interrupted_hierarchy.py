"""A hierarchical allreduce interrupted by a revoke between its steps
(Note [revoked success] for the node and leaders communicators, in
rabit_py/engine/_shm.py), run on 4 ranks under ``mpirun --with-ft ulfm``.

Groups {0, 1} and {2, 3} (pseudo-nodes on one machine). In each trial, on a
fresh reducer: every rank reduces in its group; rank 2, the leader of the
second group, then revokes the leaders' communicator instead of joining the
leaders' allreduce (as a leader does whose group peer died). Rank 0 is in
that allreduce. ``--unchecked`` turns the reducer's revoke check off, to show
what it catches; ``--kept`` runs the robust engine's protocol
(``reduce_to_area``, Note [kept results]), whose node peers wait on a flag
instead of a broadcast.

Every rank prints ``OUTCOMES {json}``: ``ok`` (the sum over all four ranks),
``partial`` (success, with another value: the sum of its own group, the
silent wrong answer), ``interrupted`` (an MPI error of class
MPI_ERR_REVOKED), ``revoker``.
"""

import argparse
import json
import sys

import numpy as np

from rabit_py.engine import _shm
from rabit_py.engine._mpistart import ERR_REVOKED, MPI


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--unchecked", action="store_true")
    parser.add_argument("--kept", action="store_true")
    args = parser.parse_args()
    if args.unchecked:
        _shm.NodeReducer._check_revoked = lambda self: None
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    outcomes = {"ok": 0, "partial": 0, "interrupted": 0, "revoker": 0}
    for trial in range(args.trials):
        comm = world.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        reducer = _shm.NodeReducer(comm, [0, 0, 1, 1])
        data = np.full(4, float(rank + 1) * (trial + 1))
        want = 10.0 * (trial + 1)

        def leaders_step(leaders, flat):
            if rank == 2:
                leaders.Revoke()
            else:
                leaders.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)

        world.Barrier()
        try:
            if args.kept:
                data = np.array(reducer.reduce_to_area(data, np.add, leaders_step))
            else:
                reducer.allreduce(data, np.add, leaders_step)
            if rank == 2:
                outcomes["revoker"] += 1
            else:
                outcomes["ok" if np.all(data == want) else "partial"] += 1
        except MPI.Exception as exc:
            reducer.revoke()            # as the engine does: the node's peers leave too
            if rank == 2:
                outcomes["revoker"] += 1
            elif exc.Get_error_class() == ERR_REVOKED:
                outcomes["interrupted"] += 1
            else:
                outcomes["partial"] += 1
        finally:
            world.Barrier()
            reducer.free()
            comm.Free()
    print("OUTCOMES " + json.dumps({"rank": rank, **outcomes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
