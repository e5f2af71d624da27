"""Step time of a data-parallel backward pass: gradients reduced in buckets
while the backward pass runs (GradientBucketer) vs reduced after it, vs the
backward pass alone (no communication) and the bucketed reduction alone (no
backward), side by side in one run.

    rabit-run -n 2 python scripts/bench_overlap.py [--layers 8 --width 1024 --batch 256]

The "model" is a stack of dense layers (float32); the backward pass is the
matrix products that give each layer's weight gradient, last layer first.
Prints a table (median step time per mode, ratio, and the share of the
communication hidden behind computation) and writes JSON.
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
from rabit_py.bucket import GradientBucketer  # noqa: E402


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bucket-mb", type=float, default=8.0)
    parser.add_argument("--json", default="bench-results/overlap.json")
    args = parser.parse_args(argv)
    rabit.init()
    rank, size = rabit.get_rank(), rabit.get_world_size()
    rng = np.random.default_rng(rank)
    acts = [rng.standard_normal((args.batch, args.width), dtype=np.float32)
            for _ in range(args.layers)]
    delta = rng.standard_normal((args.batch, args.width), dtype=np.float32)
    params = [np.zeros((args.width, args.width), dtype=np.float32) for _ in range(args.layers)]

    def backward(on_grad) -> None:
        for layer in reversed(range(args.layers)):
            on_grad(layer, acts[layer].T @ delta)

    def step_nocomm() -> None:
        backward(lambda i, g: None)

    flat = np.empty(args.layers * args.width * args.width, dtype=np.float32)

    def step_after() -> None:
        def keep(i, g):
            flat[i * g.size:(i + 1) * g.size] = g.ravel()
        backward(keep)
        rabit.allreduce(flat, rabit.Op.SUM)

    bucketer = GradientBucketer(params, bucket_cap_mb=args.bucket_mb,
                                first_bucket_mb=min(1.0, args.bucket_mb))

    def step_bucketed() -> None:
        backward(bucketer.mark_ready)
        bucketer.wait()

    ready = [np.ones_like(p) for p in params]

    def step_reduce_only() -> None:          # the bucketed reductions, no backward
        for layer in reversed(range(args.layers)):
            bucketer.mark_ready(layer, ready[layer])
        bucketer.wait()

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
        print(f"backward of {args.layers} layers {args.width}x{args.width} float32 "
              f"({mb:.0f} MiB of gradients), batch {args.batch}, {size} ranks on "
              f"{os.cpu_count()} cores; median of {args.steps} steps")
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
                       "batch": args.batch, "seconds": times, "median": med}, f, indent=1)
    rabit.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
