"""Trainers against their references, side by side in one run.

    python scripts/bench_trainers.py                 # 1M x 28 GBDT, 100 rounds
    python scripts/bench_trainers.py --rows 200000 --rounds 20 --plot
    python scripts/bench_trainers.py --hosts --skip-small    # as root: 4 ranks on 2 hosts too

GBDT (ours on 1 and 2 ranks) vs XGBoost ``tree_method="hist"`` (1 and 2
threads) on the HIGGS-like synthetic task: held-out AUC and training time
(data generation excluded; XGBoost's DMatrix and our binning included), the
first fit in a fresh process and a second one in the same process (the
steady state) reported side by side. Then
small real data sets (scikit-learn's breast cancer and digits) against
XGBoost, logistic regression against scikit-learn's ``lbfgs`` (objective),
and k-means against scikit-learn from the same initial centers (inertia).
Prints a table with the ratios, writes JSON (and a PNG with ``--plot``).

Needs ``xgboost`` (or ``xgboost-cpu``) for the GBDT references; without it
those columns are left out. On this 2-core machine, 2 ranks use both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from trainers.data import make_blobs, make_higgs_like, shard_range  # noqa: E402
from trainers.gbdt import _auc  # noqa: E402
from rabit_py.extras import require  # noqa: E402

HELD_OUT = 200_000


def gbdt_params(args: argparse.Namespace) -> Dict[str, Any]:
    return {"objective": "binary:logistic", "eta": 0.1, "max_depth": args.depth,
            "max_bin": args.max_bin, "seed": 0}


# ---------------------------------------------------------------- workers (under MPI)
def worker_gbdt(args: argparse.Namespace) -> None:
    """Two fits in this fresh process: the first pays what a new job (or a
    replacement) pays once -- importing numba and loading its compiled
    kernels from the on-disk cache --, the second is the steady state. The
    engine starts afresh between them, so the second trains (it does not
    resume the first's checkpoint)."""
    import rabit_py as rabit
    from trainers import gbdt

    times = []
    for _ in range(2):
        rabit.init()
        lo, hi = shard_range(args.rows, rabit.get_rank(), rabit.get_world_size())
        X, y = make_higgs_like(hi - lo, seed=args.seed, start=lo)
        rabit.allreduce(np.zeros(1), rabit.Op.SUM)      # every rank starts the clock together
        start = time.perf_counter()
        booster = gbdt.train({**gbdt_params(args), "hist_kernel": args.kernel}, X, y,
                             args.rounds, verbose_eval=False)
        times.append(time.perf_counter() - start)
        last = rabit.get_rank() == 0
        rabit.finalize()
    if last:
        Xt, yt = make_higgs_like(HELD_OUT, seed=args.seed, start=args.rows)
        with open(args.result, "w") as f:
            json.dump({"first": times[0], "steady": times[1],
                       "auc": _auc(booster.predict(Xt), yt)}, f)


def worker_small(args: argparse.Namespace) -> None:
    import rabit_py as rabit
    from trainers import gbdt, kmeans, linear

    rabit.init()
    out: Dict[str, Any] = {}
    for name, (X, y, params) in small_sets().items():
        n_train = int(0.75 * X.shape[0])
        lo, hi = shard_range(n_train, rabit.get_rank(), rabit.get_world_size())
        booster = gbdt.train(params, X[lo:hi], y[lo:hi], 50, verbose_eval=False)
        out[name] = booster.predict(X[n_train:]).tolist()
    X, y = logistic_set()
    lo, hi = shard_range(X.shape[0], rabit.get_rank(), rabit.get_world_size())
    model = linear.LogisticRegression(C=1.0, max_iter=500, tol=1e-10).fit(X[lo:hi], y[lo:hi])
    out["logistic"] = {"coef": model.coef_[0].tolist(), "intercept": float(model.intercept_[0]),
                       "objective": model.objective_, "iterations": model.n_iter_}
    B = make_blobs(100_000, 8, 10, seed=3)
    km = kmeans.KMeans(8, seed=0).fit(B[slice(*shard_range(B.shape[0], rabit.get_rank(),
                                                            rabit.get_world_size()))])
    out["kmeans"] = {"inertia": km.inertia_, "init": km.initial_centers_.tolist(),
                     "iterations": km.n_iter_}
    if rabit.get_rank() == 0:
        with open(args.result, "w") as f:
            json.dump(out, f)
    rabit.finalize()


def small_sets() -> Dict[str, Any]:
    from sklearn.datasets import load_breast_cancer, load_digits

    cancer, digits = load_breast_cancer(), load_digits()
    rng = np.random.default_rng(0)
    order_c = rng.permutation(cancer.data.shape[0])
    order_d = rng.permutation(digits.data.shape[0])
    base = {"eta": 0.1, "max_depth": 4, "max_bin": 256}
    return {"breast_cancer": (cancer.data[order_c], cancer.target[order_c].astype(float),
                              {**base, "objective": "binary:logistic"}),
            "digits": (digits.data[order_d], digits.target[order_d].astype(float),
                       {**base, "objective": "multi:softprob", "num_class": 10})}


def logistic_set():
    X, y = make_higgs_like(50_000, seed=7)
    return (X - X.mean(axis=0)) / X.std(axis=0), y


# ---------------------------------------------------------------- the driver
def run_ours(ranks: int, mode: str, args: argparse.Namespace,
             hosts: Any = None) -> Dict[str, Any]:
    """One job of the worker; ``hosts``: across ``cluster_demo.Hosts``."""
    with tempfile.TemporaryDirectory(dir=hosts.shared if hosts is not None else None) as tmp:
        result = os.path.join(tmp, "result.json")
        program = [sys.executable, os.path.abspath(__file__), "--worker", mode,
                   "--result", result, "--rows", str(args.rows), "--rounds", str(args.rounds),
                   "--depth", str(args.depth), "--max-bin", str(args.max_bin),
                   "--seed", str(args.seed), "--kernel", args.kernel]
        if hosts is not None:
            cmd = hosts.rabit_run(ranks, program)
        else:
            cmd = program if ranks == 1 else [sys.executable, "-m", "rabit_py.launcher", "-n",
                                               str(ranks), "--", *program]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, timeout=3600)
        with open(result) as f:
            return json.load(f)


