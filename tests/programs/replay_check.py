"""A replacement whose program makes another call than the one the survivors
ran: the replay check must refuse the survivors' result for it.

Calls of version 0: #0 an allreduce, #1 a broadcast of an array from rank 0
(the others pass a buffer), #2 an allgather, #3 an allreduce (where the test
kills a rank with the mock engine), then a checkpoint. With ``--differ KIND``
a *replacement* passes another dtype to that call (``allreduce``,
``broadcast``) or another row shape (``allgather``). With
``--receivers-pass-none`` the broadcast's receivers pass ``None`` (a
description with no dtype, which matches any). Each rank prints
``RESULT <rank> <json>`` at the end.
"""

import argparse
import json

import numpy as np

import rabit_py as rabit


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--differ", choices=["none", "allreduce", "broadcast", "allgather"],
                        default="none")
    parser.add_argument("--receivers-pass-none", action="store_true",
                        help="receivers of the broadcast pass None instead of a buffer")
    args = parser.parse_args()
    rabit.init()
    rank = rabit.get_rank()
    replacement = rabit.engine_info().joined_as != "start"
    differ = args.differ if replacement else "none"
    rabit.load_checkpoint()

    dtype = np.float32 if differ == "allreduce" else np.float64
    total = rabit.allreduce(np.arange(3, dtype=dtype) + rank, rabit.Op.SUM)

    if rank == 0:
        sent = np.linspace(0.0, 1.0, 4)
    elif args.receivers_pass_none:
        sent = None
    else:
        sent = np.empty(4, dtype=np.float32 if differ == "broadcast" else np.float64)
    got = rabit.broadcast(sent, 0)

    rows = np.full((rank + 1, 3 if differ == "allgather" else 2), float(rank))
    gathered = rabit.allgather(rows)

    last = rabit.allreduce(np.ones(2) * (rank + 1), rabit.Op.MAX)
    rabit.checkpoint({"done": True})
    print("RESULT %d %s" % (rank, json.dumps({
        "total": total.tolist(), "broadcast": np.asarray(got).tolist(),
        "gathered": gathered.tolist(), "last": last.tolist(),
        "recoveries": rabit.engine_info().recoveries})), flush=True)
    rabit.finalize()


if __name__ == "__main__":
    main()
