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
import sys

import numpy as np

import rabit_py as rabit


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--calls", type=int, default=4, help="allreduces per round")
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()
    rabit.init()
    rank = rabit.get_rank()
    info = rabit.engine_info()
    print("START " + json.dumps({"rank": rank, "pid": os.getpid(), "trial": info.trial}),
          flush=True)
    version, model = rabit.load_checkpoint()
    count = args.mib * (1 << 20) // 8
    if version == 0:
        model = np.zeros(count)
    # One random array, scaled per call: little time outside the allreduces.
    base = np.random.default_rng(rank).normal(size=count)
    grad = np.empty_like(base)
    for it in range(version, args.rounds):
        for call in range(args.calls):
            np.multiply(base, 1.0 + it * args.calls + call, out=grad)
            rabit.allreduce(grad, rabit.Op.SUM)
            model += grad * 1e-3
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