def run_xgboost(threads: int, args: argparse.Namespace, X, y, Xt, yt) -> Dict[str, Any]:
    """XGBoost's fit twice in this process (DMatrix included each time)."""
    import xgboost as xgb

    times = []
    for _ in range(2):
        start = time.perf_counter()
        train = xgb.DMatrix(X, y, nthread=threads)
        booster = xgb.train({**gbdt_params(args), "tree_method": "hist", "nthread": threads},
                            train, args.rounds)
        times.append(time.perf_counter() - start)
    return {"first": times[0], "steady": times[1],
            "auc": _auc(booster.predict(xgb.DMatrix(Xt)), yt)}


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--max-bin", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kernel", default="auto", help="hist_kernel: auto, numba or numpy")
    parser.add_argument("--no-xgboost", action="store_true", help="skip the XGBoost columns")
    parser.add_argument("--skip-small", action="store_true", help="only the large GBDT run")
    parser.add_argument("--hosts", action="store_true",
                        help="also 4 ranks on one host and across two namespace hosts of 2 "
                             "slots (root; the hosts share this machine's cores)")
    parser.add_argument("--json", default="bench-results/bench_trainers.json")
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--worker", choices=["gbdt", "small"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    if args.worker == "gbdt":
        worker_gbdt(args)
        return 0
    if args.worker == "small":
        worker_small(args)
        return 0

    have_xgb = not args.no_xgboost
    if have_xgb:
        try:
            import xgboost  # noqa: F401
        except ImportError:
            print("xgboost is not installed (pip install xgboost-cpu): its columns are left out")
            have_xgb = False
    report: Dict[str, Any] = {"rows": args.rows, "rounds": args.rounds, "depth": args.depth,
                              "max_bin": args.max_bin, "kernel": args.kernel, "gbdt": {}}
    print(f"GBDT, HIGGS-like {args.rows} x 28, {args.rounds} rounds, depth {args.depth}, "
          f"eta 0.1, {args.max_bin} bins; held-out {HELD_OUT} rows "
          f"(2-core machine: 2 ranks/threads use both cores)")
    runs = report["gbdt"]
    runs["rabit_py 1 rank"] = run_ours(1, "gbdt", args)
    runs["rabit_py 2 ranks"] = run_ours(2, "gbdt", args)
    if args.hosts:
        from cluster_demo import Hosts

        runs["rabit_py 4 ranks"] = run_ours(4, "gbdt", args)
        with Hosts(2, 2) as hosts:
            runs["rabit_py 4 ranks, 2 hosts"] = run_ours(4, "gbdt", args, hosts)
    if have_xgb:
        X, y = make_higgs_like(args.rows, seed=args.seed)
        Xt, yt = make_higgs_like(HELD_OUT, seed=args.seed, start=args.rows)
        runs["xgboost 1 thread"] = run_xgboost(1, args, X, y, Xt, yt)
        runs["xgboost 2 threads"] = run_xgboost(2, args, X, y, Xt, yt)
        del X, y
    print(f"{'run':<28}{'first fit s':>12}{'steady s':>10}{'first/steady':>14}{'AUC':>10}")
    for name, r in runs.items():
        print(f"{name:<28}{r['first']:>12.2f}{r['steady']:>10.2f}"
              f"{r['first'] / r['steady']:>14.3f}{r['auc']:>10.5f}")
    ours1, ours2 = runs["rabit_py 1 rank"], runs["rabit_py 2 ranks"]
    ratios = {"speed-up 2 ranks vs 1 (steady)": ours1["steady"] / ours2["steady"],
              "first fit / steady, 1 rank": ours1["first"] / ours1["steady"]}
    if args.hosts:
        ratios["4 ranks on 2 hosts vs 4 on one (steady)"] = (
            runs["rabit_py 4 ranks, 2 hosts"]["steady"] / runs["rabit_py 4 ranks"]["steady"])
    if have_xgb:
        xgb1, xgb2 = runs["xgboost 1 thread"], runs["xgboost 2 threads"]
        for which in ("first", "steady"):
            ratios[f"time vs xgboost, 1 rank/thread ({which})"] = ours1[which] / xgb1[which]
            ratios[f"time vs xgboost, 2 ranks/threads ({which})"] = ours2[which] / xgb2[which]
        ratios["AUC difference vs xgboost"] = ours1["auc"] - xgb1["auc"]
    for name, value in ratios.items():
        print(f"  {name}: {value:.3f}")
    report["ratios"] = ratios

    if not args.skip_small:
        report["small"] = small_comparisons(run_ours(2, "small", args), have_xgb)

    folder = os.path.dirname(args.json)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.json}")
    if args.plot:
        plot(report, os.path.splitext(args.json)[0] + ".png")
    return 0


