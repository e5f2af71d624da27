"""A worker of a job with server processes (rabit-run --servers S): drives a
server-backed KVStore and writes what it saw as JSON, one file per rank.

Scenarios:
  train      pushes and pulls for --iterations steps (a straggler sleeps each
             step), then the final values and every pull's clocks
  priority   pushes queued under hold() with priorities, and a pull of another
             key from a second thread: the order they were sent in
  errors     the errors a user meets, each caught and recorded
  resume     train with shard checkpoints, printing "ready RANK PID attempt
             A" first: a restarted job resumes from the servers' checkpoints
             (each worker's loop starts at kv.clock())
"""

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import rabit_py as rabit  # noqa: E402
from rabit_py import kvstore  # noqa: E402
from rabit_py.kvstore.optimizer import SGD  # noqa: E402
from tests.programs.kv_updaters import broken, scaled_add  # noqa: E402


def make_store(args):
    kwargs = {"bigarray_bound": 64, "checkpoint_every": args.checkpoint_every,
              "timeout": args.timeout, "replicas": args.replicas}
    if args.mode == "dist_ssp":
        kwargs["staleness"] = args.staleness
    return kvstore.create(args.mode, **kwargs)


def train(kv, args, iterations):
    rank = kv.rank
    kv.init("small", np.zeros(5))
    kv.init(7, np.zeros(200, dtype=np.float32))         # split over the servers (>= 64)
    if args.updater == "sgd":
        kv.set_optimizer(SGD(learning_rate=0.5))
    elif args.updater == "scaled":
        kv.set_updater(scaled_add)
    start = kv.clock()
    for _ in range(start, iterations):
        if rank == args.straggler:
            time.sleep(args.delay)
        time.sleep(args.pace)
        kv.push("small", np.full(5, rank + 1.0))
        kv.push(7, np.ones(200, dtype=np.float32))
        kv.pull("small")
        kv.pull(7)
    kv.barrier()
    return {"small": kv.pull("small").tolist(), "big": kv.pull(7).tolist(),
            "pull_clocks": [list(r[:3]) + [list(r[3])] for r in kv.pull_clocks],
            "workers": kv.num_workers, "servers": kv.num_servers, "type": kv.type,
            "start": start}


def priority(kv):
    kv.init(["a", "b", "c", "d"], [np.zeros(3)] * 4)
    kv.barrier()
    start = len(kv.sent)
    with kv.hold():
        kv.push("a", np.ones(3), priority=0)
        kv.push("b", np.ones(3), priority=5)
        kv.push("c", np.ones(3), priority=1)
        kv.push("a", np.ones(3), priority=9)        # behind the first push of a
        puller = threading.Thread(target=kv.pull, args=("d",), kwargs={"priority": 10})
        puller.start()
        while len(kv._client._heads) < 4:           # the pull of d is queued too
            time.sleep(0.01)
    puller.join()
    order = [f"{op} {key}" for key, op in list(kv.sent)[start:]]
    kv.barrier()                                    # every worker's pushes sent
    kv.pull("a")                                    # ... and applied: behind them
    values = {k: kv.pull(k).tolist() for k in "abcd"}
    return {"order": order, "values": values}


def main_level_updater(key, grad, weight):
    """Picklable here, but by the name __main__.main_level_updater, which a
    server process cannot import."""
    weight += grad


def errors(kv):
    seen = {}

    def attempt(name, call):
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            seen[name] = [type(exc).__name__, str(exc)]
        else:
            seen[name] = None

    def local_updater(key, grad, weight):
        weight += grad

    kv.init("w", np.zeros(4))
    attempt("local_updater", lambda: kv.set_updater(local_updater))
    attempt("main_updater", lambda: kv.set_updater(main_level_updater))
    attempt("unknown_key", lambda: kv.push("nope", np.zeros(4)))
    attempt("bad_shape", lambda: kv.push("w", np.zeros(5)))
    attempt("init_twice", lambda: kv.init("w", np.zeros(4)))
    attempt("ssp_without_staleness", lambda: kvstore.create("dist_ssp"))
    attempt("async_with_staleness", lambda: kvstore.create("dist_async", staleness=2))
    attempt("checkpoint", lambda: kv.checkpoint())
    attempt("checkpoint_without_folder", lambda: kvstore.create("dist_async",
                                                                 checkpoint_every=5))
    kv.set_updater(broken)
    kv.push("w", np.ones(4))
    attempt("broken_updater", lambda: kv.pull("w"))
    return seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("--mode", default="dist_async")
    parser.add_argument("--staleness", type=int, default=None)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--straggler", type=int, default=-1)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--updater", default="none")
    parser.add_argument("--pace", type=float, default=0.0, help="every worker's sleep a step")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--replicas", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rabit.init()
    kv = make_store(args)
    if args.scenario == "train":
        result = train(kv, args, args.iterations)
    elif args.scenario == "priority":
        result = priority(kv)
    elif args.scenario == "errors":
        result = errors(kv)
    elif args.scenario == "resume":
        restart = int(os.environ.get("RABIT_RESTART_COUNT", "0"))
        print(f"ready {kv.rank} {os.getpid()} attempt {restart}", flush=True)
        result = train(kv, args, args.iterations)
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    kv.close()
    with open(os.path.join(args.out, f"rank{rabit.get_rank()}.json"), "w") as f:
        json.dump(result, f)
    rabit.finalize()


if __name__ == "__main__":
    main()
