"""A program written for XGBoost's ``xgboost.collective``, switched to rabit_py
by its import line, run on every rank of a job (tests/jobs/test_dropins.py).

Each scenario checks the behaviour XGBoost documents and its own tests rely
on (tracker arguments accepted, values, return types and shapes, the input
left as it was, the non-root argument ignored, init/finalize repeated in one
process), and prints ``PASS <scenario> <rank>``; a failed check raises.
"""

import argparse
import socket
import sys

import numpy as np

import rabit_py.collective as collective

# What XGBoost's RabitTracker.worker_args() hands each worker: meaningless
# under MPI, and accepted.
TRACKER_ARGS = {"dmlc_tracker_uri": "127.0.0.1", "dmlc_tracker_port": 9091,
                "dmlc_task_id": "[xgboost.test]:0", "dmlc_retry": 3, "dmlc_timeout": 120}


def communicator(world: int) -> None:
    with collective.CommunicatorContext(**TRACKER_ARGS) as args:
        assert args["dmlc_tracker_port"] == 9091
        assert collective.get_world_size() == world
        assert collective.is_distributed() == (world > 1)
        assert collective.get_processor_name() == socket.gethostname()
        me = collective.get_rank()
        assert collective.broadcast(("from root", 0.25), 0) == ("from root", 0.25)
        data = np.asarray([me, 10, -me])
        total = collective.allreduce(data, collective.Op.SUM)
        assert total.tolist() == [world * (world - 1) // 2, 10 * world,
                                  -(world * (world - 1) // 2)]
        assert data.tolist() == [me, 10, -me], "the input must not be written"


def ops(world: int) -> None:
    with collective.CommunicatorContext(**TRACKER_ARGS):
        rank = collective.get_rank()
        assert collective.allreduce(np.array([1]), collective.Op.SUM)[0] == world
        assert collective.allreduce(np.array([rank]), collective.Op.MAX) == world - 1
        assert collective.allreduce(np.array([rank]), collective.Op.MIN) == 0
        bits = np.array([1 << rank], dtype=np.uint32)
        assert collective.allreduce(bits, collective.Op.BITWISE_OR)[0] == (1 << world) - 1
        assert collective.allreduce(bits, collective.Op.BITWISE_AND)[0] == (
            1 if world == 1 else 0)
        assert collective.allreduce(np.array([rank % 2], np.int8),
                                    collective.Op.BITWISE_XOR)[0] == (world // 2) % 2
        # Any layout; the result is flat (XGBoost before 3.4).
        grid = np.arange(6, dtype=np.float32).reshape(2, 3)
        out = collective.allreduce(grid.T, collective.Op.SUM)
        assert out.shape == (6,) and out.dtype == np.float32
        assert np.array_equal(out, grid.T.ravel() * world)
        for bad in ([1, 2], np.array([True]), np.array([1j])):
            try:
                collective.allreduce(bad, collective.Op.SUM)
            except TypeError:
                pass
            else:
                raise AssertionError(f"allreduce({bad!r}) must raise TypeError")


def large(world: int, size: int) -> None:
    """Many one-element reductions, then a large one: exact sums, input kept."""
    with collective.CommunicatorContext(**TRACKER_ARGS):
        me = collective.get_rank()
        big = np.arange(size, dtype=np.float64) + me
        for step in range(64):
            got = collective.allreduce(np.array([step, me], np.int32), collective.Op.SUM)
            assert got.tolist() == [step * world, world * (world - 1) // 2], got
        total = collective.allreduce(big, collective.Op.SUM)
        expected = np.arange(size, dtype=np.float64) * world + world * (world - 1) / 2
        assert np.array_equal(total, expected)
        assert np.array_equal(big, np.arange(size, dtype=np.float64) + me)


def broadcasts(world: int) -> None:
    with collective.CommunicatorContext(**TRACKER_ARGS):
        rank = collective.get_rank()
        assert collective.broadcast(17, 0) == 17
        root = world - 1
        mine = np.full(3, rank)             # ignored and not written off the root
        got = collective.broadcast(mine, root)
        assert got.tolist() == [root] * 3 and mine.tolist() == [rank] * 3
        assert collective.broadcast({"k": [1, 2]} if rank == 0 else None, 0) == {"k": [1, 2]}


def reuse(world: int, trials: int, seed: int) -> None:
    """One array handed to broadcasts and reductions in a mixed order, in
    several sessions of init/finalize in one process: every result right,
    the array never written, and between sessions rank 0 of 1 again."""
    order = np.random.default_rng(seed).permutation(np.tile(np.arange(3), 4)).tolist()
    shared = np.arange(2 * world + 1) / 4.0          # quarters: sums are exact
    for _ in range(trials):
        with collective.CommunicatorContext(**TRACKER_ARGS):
            me = collective.get_rank()
            for kind in order:
                if kind == 0:
                    got = collective.broadcast(shared + me, root=world - 1)
                    assert np.array_equal(got, shared + (world - 1))
                elif kind == 1:
                    got = collective.allreduce(np.full(3, me - 1), collective.Op.MIN)
                    assert got.tolist() == [-1, -1, -1]
                else:
                    got = collective.allreduce(shared, collective.Op.SUM)
                    assert np.array_equal(got, shared * world)
        assert collective.get_rank() == 0 and collective.get_world_size() == 1
    assert np.array_equal(shared, np.arange(2 * world + 1) / 4.0)


def worker_port(world: int) -> None:
    args = dict(TRACKER_ARGS)
    collective.Config(worker_port=lambda: 0, timeout=60).update_worker_args(args)
    assert args["dmlc_worker_port"] == 0 and args["dmlc_timeout"] == 60
    with collective.CommunicatorContext(**args):
        assert collective.allreduce(np.array([1]), collective.Op.SUM)[0] == world


def outside(world: int) -> None:
    """Before init and after finalize: rank 0 of 1, identities."""
    del world
    assert collective.get_rank() == 0 and collective.get_world_size() == 1
    assert not collective.is_distributed()
    data = np.arange(3.0)
    out = collective.allreduce(data, collective.Op.SUM)
    assert np.array_equal(out, data) and not np.shares_memory(out, data)
    assert collective.broadcast("x", 0) == "x"


SCENARIOS = ("outside", "communicator", "ops", "large", "broadcasts", "reuse", "worker_port")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--large", type=int, default=1 << 20)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args()
    for name in args.scenarios:
        if name == "large":
            large(args.world, args.large)
        elif name == "reuse":
            reuse(args.world, args.trials, seed=7)
        else:
            globals()[name](args.world)
        # The rank as the job numbered it (outside a job every process is 0).
        print(f"PASS {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
