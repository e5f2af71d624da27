"""Benchmark: what a failure costs the robust engine, and what checkpoints cost.

    python scripts/bench_recovery.py [--ranks 4] [--json out.json] [--plot out.png]
    python scripts/bench_recovery.py --before REV --load-rows 0 --runs 7

It starts the same training job (``--worker`` mode, a BSP loop of allreduce
and checkpoint) under ``rabit-run``, once without and ``--runs`` times with a
rank killed by the mock engine, and reports:

- recovery broken down on the survivors: detection (kill to exception),
  shrink, spawn, merge/split, replay (repaired to back in step), and the time
  the failure added to the job (whole job, and the training loop alone);
- checkpoint cost against model size (a global and a local model of that size)
  on the robust and the plain engine, side by side in the failure-free job;
- the memory held by the result cache at the end of a round;
- the same with one spare process (``rabit-run --spares 1``), which takes the
  dead rank's place instead of a spawned replacement;
- whole-job restart from the durable checkpoint (``rabit-run --max-restarts 1
  --checkpoint-dir``, in-job recovery off) against in-job recovery, for the
  same kill, with a realistic start-up (imports and loading each rank's
  data): time from the kill to the job's next finished round, and time lost;
- a durable checkpoint version (fresh, and in steady state where pruned
  files are recycled) against a raw file write of the same bytes;
- real XGBoost (``scripts/xgboost_train.py``, same data, same workers):
  ``rabit_py.xgboost`` recovering a rank killed with SIGKILL from outside,
  (spawned, and with ``--spares 1``) against XGBoost alone restarted whole
  by ``rabit-run --max-restarts 1``
  from the user's last save (both save every ``--xgb-every`` rounds): time
  from the kill to the next new round, and time lost. ``--xgboost`` runs
  only this part.

``--before REV`` measures only the recovery steps of one kill (spawned and
spare), on this tree and on revision REV side by side, runs alternating.
Jobs run with Python's bytecode cache on (as an installed package has it),
whatever ``PYTHONDONTWRITEBYTECODE`` says.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np
from rabit_py.extras import require  # noqa: E402

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


# ---------------------------------------------------------------- worker side
def worker(args: argparse.Namespace) -> int:
    import rabit_py as rabit

    from trainers.data import make_higgs_like     # start-up: imports and data loading

    rabit.init()
    engine = rabit.api._engine
    rank = rabit.get_rank()
    start = time.time()
    if args.load_rows:
        make_higgs_like(args.load_rows, seed=rank)
    version, model = rabit.load_checkpoint()
    first_round = True
    if version == 0:
        model = np.zeros(args.elements)
    grad = np.empty(args.elements)
    for it in range(version, args.rounds):
        def prepare(buf: np.ndarray, it: int = it) -> None:
            buf[:] = np.sin(np.arange(buf.size) * (rank + 1) + it)

        rabit.allreduce(grad, rabit.Op.SUM, prepare_fun=prepare)
        for _ in range(3):
            rabit.allreduce(np.array([float(it)]), rabit.Op.MAX)
        model = model + 1e-3 * grad
        cache_bytes = rabit.engine_info().cache_bytes
        rabit.checkpoint(model)
        if first_round and rank == 0:
            print(f"FIRST_ROUND {time.time():.6f} {version}", flush=True)
        first_round = False
    elapsed = time.time() - start
    report = {"rank": rank, "elapsed": elapsed, "cache_bytes_per_round": cache_bytes,
              "recoveries": engine.recovery.log,
              "repair": vars(engine.recovery.repair_times), "trial": rabit.engine_info().trial}
    if args.checkpoint_sizes:     # collective: every rank measures
        report["checkpoint"] = checkpoint_costs(rabit, args)
    print("REPORT " + json.dumps(report), flush=True)
    rabit.finalize()
    return 0


def checkpoint_costs(rabit, args: argparse.Namespace) -> Dict[str, Dict[str, float]]:
    """Seconds per checkpoint(global, local) by size, on this engine and the plain one."""
    costs: Dict[str, Dict[str, float]] = {}
    for name in ("robust", "mpi"):
        if name == "mpi":
            rabit.finalize()
            rabit.init(engine="mpi")
        costs[name] = {}
        for nbytes in SIZES:
            glob = np.ones(nbytes // 8)
            local = np.ones(nbytes // 8)
            reps = 5 if nbytes < (16 << 20) else 2
            rabit.checkpoint(glob, local)                    # warm-up
            t0 = time.perf_counter()
            for _ in range(reps):
                rabit.checkpoint(glob, local)
            costs[name][str(nbytes)] = (time.perf_counter() - t0) / reps
        if name == "mpi":
            rabit.finalize()
            rabit.init(engine="robust")
    return costs


# ---------------------------------------------------------------- driver side
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_environment(env: Dict[str, str], tree: str) -> Dict[str, str]:
    """The environment of a benchmark job on source tree ``tree``. Python
    writes and reuses compiled bytecode, as for an installed package: with
    ``PYTHONDONTWRITEBYTECODE`` set every replacement compiled rabit_py's
    modules from source again (57 ms of its start-up on the development VM)."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**base, "PYTHONPATH": tree, **env}


