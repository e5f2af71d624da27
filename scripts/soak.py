"""Soak: a storm of outside SIGKILLs into a training job under rabit-run.

    python scripts/soak.py [--ranks 4] [--spares 1] [--iterations 600] [--kills 30]
                           [--interval 0.3 1.5] [--pairs 3] [--busy 2] [--runs 1]
                           [--max-restarts 20] [--seed 0] [--json out.json]

Each run starts the same BSP training job (``--worker`` mode: two allreduces
and a checkpoint with a global and a per-rank local model every iteration)
under ``rabit-run --checkpoint-dir D --max-restarts R --spares S``, once
without failures (the reference, under the same load) and ``--runs`` times
while a killer thread SIGKILLs a random rank's current process at random
intervals (``--pairs`` of the kills are followed within 20-150 ms by a second
one on another rank, so that it lands inside the first one's recovery).
``--busy K`` keeps K CPU-bound loops running beside the job (a loaded node).

For every run it checks that the job ended by itself with status 0 and that
every rank's global and local model is bitwise equal to the reference, and
that nothing of the job is left behind (processes, ``/dev/shm`` segments,
``/tmp/ompi.*``/``/tmp/prte.*`` folders). It prints kills, in-job
recoveries, whole-job restarts (and why, from rabit-run's summary), time lost
per kill (storm time minus reference time, over the kills) and the longest
stall (the longest gap between two finished iterations), and writes JSON.

Only processes that descend from the rabit-run this script started are
killed. Timings on an oversubscribed machine (more ranks than cores) measure
the machine as much as the code: say so next to them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- worker side
def worker(args: argparse.Namespace) -> int:
    import numpy as np

    import rabit_py as rabit

    rabit.init()
    rank, size = rabit.get_rank(), rabit.get_world_size()
    pid_file = Path(args.pid_dir) / f"rank-{rank}"
    tmp = pid_file.with_suffix(f".{os.getpid()}")
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, pid_file)       # the killer reads whole files only
    print("START " + json.dumps({"rank": rank, "pid": os.getpid(),
                                 "joined": rabit.engine_info().joined_as,
                                 "restart": int(os.environ.get("RABIT_RESTART_COUNT", "0"))}),
          flush=True)
    version, model, local = rabit.load_checkpoint(with_local=True)
    if version == 0:
        model = {"w": np.zeros(args.dim), "best": []}
        local = {"rank": rank, "acc": np.zeros(4)}
    work = np.random.default_rng(rank).normal(size=(args.work, args.work))
    for it in range(version, args.iterations):
        def prepare(buf: np.ndarray, it: int = it) -> None:
            buf[:] = np.random.default_rng([rank, it]).normal(size=buf.shape)

        grad = np.empty(args.dim)
        rabit.allreduce(grad, rabit.Op.SUM, prepare_fun=prepare)
        best = rabit.allreduce(np.array([(rank * 7 + it) % 11]), rabit.Op.MAX)
        if args.work:
            work = np.tanh(work @ work.T * 1e-3)       # some compute per iteration
        if args.sleep:
            time.sleep(args.sleep)
        model["w"] = model["w"] - 0.01 * grad
        model["best"].append(int(best[0]))
        local["acc"] = local["acc"] + grad[:4] * (rank + 1)
        rabit.checkpoint(model, local)
        if rank == 0:
            print(f"SOAK-ROUND {it}", flush=True)
    digest = hashlib.sha256(model["w"].tobytes() + json.dumps(model["best"]).encode())
    print("RESULT " + json.dumps({"rank": rank, "version": rabit.version_number(),
                                  "global": digest.hexdigest(),
                                  "local": hashlib.sha256(local["acc"].tobytes()).hexdigest()}),
          flush=True)
    rabit.finalize()
    return 0


# ---------------------------------------------------------------- driver side
def _parents() -> Dict[int, int]:
    parents: Dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(entry.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def descendants(pid: int) -> Set[int]:
    """Live descendants of ``pid``."""
    children: Dict[int, List[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: Set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def debris() -> Set[str]:
    """Open MPI / rabit_py files that a job may leave behind."""
    names: Set[str] = set()
    for folder, prefixes in (("/dev/shm", ("sm_segment", "vader", "rabit", "ompi", "prte",
                                            "shmem")),
                             (tempfile.gettempdir(), ("ompi.", "prte.", "rabit-run-"))):
        try:
            names.update(f"{folder}/{n}" for n in os.listdir(folder) if n.startswith(prefixes))
        except OSError:
            pass
    return names


class Busy:
    """K CPU-bound loops beside the job (a loaded node)."""

    def __init__(self, count: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(count)]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


class Killer(threading.Thread):
    """SIGKILLs a random rank's current process at random intervals."""

    def __init__(self, job: subprocess.Popen, pid_dir: Path, ranks: int, kills: int,
                 interval: tuple, pairs: int, rng: random.Random, start_after: float) -> None:
        super().__init__(daemon=True)
        self.job, self.pid_dir, self.ranks = job, pid_dir, ranks
        self.kills, self.interval, self.rng = kills, interval, rng
        self.paired = set(rng.sample(range(kills), min(pairs, kills)))
        self.start_after = start_after
        self.done: List[dict] = []
        self.stop = threading.Event()
        self.on_kill: Optional[Callable[[int, int], None]] = None

    def _current(self, rank: int) -> Optional[int]:
        try:
            return int((self.pid_dir / f"rank-{rank}").read_text())
        except (OSError, ValueError):
            return None

    def _kill_one(self, avoid: Optional[int] = None) -> Optional[int]:
        """Kill a random rank whose current process is alive and ours."""
        ours = descendants(self.job.pid)
        ranks = [r for r in range(self.ranks) if r != avoid]
        self.rng.shuffle(ranks)
        for rank in ranks:
            pid = self._current(rank)
            if pid is not None and pid in ours:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.done.append({"t": time.time(), "rank": rank, "pid": pid})
                if self.on_kill is not None:
                    self.on_kill(rank, pid)
                return rank
        return None

    def run(self) -> None:
        if self.stop.wait(self.start_after):
            return
        for i in range(self.kills):
            if self.stop.wait(self.rng.uniform(*self.interval)):
                return
            rank = None
            while rank is None:         # between attempts no rank may be alive: wait
                if self.job.poll() is not None:
                    return
                rank = self._kill_one()
                if rank is None and self.stop.wait(0.1):
                    return
            if rank is not None and i in self.paired:
                if self.stop.wait(self.rng.uniform(0.02, 0.15)):
                    return
                self._kill_one(avoid=rank)


