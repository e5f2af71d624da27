"""Step time of a data-parallel backward pass: gradients reduced in buckets
while the backward pass runs (GradientBucketer) vs reduced after it, vs the
backward pass alone (no communication) and the bucketed reduction alone (no
backward), side by side in one run.

    rabit-run -n 2 python scripts/bench_overlap.py [--layers 8 --width 1024 --batch 256]
        [--device cuda] [--plot [out.png]]

The "model" is a stack of dense layers (float32); the backward pass is the
matrix products that give each layer's weight gradient, last layer first.
With ``--device cuda`` everything is CuPy on GPU ``rank % device_count``
(``rabit_py.select_device``): NCCL where each rank has its own GPU,
else staged through host memory; each step ends when the device is done.
Prints a table (median step time per mode, ratio, and the share of the
communication hidden behind computation), writes JSON, and draws the
medians with ``--plot``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")     # one core per rank
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import rabit_py as rabit  # noqa: E402
from rabit_py.ddp.bucket import GradientBucketer  # noqa: E402
from rabit_py.extras import require  # noqa: E402


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bucket-mb", type=float, default=8.0)
    parser.add_argument("--json", default="bench-results/overlap.json")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="NumPy on the CPU, or CuPy on GPU rank %% device count")
    parser.add_argument("--plot", nargs="?", const="bench-results/overlap.png",
                        help="draw the medians (matplotlib) into this file")
    args = parser.parse_args(argv)
    if args.plot:
        require("matplotlib", "bench", "--plot")    # before the work, not after it
    if args.device == "cuda":
        require("cupy", "gpu", "--device cuda")
    rabit.init()
    rank, size = rabit.get_rank(), rabit.get_world_size()
    xp = np
    sync = lambda: None  # noqa: E731 - NumPy work is done when it returns
    if args.device == "cuda":
        import cupy as xp  # noqa: PLC0415 - --device cuda only

        import rabit_py.gpu  # noqa: PLC0415

        rabit_py.select_device()
        sync = xp.cuda.get_current_stream().synchronize
    rng = np.random.default_rng(rank)
    acts = [xp.asarray(rng.standard_normal((args.batch, args.width), dtype=np.float32))
            for _ in range(args.layers)]
    delta = xp.asarray(rng.standard_normal((args.batch, args.width), dtype=np.float32))
    params = [xp.zeros((args.width, args.width), dtype=np.float32) for _ in range(args.layers)]

    def backward(on_grad) -> None:
        for layer in reversed(range(args.layers)):
            on_grad(layer, acts[layer].T @ delta)

    def step_nocomm() -> None:
        backward(lambda i, g: None)
        sync()

    flat = xp.empty(args.layers * args.width * args.width, dtype=np.float32)

    def step_after() -> None:
        def keep(i, g):
            flat[i * g.size:(i + 1) * g.size] = g.ravel()
        backward(keep)
        rabit.allreduce(flat, rabit.Op.SUM)
        sync()

    bucketer = GradientBucketer(params, bucket_cap_mb=args.bucket_mb,
                                first_bucket_mb=min(1.0, args.bucket_mb))

    def step_bucketed() -> None:
        backward(bucketer.mark_ready)
        bucketer.wait()
        sync()

    ready = [xp.ones_like(p) for p in params]

    def step_reduce_only() -> None:          # the bucketed reductions, no backward
        for layer in reversed(range(args.layers)):
            bucketer.mark_ready(layer, ready[layer])
        bucketer.wait()
        sync()

    modes = {"no communication": step_nocomm, "reduce alone": step_reduce_only,
             "reduce after backward": step_after, "bucketed overlap": step_bucketed}
    times = {name: [] for name in modes}
    for fn in modes.values():          # warm-up
        fn()
    for _ in range(args.steps):        # interleaved, so drift hits every mode alike
        for name, fn in modes.items():
            rabit.allreduce(np.zeros(1), rabit.Op.SUM)       # start together
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    bucketer.close()
    med = {name: statistics.median(t) for name, t in times.items()}
    if rank == 0:
        mb = args.layers * args.width * args.width * 4 / 2 ** 20
        where = (f"{os.cpu_count()} cores" if args.device == "cpu"
                 else f"GPU(s), RABIT_GPU_BACKEND={os.environ.get('RABIT_GPU_BACKEND', 'auto')}")
        print(f"backward of {args.layers} layers {args.width}x{args.width} float32 "
              f"({mb:.0f} MiB of gradients), batch {args.batch}, {size} ranks on "
              f"{where}; median of {args.steps} steps")
        for name, t in med.items():
            print(f"  {name:<24}{t * 1e3:9.1f} ms")
        comm = med["reduce after backward"] - med["no communication"]
        hidden = med["reduce after backward"] - med["bucketed overlap"]
        speedup = med["reduce after backward"] / med["bucketed overlap"]
        share = hidden / comm * 100 if comm > 0 else float("nan")
        bound = med["bucketed overlap"] / max(med["no communication"], med["reduce alone"])
        print(f"  speed-up of overlap vs after: {speedup:.2f}x; communication hidden: "
              f"{share:.0f} %; overlapped step / max(backward, reduce alone): {bound:.2f}")
        folder = os.path.dirname(args.json)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"ranks": size, "layers": args.layers, "width": args.width,
                       "batch": args.batch, "device": args.device, "seconds": times,
                       "median": med, "speedup": speedup, "bound": bound}, f, indent=1)
        if args.plot:
            plot(med, f"{size} ranks, {args.device}: overlap {speedup:.2f}x faster than "
                      f"reduce-after-backward", args.plot)
    rabit.finalize()
    return 0


def plot(medians: dict, title: str, path: str) -> None:
    """A bar per mode: its median step time."""
    import matplotlib  # noqa: PLC0415 - only with --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(medians)
    ax.barh(names, [medians[n] * 1e3 for n in names], color="tab:blue")
    ax.set_xlabel("median step time (ms)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
