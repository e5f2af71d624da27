"""Rounds of large allreduces, for a kill from outside that lands inside one.

Each round reduces a large float64 array (``--mib``) a few times, without
``prepare_fun`` (the robust engine keeps the input to run a call again), and
checkpoints. Every rank prints ``START <json>`` (with its pid), ``ROUND <i>``
after each round (rank 0), and ``RESULT <json>`` with the digest of its model.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np

import rabit_py as rabit


def die_after_check(rank: int, version: int, seqno: int, late: int) -> None:
    """Note [uniform check] in rabit_py/engine/_shm.py: ``rank`` dies with
    its flag of that check up, which the others must take as passed, while
    rank ``late`` comes to it late."""
    from rabit_py.engine._shm import NodeReducer
    exchange = NodeReducer.exchange_check
    frame = rabit.api._engine.frame

    def raise_flag_and_die(reducer, vec):
        if (frame.version, frame.token[2]) != (version, seqno) or frame.rank not in (rank, late):
            return exchange(reducer, vec)
        if frame.rank == late:
            time.sleep(0.5)
            return exchange(reducer, vec)
        seq = reducer._checked + 1
        reducer._check_rows[seq & 1][reducer.node_rank][:] = vec
        reducer._check_flags[reducer.node_rank][0] = seq
        print(f"DYING after the check flag of version {version} call {seqno}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    NodeReducer.exchange_check = raise_flag_and_die


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=4, help="allreduces per round")
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--lazy", action="store_true", help="lazy_checkpoint the model")
    parser.add_argument("--die-after-check", default="",
                        help="'rank,version,seqno': that rank's first life raises its flag "
                             "of that call's signature check on the node, then kills itself")
    parser.add_argument("--late", type=int, default=-1,
                        help="with --die-after-check: this rank comes to that check 0.5 s "
                             "late (the others wait for its flag while the dead one's is up)")
    args = parser.parse_args()
    rabit.init()
    rank = rabit.get_rank()
    info = rabit.engine_info()
    if args.die_after_check and info.trial == 0:
        die_after_check(*(int(v) for v in args.die_after_check.split(",")), late=args.late)
    print("START " + json.dumps({"rank": rank, "pid": os.getpid(), "trial": info.trial}),
          flush=True)
    version, model = rabit.load_checkpoint()
    count = args.mib * (1 << 20) // 8
    if version == 0:
        model = np.zeros(count)
    # One random array, scaled per call: little time outside the allreduces.
    base = np.random.default_rng(rank).normal(size=count)
    grad = np.empty_like(base)
    step = np.empty_like(base)
    for it in range(version, args.rounds):
        step[:] = 0.0
        for call in range(args.calls):
            np.multiply(base, 1.0 + it * args.calls + call, out=grad)
            rabit.allreduce(grad, rabit.Op.SUM)
            step += grad * 1e-3
        # A new array, not `model += step`: a lazy checkpoint's model must not
        # change until the next checkpoint (a replacement is given the object
        # as it is then; an outside-kill storm caught the in-place update).
        model = model + step
        if args.lazy:
            rabit.lazy_checkpoint(model)
        else:
            rabit.checkpoint(model)
        if rank == 0:
            print(f"ROUND {it}", flush=True)
    print("RESULT " + json.dumps({
        "rank": rank, "version": rabit.version_number(),
        "model": hashlib.sha256(model.tobytes()).hexdigest(),
        "recoveries": rabit.engine_info().recoveries}), flush=True)
    rabit.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