def small_comparisons(ours: Dict[str, Any], have_xgb: bool) -> Dict[str, Any]:
    from sklearn.cluster import KMeans
    from sklearn.linear_model import LogisticRegression

    out: Dict[str, Any] = {}
    print("\nsmall data sets (ours on 2 ranks)")
    for name, (X, y, params) in small_sets().items():
        n_train = int(0.75 * X.shape[0])
        pred = np.array(ours[name])
        row = {"ours": _score(name, pred, y[n_train:])}
        if have_xgb:
            import xgboost as xgb

            booster = xgb.train({**params, "tree_method": "hist", "nthread": 1},
                                xgb.DMatrix(X[:n_train], y[:n_train]), 50)
            row["xgboost"] = _score(name, booster.predict(xgb.DMatrix(X[n_train:])),
                                    y[n_train:])
        out[name] = row
        print(f"  {name:<16}" + "  ".join(f"{k} {v:.4f}" for k, v in row.items()) +
              ("  (AUC)" if name == "breast_cancer" else "  (accuracy)"))
    X, y = logistic_set()
    ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10_000).fit(X, y)
    z = X @ ref.coef_[0] + ref.intercept_[0]
    ref_objective = float(np.logaddexp(0, -(2 * y - 1) * z).sum() +
                          0.5 * ref.coef_[0] @ ref.coef_[0])
    mine = ours["logistic"]
    out["logistic"] = {"ours": mine["objective"], "sklearn": ref_objective,
                       "relative difference": (mine["objective"] - ref_objective) / ref_objective,
                       "max coef difference": float(np.abs(np.array(mine["coef"]) -
                                                           ref.coef_[0]).max())}
    print(f"  logistic        objective ours {mine['objective']:.10g}  sklearn "
          f"{ref_objective:.10g}  relative {out['logistic']['relative difference']:.2e}")
    B = make_blobs(100_000, 8, 10, seed=3)
    km = KMeans(8, init=np.array(ours["kmeans"]["init"]), n_init=1, tol=1e-4).fit(B)
    out["kmeans"] = {"ours": ours["kmeans"]["inertia"], "sklearn": float(km.inertia_),
                     "relative difference": (ours["kmeans"]["inertia"] - km.inertia_) /
                     km.inertia_}
    print(f"  k-means         inertia ours {ours['kmeans']['inertia']:.10g}  sklearn "
          f"{km.inertia_:.10g}  relative {out['kmeans']['relative difference']:.2e}")
    return out


def _score(name: str, pred: np.ndarray, y: np.ndarray) -> float:
    if name == "breast_cancer":
        return _auc(pred, y)
    return float(np.mean(pred.argmax(axis=1) == y))


def plot(report: Dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["gbdt"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ys = np.arange(len(names))
    for offset, which, color in ((-0.2, "first", "tab:orange"), (0.2, "steady", "tab:blue")):
        ax.barh(ys + offset, [report["gbdt"][n][which] for n in names], height=0.4,
                color=color, label=f"{which} fit")
    ax.set_yticks(ys, names)
    ax.legend()
    ax.set_xlabel("training seconds")
    ax.set_title(f"GBDT {report['rows']} x 28, {report['rounds']} rounds, depth "
                 f"{report['depth']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
