"""Write seeded synthetic data sets for the trainers (no download needed).

    python scripts/make_data.py higgs --rows 1000000 --out data/higgs.npy
    python scripts/make_data.py blobs --rows 200000 --clusters 8 --out data/blobs.npy
    python scripts/make_data.py higgs --rows 100000 --out data/higgs.svm   # libsvm text
    python scripts/make_data.py higgs --rows 100000 --parts 4 --out data/part-{rank}.npy

``higgs``: a HIGGS-like binary task, 28 dense features; the label is column 0
(``--label-column 0`` in the trainers' CLIs). ``blobs``: Gaussian clusters for
k-means, no label. ``.npy`` (default), ``.csv`` and libsvm (``.svm``) outputs;
``--parts N`` with ``{rank}`` in the path writes one file per rank. Rows are
generated in blocks, so millions of rows need little memory beyond the output.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from trainers.data import make_blobs, make_higgs_like, shard_range


def _rows(kind: str, args: argparse.Namespace, start: int, count: int) -> np.ndarray:
    if kind == "higgs":
        X, y = make_higgs_like(count, seed=args.seed, start=start)
        return np.column_stack([y, X])
    return make_blobs(count, args.clusters, args.features, seed=args.seed, start=start)


def _write(path: str, table: np.ndarray, labelled: bool) -> None:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npy":
        np.save(path, table)
    elif ext == ".csv":
        np.savetxt(path, table, delimiter=",", fmt="%.9g")
    elif ext in (".svm", ".libsvm", ".svmlight", ".txt"):
        from sklearn.datasets import dump_svmlight_file

        X, y = (table[:, 1:], table[:, 0]) if labelled else (table, np.zeros(table.shape[0]))
        dump_svmlight_file(X, y, path)
    else:
        raise SystemExit(f"make_data: unknown output format {ext!r} (use .npy, .csv or .svm)")


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["higgs", "blobs"])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clusters", type=int, default=8, help="blobs only")
    parser.add_argument("--features", type=int, default=10, help="blobs only")
    parser.add_argument("--parts", type=int, default=1, help="files, with {rank} in --out")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.parts < 1:
        parser.error("--rows and --parts must be >= 1")
    if args.parts > 1 and "{rank}" not in args.out:
        parser.error("--parts needs {rank} in --out, e.g. data/part-{rank}.npy")
    folder = os.path.dirname(args.out)
    if folder:
        os.makedirs(folder, exist_ok=True)
    for part in range(args.parts):
        start, stop = shard_range(args.rows, part, args.parts)
        path = args.out.format(rank=part) if args.parts > 1 else args.out
        _write(path, _rows(args.kind, args, start, stop - start), args.kind == "higgs")
        print(f"wrote {stop - start} rows to {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