def launch(ranks: int, env: Dict[str, str], extra: List[str],
           options: Optional[List[str]] = None, tree: str = ROOT) -> tuple:
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(ranks), *(options or []), "--",
           sys.executable, os.path.join(tree, "scripts", "bench_recovery.py"), "--worker"] + extra
    start = time.time()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=900, env=job_environment(env, tree), cwd=tree).stdout
    wall = time.time() - start
    reports = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("REPORT ")]
    if len(reports) != ranks:
        raise SystemExit(f"the job did not finish on every rank:\n{out[-4000:]}")
    return wall, reports, out


def kill_runs(args: argparse.Namespace, common: List[str], base_wall: float,
              base: List[dict], options: List[str], tree: str = ROOT,
              runs_wanted: Optional[int] = None, first: int = 0) -> List[dict]:
    """Jobs (``args.runs``, or ``runs_wanted``) with one rank killed mid-run;
    each run's recovery steps. ``first``: the first run's number (which rank
    is killed)."""
    runs = []
    for i in range(first, first + (args.runs if runs_wanted is None else runs_wanted)):
        victim = 1 + i % (args.ranks - 1)
        plan = f"{victim},{args.rounds // 2},1,0"
        wall, reports, out = launch(args.ranks, {"RABIT_ENGINE": "mock", "RABIT_MOCK": plan},
                                    common, options, tree)
        killed_at = float(re.search(r"killed at .*\(time ([\d.]+)\)", out).group(1))
        survivors = [r for r in reports if r["trial"] == 0 and r["recoveries"]]
        rec = [r["recoveries"][0] for r in survivors]
        steps = {
            "detect": max(r["detected"] for r in rec) - killed_at,
            "shrink": max(r["repair"]["shrink"] for r in survivors),
            "spawn": max(r["repair"]["spawn"] for r in survivors),
            "merge": max(r["repair"]["merge"] for r in survivors),
            "replay": max(r["resumed"] - r["repaired"] for r in rec),
            "added_wall": wall - base_wall,
            "added_loop": (max(r["elapsed"] for r in survivors)
                           - max(r["elapsed"] for r in base)),
        }
        runs.append({"plan": plan, "wall": wall, "steps": steps,
                     "kill_to_progress": max(r["resumed"] for r in rec) - killed_at})
    return runs


def restart_comparison(args: argparse.Namespace, common: List[str], base_wall: float,
                       runs: List[dict], spare_runs: List[dict]) -> Dict[str, Dict[str, float]]:
    """The same kill handled by a whole-job restart from disk, next to the
    in-job recoveries measured above."""
    import tempfile

    plan = runs[0]["plan"]
    with tempfile.TemporaryDirectory() as folder:
        wall, _, out = launch(args.ranks, {"RABIT_ENGINE": "mock", "RABIT_MOCK": plan,
                                           "RABIT_MAX_RECOVERIES": "0"}, common,
                              ["--max-restarts", "1", "--restart-delay", "0",
                               "--checkpoint-dir", folder])
    killed_at = float(re.search(r"killed at .*\(time ([\d.]+)\)", out).group(1))
    resumed = [float(t) for t, v in re.findall(r"FIRST_ROUND ([\d.]+) (\d+)", out)
               if int(v) > 0]
    def summary(runs: List[dict]) -> Dict[str, float]:
        return {"kill_to_progress": statistics.median(r["kill_to_progress"] for r in runs),
                "time_lost": statistics.median(r["steps"]["added_wall"] for r in runs)}

    return {"in_job": summary(runs), "in_job_spare": summary(spare_runs),
            "restart": {"kill_to_progress": resumed[0] - killed_at,
                        "time_lost": wall - base_wall}}


EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xgboost_train.py")


