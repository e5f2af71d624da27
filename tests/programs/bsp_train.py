"""A Rabit-style training loop for the fault tests (and a user's reference).

Every rank prints ``START <json>`` when it starts and ``RESULT <json>`` at the
end: the digest of its final global model, its local model, its pid, and the
rounds for which its ``prepare_fun`` ran. Fault injection comes from the
environment (``RABIT_ENGINE=mock``, ``RABIT_MOCK=...``).
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

import rabit_py as rabit


def gradient(rank: int, it: int, w: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng([rank, it])
    return rng.normal(size=w.shape) + 0.01 * w


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per round")
    parser.add_argument("--mismatch-at", type=int, default=-1)
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--announce-last-spare", action="store_true",
                        help="the last spare process prints SPARE <pid> before init(), so "
                             "that a test can kill it while it waits")
    parser.add_argument("--linger-on-error", type=float, default=0.0,
                        help="seconds to stay after a RecoveryError: mpirun ends the whole job "
                             "at the second non-zero exit, which could cut short what the "
                             "spares have to say")
    parser.add_argument("--slow-replacement", type=float, default=0.0,
                        help="seconds a process spawned by a repair sleeps before init() (its "
                             "MPI world is the spawn's: smaller than the job's)")
    parser.add_argument("--hang", default="",
                        help="RANK,ROUND: that rank's first process (of the first attempt) "
                             "hangs in its own code (sleeps for an hour) in that round, "
                             "between calls 1 and 2")
    parser.add_argument("--hang-always", action="store_true",
                        help="with --hang: its replacements hang there too")
    args = parser.parse_args()
    hang_rank, hang_round = map(int, args.hang.split(",")) if args.hang else (-1, -1)

    # A spare is one of the last RABIT_SPARES processes of the MPI job.
    spares = int(os.environ.get("RABIT_SPARES", "0") or 0)
    world_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world_size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if args.announce_last_spare and spares and world_rank == world_size - 1:
        print(f"SPARE {os.getpid()}", flush=True)
    if args.slow_replacement and "PMIX_NAMESPACE" in os.environ and \
            not os.environ["PMIX_NAMESPACE"].endswith("@1"):
        time.sleep(args.slow_replacement)       # a spawned job's namespace is @2, @3, ...
    rabit.init()
    rank, size = rabit.get_rank(), rabit.get_world_size()
    info = rabit.engine_info()
    trial, joined = info.trial, info.joined_as
    print("START " + json.dumps({"rank": rank, "pid": os.getpid(), "trial": trial,
                                 "joined": joined, "host": rabit.get_processor_name()}),
          flush=True)
    config = rabit.broadcast({"dim": 5, "scale": 0.1} if rank == 0 else None, root=0)
    version, model, local = rabit.load_checkpoint(with_local=True)
    if version == 0:
        model = {"w": np.zeros(config["dim"]), "history": []}
        local = {"rank": rank, "rows_seen": 0}
    prepared = []
    try:
        for it in range(version, args.rounds):
            def prepare(buf: np.ndarray, it: int = it) -> None:
                prepared.append(it)
                buf[:] = gradient(rank, it, model["w"])

            grad = np.empty(config["dim"])
            rabit.allreduce(grad, rabit.Op.SUM, prepare_fun=prepare)              # seqno 0
            best = rabit.allreduce(np.array([(rank + 1) * (it + 3) % 7]), rabit.Op.MAX)  # 1
            first = trial == 0 and os.environ.get("RABIT_RESTART_COUNT", "0") in ("", "0")
            if rank == hang_rank and it == hang_round and (first or args.hang_always):
                print(f"HANG {rank} {os.getpid()}", flush=True)
                time.sleep(3600)
            root = it % size
            lr = rabit.broadcast(config["scale"] / (1 + it) if rank == root else None, root)  # 2
            shape = (rank % 3 + 1, 2 if not (it == args.mismatch_at and rank == 1) else 3)
            rows = rabit.allgather(np.full(shape, it * 10 + rank, dtype=np.float32))  # 3
            if it == args.raise_at and rank == 1:
                raise RuntimeError(f"a bug in round {it} on rank {rank}")
            model["w"] = model["w"] - lr * grad + float(rows.sum()) * 1e-6
            model["history"].append(int(best[0]))
            local["rows_seen"] += int(rows.shape[0])
            if args.sleep:
                time.sleep(args.sleep)
            rabit.checkpoint(model, local)                                           # 4
            if rank == 0:
                # The model's digest per round: a run that differs from the
                # failure-free one shows the first round that did.
                print(f"ROUND {it} done {hashlib.sha256(model['w'].tobytes()).hexdigest()[:12]}",
                      flush=True)
    except rabit.CollectiveMismatchError as exc:
        print("MISMATCH " + json.dumps({"rank": rank, "message": str(exc)}), flush=True)
    except rabit.RecoveryError as exc:
        print("RECOVERY_ERROR " + json.dumps({"rank": rank, "message": str(exc)}), flush=True)
        sys.stdout.flush()
        time.sleep(args.linger_on_error)
        os._exit(3)
    digest = hashlib.sha256(model["w"].tobytes() + json.dumps(model["history"]).encode())
    print("RESULT " + json.dumps({
        "rank": rank, "world": rabit.get_world_size(), "pid": os.getpid(), "trial": trial,
        "joined": joined, "version": rabit.version_number(), "model": digest.hexdigest(),
        "local": local,
        "prepared": prepared, "cpu_s": time.process_time()}), flush=True)
    rabit.finalize()
    print(f"FINALIZED {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