def run_job(args: argparse.Namespace, kills: int, seed: int, log_path: Path) -> dict:
    """One job under rabit-run; with ``kills`` > 0, the killer runs beside it."""
    work = Path(tempfile.mkdtemp(prefix="rabit-soak-"))
    pid_dir = work / "pids"
    pid_dir.mkdir()
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(args.ranks),
           "--checkpoint-dir", str(work / "ckpt"), "--max-restarts", str(args.max_restarts),
           "--restart-delay", str(args.restart_delay)]
    if args.spares:
        cmd += ["--spares", str(args.spares)]
    cmd += ["--", sys.executable, os.path.abspath(__file__), "--worker", "--pid-dir",
            str(pid_dir), "--iterations", str(args.iterations), "--dim", str(args.dim),
            "--work", str(args.work), "--sleep", str(args.sleep)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.setdefault("RABIT_TIMEOUT", str(args.collective_timeout))
    before = debris()
    start = time.time()
    rounds: List[float] = []
    lines: List[str] = []
    with open(log_path, "w") as log:
        job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env, start_new_session=True)
        seen_pids: Set[int] = set()

        def read() -> None:
            assert job.stdout is not None
            for line in job.stdout:
                log.write(f"{time.time() - start:9.3f} {line}")
                lines.append(line.rstrip("\n"))
                if line.startswith("SOAK-ROUND "):
                    rounds.append(time.time())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        killer = None
        if kills:
            killer = Killer(job, pid_dir, args.ranks, kills, tuple(args.interval), args.pairs,
                            random.Random(seed), args.start_after)
            killer.on_kill = lambda rank, pid: log.write(
                f"{time.time() - start:9.3f} SOAK-KILL rank {rank} pid {pid}\n")
            killer.start()
        wedged = False
        try:
            while job.poll() is None:
                seen_pids |= descendants(job.pid)
                if time.time() - start > args.timeout:
                    wedged = True
                    break
                time.sleep(0.2)
        finally:
            if killer is not None:
                killer.stop.set()
                killer.join()
            if job.poll() is None:
                for pid in descendants(job.pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    os.killpg(job.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            code = job.wait()
            reader.join(timeout=10)
    elapsed = time.time() - start
    time.sleep(0.5)
    alive = sorted(p for p in seen_pids if Path(f"/proc/{p}").exists()
                   and _parents().get(p) is not None)
    left = sorted(debris() - before)
    results: Dict[int, dict] = {}
    starts = []
    for line in lines:
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            results[r["rank"]] = r
        elif line.startswith("START "):
            # raw_decode: a killed rank's unfinished line can have another
            # rank's output glued after its JSON (mpirun forwards chunks).
            starts.append(json.JSONDecoder().raw_decode(line[6:])[0])
    restarts = max((s["restart"] for s in starts), default=0)
    replaced = sum(1 for s in starts if s["joined"] != "start")
    gaps = [b - a for a, b in zip(rounds, rounds[1:])]
    reasons = [line for line in lines if line.startswith("rabit-run:")]
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return {"status": code, "wedged": wedged, "seconds": elapsed, "results": results,
            "kills": len(killer.done) if killer else 0,
            "in_job_recoveries": replaced, "restarts": restarts,
            "longest_stall": max(gaps, default=0.0), "rounds_seen": len(rounds),
            "left_processes": alive, "left_files": left, "rabit_run_said": reasons[-12:],
            "log": str(log_path)}


def check(run: dict, reference: dict, ranks: int) -> List[str]:
    """What is wrong with a run (empty: it passed)."""
    problems = []
    if run["wedged"]:
        problems.append(f"wedged: still running after {run['seconds']:.0f} s")
    if run["status"] != 0:
        problems.append(f"exit status {run['status']}")
    for rank in range(ranks):
        got, want = run["results"].get(rank), reference["results"].get(rank)
        if got is None:
            problems.append(f"rank {rank}: no result")
        elif (got["global"], got["local"], got["version"]) != \
                (want["global"], want["local"], want["version"]):
            problems.append(f"rank {rank}: models differ from the failure-free run")
    if run["left_processes"]:
        problems.append(f"processes left: {run['left_processes']}")
    if run["left_files"]:
        problems.append(f"files left: {run['left_files']}")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pid-dir", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--spares", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=600)
    parser.add_argument("--dim", type=int, default=1000, help="model size (float64)")
    parser.add_argument("--work", type=int, default=0,
                        help="a WORK x WORK matrix product per iteration (compute)")
    parser.add_argument("--sleep", type=float, default=0.04,
                        help="seconds each iteration waits (the job's length)")
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--interval", type=float, nargs=2, default=[0.3, 1.5],
                        metavar=("MIN", "MAX"), help="seconds between kills")
    parser.add_argument("--pairs", type=int, default=3,
                        help="kills followed by a second one within 20-150 ms")
    parser.add_argument("--start-after", type=float, default=2.0,
                        help="seconds before the first kill (the job starting)")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound loops beside the job")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-restarts", type=int, default=20)
    parser.add_argument("--restart-delay", type=float, default=0.5)
    parser.add_argument("--collective-timeout", type=float, default=60)
    parser.add_argument("--timeout", type=float, default=600,
                        help="a run still going after this many seconds is wedged")
    parser.add_argument("--log-dir", default=None, help="keep each run's output here")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="rabit-soak-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    busy = Busy(args.busy)
    try:
        print(f"soak: {args.ranks} ranks + {args.spares} spare(s), {args.iterations} "
              f"iterations, {args.kills} kills every {args.interval[0]}-{args.interval[1]} s "
              f"({args.pairs} paired), {args.busy} busy loop(s), {os.cpu_count()} cores; "
              f"logs in {log_dir}", flush=True)
        reference = run_job(args, 0, args.seed, log_dir / "reference.log")
        ref_problems = check(reference, reference, args.ranks)
        if ref_problems or len(reference["results"]) != args.ranks:
            print(f"soak: the failure-free run failed: {ref_problems}", flush=True)
            return 2
        print(f"soak: failure-free run {reference['seconds']:.1f} s", flush=True)
        runs = []
        for i in range(args.runs):
            run = run_job(args, args.kills, args.seed + 1 + i, log_dir / f"storm-{i}.log")
            run["problems"] = check(run, reference, args.ranks)
            run["lost_per_kill"] = ((run["seconds"] - reference["seconds"]) / run["kills"]
                                    if run["kills"] else 0.0)
            runs.append(run)
            print(f"soak: run {i}: {'ok' if not run['problems'] else 'FAILED'} "
                  f"{run['seconds']:.1f} s, {run['kills']} kills, "
                  f"{run['in_job_recoveries']} in-job replacements, {run['restarts']} "
                  f"restarts, lost {run['lost_per_kill']:.2f} s/kill, longest stall "
                  f"{run['longest_stall']:.2f} s"
                  + ("" if not run["problems"] else f"; {'; '.join(run['problems'])}"),
                  flush=True)
            if run["problems"]:
                for line in run["rabit_run_said"]:
                    print(f"      {line}", flush=True)
    finally:
        busy.stop()
    ok = sum(1 for r in runs if not r["problems"])
    print()
    print(f"| runs ok | kills | in-job replacements | restarts | lost s/kill (mean) | "
          f"longest stall s |")
    print("|---|---|---|---|---|---|")
    print(f"| {ok}/{len(runs)} | {sum(r['kills'] for r in runs)} | "
          f"{sum(r['in_job_recoveries'] for r in runs)} | {sum(r['restarts'] for r in runs)} | "
          f"{statistics.mean(r['lost_per_kill'] for r in runs):.2f} | "
          f"{max(r['longest_stall'] for r in runs):.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": {k: v for k, v in vars(args).items() if k not in ("worker", "pid_dir")},
            "reference_seconds": reference["seconds"],
            "runs": [{k: v for k, v in r.items() if k != "results"} for r in runs]}, indent=1))
    return 0 if ok == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