def run_and_kill(command: List[str], env: Dict[str, str], cue: Optional[str],
                 victim: int) -> tuple:
    """Run ``command``; when a line starts with ``cue``, SIGKILL rank
    ``victim`` (its pid from ``START``/``PID`` lines). Returns (wall seconds,
    output, kill time or None)."""
    import signal

    start = time.time()
    # A wall-clock limit that rabit-run honours by ending its whole job (its
    # ranks live in process groups of their own, out of reach of killpg).
    command = ["timeout", "-k", "30", "900", *command]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **env}, start_new_session=True)
    lines, pids, killed_at = [], {}, None
    try:
        for line in proc.stdout:
            lines.append(line)
            match = re.match(r"PID (\d+) (\d+)", line)
            if match:
                pids[int(match.group(1))] = int(match.group(2))
            if cue and killed_at is None and line.startswith(cue):
                os.kill(pids[victim], signal.SIGKILL)
                killed_at = time.time()
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines)
    if proc.returncode != 0:
        raise SystemExit(f"the job failed:\n{out[-4000:]}")
    return time.time() - start, out, killed_at


def xgboost_comparison(args: argparse.Namespace) -> Dict[str, object]:
    """rabit_py.xgboost's in-job recovery against XGBoost's restart of the
    whole job, for the same kill (rank 1, in the middle of an interval; with
    ``--hosts``, the last rank, on the second of three namespace hosts)."""
    common = ["--rows", str(args.xgb_rows), "--rounds", str(args.xgb_rounds),
              "--every", str(args.xgb_every), "--quiet", "--print-pid"]
    kill_round = args.xgb_rounds // 2 + args.xgb_every // 2
    cue = f"ROUND 1 {kill_round} "
    # On hosts (--hosts): 3 namespace hosts of 2 slots, the ranks filling
    # the first two; the last rank, on the second host, is killed.
    victim = args.ranks - 1 if args.hosts else 1
    result: Dict[str, object] = {"rows": args.xgb_rows, "rounds": args.xgb_rounds,
                                 "every": args.xgb_every, "kill_round": kill_round,
                                 "victim": victim, "hosts": bool(args.hosts)}
    with contextlib.ExitStack() as stack:
        hosts = None
        if args.hosts:
            from cluster_demo import Hosts
            hosts = stack.enter_context(Hosts(3, 2))
        for mode in ("rabit_py", "rabit_py_spare", "xgboost"):
            result[mode] = _xgboost_mode(args, mode, common, cue, victim, kill_round, hosts)
    return result


def _xgboost_mode(args: argparse.Namespace, mode: str, common: List[str], cue: str,
                  victim: int, kill_round: int, hosts: Any) -> Dict[str, object]:
    """One column of :func:`xgboost_comparison`: a failure-free run, then
    ``args.runs`` runs with the kill."""
    import tempfile

    walls, lost, to_progress, hangs = [], [], [], 0
    for run in range(1 + args.runs):
        # Across hosts the folders must be on the filesystem every host sees.
        with tempfile.TemporaryDirectory(dir=hosts.shared if hosts else None) as folder:
            extra = ["--out", os.path.join(folder, "m.json")]
            options: List[str] = []
            env = {"RABIT_ENGINE": "robust"}
            if hosts is not None and mode != "xgboost":
                # Open MPI's repair across hosts can fail (Note [several
                # hosts]): the restart it then takes needs the folder.
                options = ["--checkpoint-dir", os.path.join(folder, "ckpt"),
                           "--max-restarts", "1", "--restart-delay", "0"]
            if mode == "rabit_py_spare":
                options += ["--spares", "1"]
            if mode == "xgboost":
                extra += ["--xgboost-only", "--save-dir", folder]
                options = ["--max-restarts", "1", "--restart-delay", "0"]
                env = {"RABIT_ENGINE": "mpi"}
            program = [sys.executable, EXAMPLE, *common, *extra]
            command = (hosts.rabit_run(args.ranks, program, *options) if hosts is not None
                       else [sys.executable, "-m", "rabit_py.launcher", "-n", str(args.ranks),
                             *options, "--", *program])
            wall, out, killed_at = run_and_kill(command, env, cue if run else None, victim)
        if not run:
            walls.append(wall)
            continue
        after = [float(t) for r, t in re.findall(r"^ROUND 0 (\d+) ([\d.]+)", out, re.M)
                 if int(r) > kill_round and float(t) > killed_at]
        if not after:
            raise SystemExit(f"no round after the kill ({mode}):\n{out[-4000:]}")
        to_progress.append(after[0] - killed_at)
        lost.append(wall - walls[0])
        # Note [xgboost hang] in rabit_py/xgboost/_session.py: a survivor that
        # XGBoost left hanging ends itself 3 s later and is replaced too.
        hangs += "XGBoost's communication thread ended while" in out
    return {"failure_free_wall": walls[0],
            "kill_to_progress": statistics.median(to_progress),
            "time_lost": statistics.median(lost), "runs": len(lost),
            "kill_to_progress_runs": to_progress, "time_lost_runs": lost,
            "runs_with_an_xgboost_hang": hangs}


