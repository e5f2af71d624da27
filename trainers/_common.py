"""What every trainer needs from the job: joining it, agreeing on bad input,
where this rank's rows sit in the global order, exact sums, and progress.

Trainers use only the public ``rabit_py`` API (DESIGN.md, layers).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any, Iterable, Optional

import numpy as np

import rabit_py as rabit
from rabit_py.cli import HelpFormatter
from rabit_py.extras import missing

__all__ = ["ensure_init", "DataError", "agree", "global_offset", "exact_sum", "progress",
           "splitmix64", "resume_state", "state_key", "data_fingerprint"]


class DataError(ValueError):
    """Training data that cannot be used (ragged rows, bad labels, NaN where not
    allowed, an empty shard...). Raised on every rank together, naming the rank
    whose data is bad, so no rank is left waiting in a collective."""


def ensure_init() -> None:
    """Join the job with the default settings unless the caller already did."""
    try:
        rabit.get_rank()
    except rabit.NotInitializedError:
        rabit.init()


def resume_state(trainer: str, key: Any) -> Optional[dict]:
    """The checkpointed state to resume from, or None to start fresh.

    The checkpoint belongs to the job, not to one training call: a program
    that trains twice sees the first training's last checkpoint. A trainer
    resumes only from its own kind of state made for the same data shape
    and settings (``key``). Recovery of a failed worker therefore assumes
    one training per job, as in Rabit and XGBoost."""
    _, state = rabit.load_checkpoint()
    if isinstance(state, dict) and state.get("trainer") == trainer and \
            state.get("key") == state_key(key):
        return state
    return None


def data_fingerprint(*arrays: Optional[np.ndarray]) -> str:
    """A checksum of every rank's training data (CRC-32C of each array's
    bytes, shape and dtype, gathered in rank order), for the resume key: two
    trainings of one job on data of the same shape but other values (cross-
    validation folds) must not resume each other's checkpoint. Collective."""
    from crc32c import crc32c

    mine = 0
    for array in arrays:
        if array is None:
            continue
        a = np.ascontiguousarray(array)
        mine = crc32c(f"{a.shape}{a.dtype.str}".encode(), mine)
        mine = crc32c(a.view(np.uint8).reshape(-1) if a.size else b"", mine)
    everyone = rabit.allgather(np.array([mine], dtype=np.int64))
    return "".join(f"{int(v) & 0xFFFFFFFF:08x}" for v in everyone)


def state_key(key: Any) -> str:
    """``key`` in the form kept in a checkpoint (a string: compared exactly)."""
    return json.dumps(key, sort_keys=True, default=repr)


def agree(problem: Optional[str]) -> None:
    """Raise :class:`DataError` on every rank if any rank found a ``problem``
    with its input (``None`` where it found none). One small allreduce."""
    size = rabit.get_world_size()
    flags = np.zeros(size, dtype=np.int8)
    flags[rabit.get_rank()] = problem is not None
    rabit.allreduce(flags, rabit.Op.MAX)
    bad = np.flatnonzero(flags)
    if bad.size == 0:
        return
    message = rabit.broadcast(problem if rabit.get_rank() == bad[0] else None, int(bad[0]))
    others = f" (ranks with bad data: {', '.join(map(str, bad))})" if bad.size > 1 else ""
    raise DataError(f"rank {bad[0]}: {message}{others}")


def global_offset(n_local: int) -> tuple:
    """(index of this rank's first row in the global row order, global rows):
    shards are taken to be consecutive row ranges in rank order (the results
    that depend on the order, such as k-means' seeds and the MLP's batches,
    match a one-process run only then)."""
    sizes = rabit.allgather(np.array([n_local], dtype=np.int64))
    rank = rabit.get_rank()
    return int(sizes[:rank].sum()), int(sizes.sum())


def exact_sum(values: np.ndarray, scale_bits: Optional[int] = None) -> float:
    """A global sum of ``values`` that does not depend on how rows are split:
    values are rounded to a fixed-point grid (common to all ranks) and summed
    as integers. ``values`` may be empty on some ranks."""
    values = np.asarray(values, dtype=np.float64).ravel()
    top = np.array([np.abs(values).max() if values.size else 0.0, float(values.size)])
    rabit.allreduce(top, rabit.Op.MAX)
    counts = rabit.allreduce(np.array([values.size], dtype=np.int64), rabit.Op.SUM)
    biggest, n = top[0], int(counts[0])
    if biggest == 0.0 or n == 0:
        return 0.0
    if scale_bits is None:
        scale_bits = 62 - math.ceil(math.log2(n + 1)) - 1
    exponent = scale_bits - math.ceil(math.log2(biggest + 1e-300))
    fixed = np.rint(np.ldexp(values, exponent)).astype(np.int64)
    total = rabit.allreduce(np.array([fixed.sum()], dtype=np.int64), rabit.Op.SUM)
    return math.ldexp(float(total[0]), -exponent)


def splitmix64(keys: np.ndarray) -> np.ndarray:
    """A counter-based hash (uint64 -> uint64): random draws keyed by global
    row number, so a row's draw does not depend on which rank holds it."""
    z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def progress(iterable: Iterable[Any], total: int, desc: str, verbose: bool) -> Any:
    """A tqdm progress bar on rank 0 (when ``verbose``); the bare iterable elsewhere."""
    if not verbose or rabit.get_rank() != 0:
        return iterable
    if missing("tqdm"):
        # A progress bar is not worth ending a training for.
        print(f"{desc}: no progress bar without tqdm (pip install -e \".[trainers]\")",
              file=sys.stderr, flush=True)
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, dynamic_ncols=True, leave=True)


def cli_parser(prog: str, doc: Optional[str]) -> argparse.ArgumentParser:
    """The argument parser of a trainer's command line: the description is
    the first paragraph of its module's docstring (whole, in plain text),
    and every option's help shows its default."""
    first = (doc or "").strip().split("\n\n")[0]
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", " ".join(first.split())).replace("``", "")
    return argparse.ArgumentParser(prog=prog, description=text,
                                   formatter_class=HelpFormatter)
