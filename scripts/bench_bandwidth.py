"""Benchmark: a training loop's large allreduces, the default path against raw mpi4py.

    python scripts/bench_bandwidth.py [--ranks 2,4] [--sizes 1M,4M,16M,32M,64M] [--batches 9]
                                      [--json out.json] [--plot out.png]

What a user who moves an mpi4py training loop onto rabit_py sees: each
iteration reduces two gradient arrays in place (float32 SUM) and, for
rabit_py, ends with ``lazy_checkpoint`` of the model, as a training loop
does. For each rank count the script starts one job under rabit-run with the
defaults (the robust engine, the signature check on) and times, side by side
and alternating batch by batch so that the machine's noise hits them alike:

- ``raw``: mpi4py's in-place ``Allreduce`` of the two arrays;
- ``rabit``: ``rabit.allreduce`` of the two arrays, then ``lazy_checkpoint``;
- ``rabit+prepare``: the same with a ``prepare_fun`` (no input copy needed);
- ``keep floor``: raw, then a copy of each result into buffers reused from
  iteration to iteration: the floor of any engine that keeps every result
  on every rank (as the robust engine must, for one failure of two ranks).

A batch's time is that of the slowest rank. The table gives the median and
the range over batches of the time per iteration and the speed against raw
(raw's time / ours, per batch, the batch paired with the raw batch timed just
before it; 1.0 is raw's speed, higher is faster). The JSON keeps every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from rabit_py.extras import require

ROOT = Path(__file__).resolve().parents[1]
TARGET_BATCH_SECONDS = 0.15


def _keep(buf: object) -> None:
    """A prepare_fun that leaves the gradient as it is (it was computed before)."""


def worker(args: argparse.Namespace) -> int:
    import numpy as np
    from mpi4py import MPI

    import rabit_py as rabit

    np.seterr(over="ignore", invalid="ignore")   # the sums grow call after call
    rabit.init()
    comm = MPI.COMM_WORLD
    rank = rabit.get_rank()
    model = {"step": 0}
    results: Dict[str, Dict[str, List[float]]] = {}

    def raw(a, b):
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)

    def ours(a, b):
        rabit.allreduce(a, rabit.Op.SUM)
        rabit.allreduce(b, rabit.Op.SUM)
        model["step"] += 1
        rabit.lazy_checkpoint(model)

    def ours_prepared(a, b):
        rabit.allreduce(a, rabit.Op.SUM, prepare_fun=_keep)
        rabit.allreduce(b, rabit.Op.SUM, prepare_fun=_keep)
        model["step"] += 1
        rabit.lazy_checkpoint(model)

    kept: Dict[int, list] = {}

    def keep_floor(a, b):
        raw(a, b)
        ring = kept.setdefault(a.nbytes, [np.empty_like(a), np.empty_like(b)])
        np.copyto(ring[0], a)
        np.copyto(ring[1], b)

    every: Dict[str, Callable] = {"raw": raw, "rabit": ours, "rabit+prepare": ours_prepared,
                                  "keep floor": keep_floor}
    contenders = {name: every[name] for name in args.contenders.split(",")}

    def batch(call: Callable, a, b, iterations: int) -> float:
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            call(a, b)
        return comm.allreduce((time.perf_counter() - start) / iterations, op=MPI.MAX)

    for nbytes in args.sizes:
        count = max(1, nbytes // 4)
        a = np.ones(count, dtype=np.float32)
        b = np.ones(count, dtype=np.float32)
        for call in contenders.values():           # warm-up: pages, the cache's pool
            for _ in range(3):
                call(a, b)
        probe = batch(raw, a, b, 3)
        # ~TARGET_BATCH_SECONDS per batch (and at least 3 iterations)
        iterations = comm.bcast(int(max(3, min(500, TARGET_BATCH_SECONDS / max(probe, 1e-6)))))
        samples: Dict[str, List[float]] = {name: [] for name in contenders}
        for i in range(args.batches):
            if rank == 0:
                print(f"  {args.ranks_now} ranks, {human(nbytes)}: batch {i + 1}/{args.batches}",
                      file=sys.stderr, flush=True)
            for name, call in contenders.items():
                samples[name].append(batch(call, a, b, iterations))
        results[str(nbytes)] = samples
    info = rabit.engine_info()
    if rank == 0:
        print("RESULT " + json.dumps({"results": results, "engine": info.engine,
                                      "shared_memory": info.shared_memory}), flush=True)
    rabit.finalize()
    return 0


def parse_sizes(text: str) -> List[int]:
    """``64K,1M,16M`` -> bytes."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return [int(word[:-1]) * scale[word[-1].upper()] if word[-1].upper() in scale
            else int(word) for word in text.split(",")]