def print_xgboost(result: Dict[str, object], ranks: int) -> None:
    where = ("across 3 namespace hosts (2 slots each), " if result.get("hosts") else "")
    print(f"\nreal XGBoost, {ranks} workers {where}{result['rows']} rows, {result['rounds']} "
          f"rounds, a save every {result['every']}; rank {result.get('victim', 1)} killed at "
          f"round {result['kill_round']} "
          f"(median of {result['rabit_py']['runs']} runs, seconds)")
    print(f"{'':>18}{'rabit_py':>10}{'+spare':>10}{'xgboost':>10}{'xgboost/rabit_py':>18}"
          f"{'xgboost/spare':>15}")
    for key in ("failure_free_wall", "kill_to_progress", "time_lost"):
        a, s, b = (result[m][key] for m in ("rabit_py", "rabit_py_spare", "xgboost"))
        print(f"{key:>18}{a:10.2f}{s:10.2f}{b:10.2f}{b / a:18.1f}{b / s:15.1f}")
    hangs = [result[m]["runs_with_an_xgboost_hang"] for m in ("rabit_py", "rabit_py_spare")]
    print(f"runs where XGBoost left a survivor hanging (ended by rabit_py's guard, Note "
          f"[xgboost hang]): {hangs[0]} and {hangs[1]} of {result['rabit_py']['runs']}")


def durable_write_costs(reps: int = 9) -> Dict[int, tuple]:
    """(raw, durable first, durable steady) seconds per size (medians of ``reps``).

    raw: open, write, fsync of a new file. durable: one whole version of a
    global model through the store (``save`` + ``flush``: the checkpoint file
    with its header and CRC, the manifest, the folder fsyncs, the pruning),
    first on a fresh folder (new files), then in steady state (files of
    pruned versions recycled, Note [recycled files])."""
    import tempfile

    from rabit_py.engine._store import DurableStore

    def write_raw(path: str, blob: bytes) -> float:
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - t0

    def write_version(store: DurableStore, version: int, blob: bytes) -> float:
        # The writer thread's own time on the version (the hand-over to the
        # thread is not part of the write: the caller does not wait for it).
        before = store.write_seconds
        store.save(version, blob, None, False)
        store.flush()
        return store.write_seconds - before

    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for size in (1 << 20, 16 << 20, 64 << 20):
            blob = os.urandom(size)
            # From a quiet disk: the writeback of what ran before (the jobs'
            # checkpoints, the previous size) would slow whichever runs first.
            os.sync()
            raw: List[float] = []
            first: List[float] = []
            steady: List[float] = []
            store = DurableStore(os.path.join(folder, f"steady-{size}"), 0, 1, keep=2)
            for version in range(1, 4):     # from version 4 on, files are recycled
                write_version(store, version, blob)
            write_raw(os.path.join(folder, "warm"), blob)   # the first write is cheaper
            for i in range(reps):
                fresh = DurableStore(os.path.join(folder, f"fresh-{size}-{i}"), 0, 1, keep=2)
                runs = [(raw, write_raw, (os.path.join(folder, f"raw-{i}"), blob)),
                        (first, write_version, (fresh, 1, blob)),
                        (steady, write_version, (store, 4 + i, blob))]
                # Rotate the order: writeback of one write slows the next.
                for samples, run, run_args in runs[i % 3:] + runs[:i % 3]:
                    samples.append(run(*run_args))
                fresh.close()
            store.close()
            out[size] = (statistics.median(raw), statistics.median(first),
                         statistics.median(steady))
    return out


STEP_ORDER = ("detect", "shrink", "spawn", "merge", "replay")


