"""An exchange of objects interrupted by a revoke (Note [sealed messages] in
rabit_py/engine/_control.py), run under ``mpirun --with-ft ulfm -n 3``.

In each trial, on a fresh duplicate of the world: the *revoker* takes part in
the first step of the exchange (the message sizes) and then revokes the
communicator; the other ranks run the whole exchange. ``--path mpi4py`` uses
mpi4py's object calls (``comm.allgather``/``comm.bcast``: what the engine's
repair and spare pool used), ``--path sealed`` rabit_py's control messages.
``--call allgather``: rank 2 revokes; ``--call bcast``: the root, rank 0,
revokes after sending the size.

Every rank prints one ``OUTCOMES {json}`` line counting its trials: ``ok``
(the right objects), ``wrong`` (objects returned, but not the ones sent),
``interrupted`` (an MPI error of class MPI_ERR_REVOKED, what the engine
recovers from), ``garbage`` (any other exception: what escaped the repair as
an uncaught bug), ``revoker``.
"""

import argparse
import json
import sys
import time

import numpy as np

from rabit_py.engine import _control as control
from rabit_py.engine._mpistart import MPI


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", choices=["mpi4py", "sealed"], required=True)
    parser.add_argument("--call", choices=["allgather", "bcast"], default="allgather")
    parser.add_argument("--trials", type=int, default=60)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    revoker = 2 if args.call == "allgather" else 0
    outcomes = {"ok": 0, "wrong": 0, "interrupted": 0, "garbage": 0, "revoker": 0}
    for trial in range(args.trials):
        comm = world.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        payload = ("y" * ((trial % 18) * 13 + 5), rank, trial)
        world.Barrier()
        try:
            if rank == revoker:
                first_step(comm, args, payload)
                time.sleep((trial % 6) * 0.0005)
                comm.Revoke()
                outcomes["revoker"] += 1
                continue
            if args.call == "allgather":
                got = (comm.allgather(payload) if args.path == "mpi4py" else
                       control.allgather(comm, payload, "test.exchange"))
                good = [g[1:] for g in got] == [(r, trial) for r in range(comm.Get_size())]
            else:
                got = (comm.bcast(None, root=0) if args.path == "mpi4py" else
                       control.bcast(comm, None, 0, "test.exchange"))
                good = got[1:] == (0, trial)
            outcomes["ok" if good else "wrong"] += 1
        except MPI.Exception as exc:
            interrupted = exc.Get_error_class() == control.ERR_REVOKED
            outcomes["interrupted" if interrupted else "garbage"] += 1
        except Exception as exc:  # noqa: BLE001 - what escaped the repair before
            outcomes["garbage"] += 1
            print(f"GARBAGE rank {rank} trial {trial}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        finally:
            world.Barrier()
            comm.Free()
    print("OUTCOMES " + json.dumps({"rank": rank, **outcomes}), flush=True)
    return 0


def first_step(comm, args, payload) -> None:
    """The revoker's part in the exchange's first step (the sizes), as
    both paths send them: one int64 per rank."""
    size = len(control.seal(payload, "test.exchange"))
    if args.call == "allgather":
        comm.Allgather(np.array([size], dtype=np.int64), np.zeros(comm.Get_size(), np.int64))
    else:
        comm.Bcast(np.array([size], dtype=np.int64), root=0)


if __name__ == "__main__":
    sys.exit(main())