def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def summarize(samples: Dict[str, List[float]]) -> Dict[str, dict]:
    """Median and range of the time per iteration, and of the speed against raw."""
    import numpy as np
    raw = np.array(samples["raw"])
    rows = {}
    for name, times in samples.items():
        t = np.array(times)
        speed = raw / t
        rows[name] = {"ms": float(np.median(t)) * 1e3, "ms_min": float(t.min()) * 1e3,
                      "ms_max": float(t.max()) * 1e3, "speed": float(np.median(speed)),
                      "speed_min": float(speed.min()), "speed_max": float(speed.max())}
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks-now", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ranks", default="2,4", help="rank counts, comma-separated")
    parser.add_argument("--sizes", default="1M,4M,16M,32M,64M",
                        help="bytes per array, comma-separated (K and M suffixes)")
    parser.add_argument("--contenders", default="raw,rabit,rabit+prepare,keep floor",
                        help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=9)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args(argv)
    args.sizes = parse_sizes(args.sizes)
    if args.worker:
        return worker(args)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    figures: Dict[str, dict] = {}
    for ranks in [int(r) for r in args.ranks.split(",")]:
        cmd = [sys.executable, "-m", "rabit_py.launcher", "-n", str(ranks), "--",
               sys.executable, os.path.abspath(__file__), "--worker", "--ranks-now", str(ranks),
               "--sizes", ",".join(map(str, args.sizes)), "--batches", str(args.batches)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=3600)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            print(out.stdout[-3000:], file=sys.stderr)
            return 1
        figures[f"{ranks} ranks"] = json.loads(lines[0][7:])
    title = (f"A training loop: two in-place float32 SUM allreduces per iteration (+ "
             f"lazy_checkpoint for rabit_py), defaults under rabit-run; {os.cpu_count()} cores "
             f"(ranks oversubscribed if more than cores)")
    print("\n" + report(figures, title, args.batches))
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    if args.plot:
        plot(figures, args.plot)
    return 0


def report(figures: Dict[str, dict], title: str, batches: int) -> str:
    """The table (and each figure's ``summary``): ms per iteration of raw,
    and each contender's speed against raw, median [range] over the batches."""
    lines = [title, f"ms per iteration and speed vs raw (raw time / ours, 1.0 = raw's speed): "
                    f"median [range] over {batches} batches"]
    for label, fig in figures.items():
        fig["summary"] = {}
        names = [n for n in next(iter(fig["results"].values())) if n != "raw"]
        lines.append(f"{label:>12} {'size':>8} {'raw ms':>20} " +
                     " ".join(f"{n + ' speed':>22}" for n in names))
        for size, samples in fig["results"].items():
            s = summarize(samples)
            fig["summary"][size] = s
            raw = s["raw"]
            cells = [f"{raw['ms']:9.3f} [{raw['ms_min']:.3f}-{raw['ms_max']:.3f}]"] + [
                f"{s[n]['speed']:5.2f} [{s[n]['speed_min']:.2f}-{s[n]['speed_max']:.2f}]"
                for n in names]
            lines.append(f"{'':>12} {human(int(size)):>8} {cells[0]:>20} " +
                         " ".join(f"{c:>22}" for c in cells[1:]))
    return "\n".join(lines)


def plot(figures: Dict[str, dict], path: str) -> None:
    """Speed against raw by size, a line per contender and job."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, data in figures.items():
        sizes = [int(m) for m in data["summary"]]
        for name in data["summary"][str(sizes[0])]:
            if name != "raw":
                ax.plot([m / 2**20 for m in sizes],
                        [data["summary"][str(m)][name]["speed"] for m in sizes],
                        marker="o", label=f"{name}, {label}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("MiB per array")
    ax.set_ylabel("speed vs raw mpi4py (raw time / ours)")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    sys.exit(main())