def compare_trees(args: argparse.Namespace, common: List[str]) -> int:
    """The recovery steps of one kill (spawned replacement, and spare) on
    this tree and on ``args.before``, runs alternating between the trees so
    that the machine's noise hits both alike; prints medians and ranges."""
    import tempfile

    results: Dict[str, Dict[str, List[dict]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        before = os.path.join(scratch, "before")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", before,
                        args.before], check=True)
        try:
            trees = {"before": before, "after": ROOT}
            bases = {}
            for name, tree in trees.items():
                # Two failure-free runs, the faster kept (the first writes .pyc files).
                bases[name] = min((launch(args.ranks, {"RABIT_ENGINE": "robust"}, common,
                                          tree=tree) for _ in range(2)), key=lambda r: r[0])
                results[name] = {"spawned": [], "spare": []}
            for i in range(args.runs):
                for name, tree in trees.items():
                    wall, base, _ = bases[name]
                    results[name]["spawned"] += kill_runs(args, common, wall, base, [], tree, 1, i)
                    results[name]["spare"] += kill_runs(args, common, wall, base,
                                                        ["--spares", "1"], tree, 1, i)
                print(f"  run {i + 1}/{args.runs} done", flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", before])
    print(f"\nrecovery of one killed rank, {args.ranks} ranks on {os.cpu_count()} cores"
          + (" (oversubscribed)" if args.ranks > (os.cpu_count() or 1) else "")
          + f", {args.runs} runs per tree alternating; before = {args.before}; seconds, "
            f"median (min-max)")
    columns = list(STEP_ORDER) + ["kill_to_progress", "added_loop"]
    print(f"{'':>16}" + "".join(f"{c:>21}" for c in columns))
    table: Dict[str, Dict[str, List[float]]] = {}
    for kind in ("spawned", "spare"):
        for name in ("before", "after"):
            runs = results[name][kind]
            values = {c: [r["kill_to_progress"] if c == "kill_to_progress" else r["steps"][c]
                          for r in runs] for c in columns}
            table[f"{kind} {name}"] = {c: [statistics.median(v), min(v), max(v)]
                                       for c, v in values.items()}
            print(f"{kind + ' ' + name:>16}" + "".join(
                f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})".rjust(21)
                for v in values.values()))
        b = table[f"{kind} before"]["kill_to_progress"][0]
        a = table[f"{kind} after"]["kill_to_progress"][0]
        print(f"{kind}: kill -> progress after/before = {a / b:.2f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"benchmark": "recovery-steps", "before": args.before, "ranks": args.ranks,
                   "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "table": table, "runs": results}, fh, indent=1)
    print(f"wrote {args.json}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-sizes", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--elements", type=int, default=1 << 16, help="gradient length")
    parser.add_argument("--runs", type=int, default=3, help="runs with a failure")
    parser.add_argument("--load-rows", type=int, default=300_000,
                        help="rows of data each rank generates at start-up (data loading)")
    parser.add_argument("--json", default="bench-results/recovery.json")
    parser.add_argument("--plot", nargs="?", const="bench-results/recovery.png")
    parser.add_argument("--xgboost", action="store_true", help="only the XGBoost comparison")
    parser.add_argument("--hosts", action="store_true",
                        help="the XGBoost comparison across three namespace hosts (root)")
    parser.add_argument("--before", metavar="REV",
                        help="only the recovery steps, of this tree and of git revision REV "
                             "(checked out in a temporary worktree), runs alternating")
    parser.add_argument("--xgb-rows", type=int, default=400_000)
    parser.add_argument("--xgb-rounds", type=int, default=40)
    parser.add_argument("--xgb-every", type=int, default=5)
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    if args.worker:
        return worker(args)
    if args.xgboost:
        xgb = xgboost_comparison(args)
        print_xgboost(xgb, args.ranks)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "recovery", "ranks": args.ranks, "cores": os.cpu_count(),
                       "date": time.strftime("%Y-%m-%d %H:%M:%S"), "xgboost": xgb}, fh,
                      indent=1)
        print(f"wrote {args.json}")
        return 0

    common = ["--rounds", str(args.rounds), "--elements", str(args.elements),
              "--load-rows", str(args.load_rows)]
    if args.before:
        return compare_trees(args, common)
    # Two failure-free runs, the faster kept: the first start of a process
    # tree pays for cold caches (and .pyc compilation after an edit).
    base_wall, base, _ = min((launch(args.ranks, {"RABIT_ENGINE": "robust"}, common)
                              for _ in range(2)), key=lambda run: run[0])
    _, sized, _ = launch(args.ranks, {"RABIT_ENGINE": "robust"},
                         ["--rounds", "1", "--checkpoint-sizes"])
    runs = kill_runs(args, common, base_wall, base, [])
    spare_runs = kill_runs(args, common, base_wall, base, ["--spares", "1"])

    restart = restart_comparison(args, common, base_wall, runs, spare_runs)
    writes = durable_write_costs()
    xgb = xgboost_comparison(args)

    median = {k: statistics.median(r["steps"][k] for r in runs) for k in runs[0]["steps"]}
    spare_median = {k: statistics.median(r["steps"][k] for r in spare_runs)
                    for k in spare_runs[0]["steps"]}
    print(f"\nrecovery of one killed rank, {args.ranks} ranks on {os.cpu_count()} cores"
          + (" (oversubscribed)" if args.ranks > (os.cpu_count() or 1) else "")
          + f", median of {len(runs)} runs (seconds)")
    print(f"{'':>10}" + "  ".join(f"{k:>10}" for k in median))
    print(f"{'spawned':>10}" + "  ".join(f"{v:10.3f}" for v in median.values()))
    print(f"{'spare':>10}" + "  ".join(f"{v:10.3f}" for v in spare_median.values()))
    print(f"failure-free job: {base_wall:.2f} s wall; with one failure: "
          f"{statistics.median(r['wall'] for r in runs):.2f} s (replacement spawned), "
          f"{statistics.median(r['wall'] for r in spare_runs):.2f} s (a spare took the rank)")
    cache = max(r["cache_bytes_per_round"] for r in base)
    print(f"result cache at the end of a round: {cache} bytes per rank "
          f"(one allreduce of a {args.elements}-element float64 gradient + 3 of a scalar)")
    costs = sized[0]["checkpoint"]
    print("\ncheckpoint(global, local) cost, ms (each model of the given size)")
    print(f"{'size':>10} {'robust':>10} {'plain':>10}")
    for size in SIZES:
        print(f"{size:>10} {costs['robust'][str(size)] * 1e3:10.2f} "
              f"{costs['mpi'][str(size)] * 1e3:10.2f}")
    print(f"\nin-job recovery vs whole-job restart from the durable checkpoint "
          f"(same kill; start-up loads {args.load_rows} rows per rank), seconds")
    print(f"{'':>18}{'in-job':>9}{'spare':>9}{'restart':>9}{'restart/in-job':>16}"
          f"{'restart/spare':>15}")
    for key in ("kill_to_progress", "time_lost"):
        a, b, c = (restart[k][key] for k in ("in_job", "in_job_spare", "restart"))
        print(f"{key:>18}{a:9.2f}{b:9.2f}{c:9.2f}{c / a:16.1f}{c / b:15.1f}")
    print("\ndurable checkpoint version (global model: file, manifest, folder fsyncs) vs raw "
          "file write (open, write, fsync) of the same bytes, ms")
    print(f"{'size':>10}{'raw':>10}{'first':>10}{'ratio':>8}{'steady':>10}{'ratio':>8}")
    for size, (raw, first, steady) in writes.items():
        print(f"{size:>10}{raw * 1e3:10.2f}{first * 1e3:10.2f}{first / raw:8.2f}"
              f"{steady * 1e3:10.2f}{steady / raw:8.2f}")
    print_xgboost(xgb, args.ranks)
    result = {"benchmark": "recovery", "ranks": args.ranks, "cores": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "base_wall": base_wall,
              "runs": runs, "spare_runs": spare_runs, "median": median,
              "spare_median": spare_median, "cache_bytes_per_round": cache,
              "checkpoint_seconds": costs, "restart": restart,
              "durable_write_seconds": {str(k): v for k, v in writes.items()},
              "xgboost": xgb}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"wrote {args.json}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        steps = list(median)[:-1]
        positions = np.arange(len(steps))
        left.bar(positions - 0.2, [median[k] for k in steps], width=0.4, label="spawned")
        left.bar(positions + 0.2, [spare_median[k] for k in steps], width=0.4, label="spare")
        left.set_xticks(positions, steps)
        left.legend()
        left.set_ylabel("seconds")
        left.set_title(f"recovery steps ({args.ranks} ranks)")
        for name in ("robust", "mpi"):
            right.plot(SIZES, [costs[name][str(s)] for s in SIZES], marker="o", label=name)
        right.set_xscale("log", base=2)
        right.set_yscale("log")
        right.set_xlabel("model size (bytes, global and local each)")
        right.set_ylabel("seconds per checkpoint")
        right.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
