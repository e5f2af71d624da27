"""Benchmark: fault-tolerant XGBoost against plain XGBoost when nothing fails.

    python scripts/bench_xgboost.py                      # 2 and 4 ranks
    python scripts/bench_xgboost.py --ranks 2 --rows 200000 --rounds 40 --every 1,5,10 --plot
    python scripts/bench_xgboost.py --subsample 0.8      # with row sampling

In each job (``rabit-run -n R``, one rank per process, 1 thread each) every
rank trains on its own shard of HIGGS-like rows, the contenders alternating
``--repeats`` times: plain ``xgboost.train`` with XGBoost's own tracker (what
an XGBoost user runs today), and ``rabit_py.xgboost.train`` with each
``checkpoint_every`` of ``--every``. Both include building the DMatrix. The
engine starts afresh before each of ours (a second ``train`` in one engine
would resume the first one's finished checkpoint). Prints the medians and
ranges, the time against plain XGBoost, whether the models predict the same
bits, and the checkpoint interval's trade-off: a lost rank costs the rounds
since the last checkpoint (on average half an interval) on top of the
replacement's start, against the failure-free cost of checkpointing more
often. With ``--subsample`` below 1 every interval rebuilds the booster from
its checkpoint (Note [xgboost intervals] in ``rabit_py/xgboost/_rounds.py``)
and the models differ from ``xgboost.train``'s by design. Writes JSON;
``--plot`` draws the medians.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rabit_py.extras import require  # noqa: E402

PARAMS = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": 6, "eta": 0.1,
          "max_bin": 256, "nthread": 1, "seed": 0}


# ---------------------------------------------------------------- the worker (in the job)
def worker(args: argparse.Namespace) -> None:
    import xgboost

    import rabit_py as rabit
    import rabit_py.xgboost as rxgb
    from trainers.data import make_higgs_like, shard_range

    params = {**PARAMS, "subsample": args.subsample}
    rabit.init()
    rank, world = rabit.get_rank(), rabit.get_world_size()
    lo, hi = shard_range(args.rows, rank, world)
    X, y = make_higgs_like(hi - lo, seed=1, start=lo)
    Xt, _ = make_higgs_like(20_000, seed=1, start=args.rows)

    def plain() -> Any:
        tracker = None
        if rank == 0:
            tracker = xgboost.tracker.RabitTracker(n_workers=world, host_ip="127.0.0.1",
                                                   sortby="task", timeout=120)
            tracker.start()
        worker_args = rabit.broadcast(tracker.worker_args() if tracker else None, 0)
        with xgboost.collective.CommunicatorContext(**worker_args,
                                                    dmlc_task_id=f"{rank:09d}"):
            booster = xgboost.train(params, xgboost.DMatrix(X, label=y), args.rounds)
        if tracker is not None:
            tracker.wait_for(60)
        return booster

    def ours(every: int) -> Any:
        return rxgb.train(params, X, y, args.rounds, checkpoint_every=every,
                          verbose_eval=False)

    contenders = {"xgboost.train": plain}
    for every in args.every:
        contenders[f"rabit_py every {every}"] = lambda every=every: ours(every)
    seconds: Dict[str, List[float]] = {name: [] for name in contenders}
    predictions: Dict[str, str] = {}
    for repeat in range(args.repeats):
        for name, run in contenders.items():
            rabit.finalize()            # a fresh engine: nothing to resume
            rabit.init()
            rabit.allreduce(np.zeros(1), rabit.Op.SUM)     # start together
            start = time.perf_counter()
            booster = run()
            took = np.array([time.perf_counter() - start])
            rabit.allreduce(took, rabit.Op.MAX)             # the job's time: its slowest rank
            seconds[name].append(float(took[0]))
            digest = hashlib.sha256(booster.predict(xgboost.DMatrix(Xt)).tobytes())
            predictions[name] = digest.hexdigest()[:16]
            if rank == 0:
                print(f"  {world} ranks, repeat {repeat + 1}/{args.repeats}: {name} "
                      f"{took[0]:.2f} s", file=sys.stderr, flush=True)
    if rank == 0:
        print("RESULT " + json.dumps({"seconds": seconds, "predictions": predictions}),
              flush=True)
    rabit.finalize()


# ---------------------------------------------------------------- the driver
def job(ranks: int, args: argparse.Namespace) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(ranks), "--",
           sys.executable, os.path.abspath(__file__), "--worker", "--rows", str(args.rows),
           "--rounds", str(args.rounds), "--every", ",".join(map(str, args.every)),
           "--repeats", str(args.repeats), "--subsample", str(args.subsample)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                         timeout=7200)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"the {ranks}-rank job failed ({out.returncode}):\n"
                         f"{out.stdout[-3000:]}")
    return json.loads(lines[0][len("RESULT "):])


def summarize(result: Dict[str, Any], rounds: int) -> Dict[str, Dict[str, float]]:
    """Median and range per contender, its time against plain XGBoost, and
    the seconds a failure costs in rounds trained again (half an interval)."""
    base = np.array(result["seconds"]["xgboost.train"])
    rows = {}
    for name, times in result["seconds"].items():
        t = np.array(times)
        every = int(name.rsplit(" ", 1)[1]) if name.startswith("rabit_py") else None
        per_round = float(np.median(t)) / rounds
        rows[name] = {"median": float(np.median(t)), "min": float(t.min()),
                      "max": float(t.max()),
                      "vs_xgboost": float(np.median(t / base)),
                      "vs_xgboost_min": float((t / base).min()),
                      "vs_xgboost_max": float((t / base).max()),
                      "same_predictions": result["predictions"][name] ==
                      result["predictions"]["xgboost.train"],
                      "lost_per_failure_s": (every - 1) / 2 * per_round if every else None}
    return rows


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="world sizes, one job each")
    parser.add_argument("--rows", type=int, default=200_000, help="rows in all")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--every", default="1,5,10",
                        help="checkpoint_every values of ours, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--subsample", type=float, default=1.0,
                        help="XGBoost's row sampling (below 1: every interval is rebuilt)")
    parser.add_argument("--json", default="bench-results/bench_xgboost.json")
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.every = [int(e) for e in str(args.every).split(",")]
    require("xgboost", "xgboost", "scripts/bench_xgboost.py")
    if args.worker:
        worker(args)
        return 0
    if args.plot:
        require("matplotlib", "bench", "--plot")
    report: Dict[str, Any] = {"rows": args.rows, "rounds": args.rounds,
                              "params": {**PARAMS, "subsample": args.subsample},
                              "jobs": {}}
    for ranks in [int(r) for r in args.ranks.split(",")]:
        result = job(ranks, args)
        rows = summarize(result, args.rounds)
        report["jobs"][str(ranks)] = {"raw": result, "summary": rows}
        print(f"\n{ranks} ranks, {args.rows} rows in all, {args.rounds} rounds, subsample "
              f"{args.subsample:g}, nothing fails ({args.repeats} repeats, alternating; "
              f"2-core machine)")
        print(f"{'':<20}{'median s':>10}{'range':>16}{'vs xgboost':>12}{'range':>14}"
              f"{'same bits':>11}{'lost/failure s':>16}")
        for name, r in rows.items():
            lost = "" if r["lost_per_failure_s"] is None else f"{r['lost_per_failure_s']:.2f}"
            print(f"{name:<20}{r['median']:>10.2f}{r['min']:>8.2f}-{r['max']:<7.2f}"
                  f"{r['vs_xgboost']:>12.3f}{r['vs_xgboost_min']:>7.2f}-"
                  f"{r['vs_xgboost_max']:<6.2f}{str(r['same_predictions']):>11}{lost:>16}")
    folder = os.path.dirname(args.json)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.json}")
    if args.plot:
        plot(report, os.path.splitext(args.json)[0] + ".png")
    return 0


def plot(report: Dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    jobs = report["jobs"]
    names = list(next(iter(jobs.values()))["summary"])
    width = 0.8 / max(1, len(jobs))
    for i, (ranks, job_report) in enumerate(jobs.items()):
        medians = [job_report["summary"][n]["median"] for n in names]
        ax.barh(np.arange(len(names)) + i * width, medians, height=width,
                label=f"{ranks} ranks")
    ax.set_yticks(np.arange(len(names)) + width * (len(jobs) - 1) / 2, names)
    ax.set_xlabel("seconds to train (median)")
    ax.set_title(f"XGBoost, {report['rows']} rows, {report['rounds']} rounds, nothing fails")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
