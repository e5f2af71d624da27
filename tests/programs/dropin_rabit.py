"""Programs written for Rabit's Python API (dmlc/rabit's guide and tests, and
XGBoost's ``xgboost.rabit``), switched to rabit_py by the import line only,
run on every rank of a job (tests/jobs/test_dropins.py).

    python dropin_rabit.py --module rabit_py.rabit basic lazy [mock=1,1,0,0 ...]

``--module`` is what the program imports as ``rabit``: ``rabit_py`` (the
top-level API) or ``rabit_py.rabit`` (Rabit's exact semantics). The scenarios named run in
turn (each from ``init`` to ``finalize``) and print ``RESULT <scenario>
<json>`` per rank; the test checks the values.
Arguments after the scenario are handed to ``rabit.init`` as Rabit programs
hand ``sys.argv``.
"""

import importlib
import json
import socket
import sys

import numpy as np


def basic(rabit) -> dict:
    """A MAX, then a SUM of its result, assigned back as Rabit's programs do."""
    rabit.init(sys.argv)
    rank = rabit.get_rank()
    a = np.array([2.0 * rank, 5.0 - rank, 1.5])
    a = rabit.allreduce(a, rabit.MAX)
    after_max = a.tolist()
    a = rabit.allreduce(a, rabit.SUM)
    out = {"rank": rank, "world": rabit.get_world_size(), "max": after_max, "sum": a.tolist()}
    rabit.finalize()
    return out


def broadcast(rabit) -> dict:
    """A dict from rank 0; the others pass None."""
    rabit.init(sys.argv)
    rank = rabit.get_rank()
    s = {"model": [0.5, 7], 9: "nine"} if rank == 0 else None
    s = rabit.broadcast(s, 0)
    rabit.finalize()
    return {"rank": rank, "s": sorted((str(k), v) for k, v in s.items())}


def lazy(rabit) -> dict:
    """An allreduce whose buffer is filled by prepare_fun, in place."""
    rabit.init(sys.argv)
    rank = rabit.get_rank()
    a = np.zeros(3)
    prepared = []

    def prepare(buf):
        prepared.append(rank)
        buf[:] = [3.0 * rank, 1.0, -rank]

    rabit.allreduce(a, rabit.MAX, prepare_fun=prepare)
    rabit.finalize()
    return {"rank": rank, "a": a.tolist(), "prepared": prepared}


def recover(rabit) -> dict:
    """Rounds that checkpoint a global and a per-rank local model; with
    ``lib='mock'`` and ``mock=`` arguments ranks die and come back, and the
    local model must come back with them."""
    rabit.init(sys.argv, lib="mock")
    rank, rounds = rabit.get_rank(), 4
    version, model, local = rabit.load_checkpoint(True)
    if version == 0:
        model, local = np.zeros(4), np.full(4, float(rank))
    for i in range(version, rounds):
        model = rabit.allreduce(model * 0.5 + local, rabit.SUM)
        local = local + i + 1
        rabit.checkpoint(model, local)
    out = {"rank": rank, "model": model.tolist(), "local": local.tolist(),
           "version": rabit.version_number()}
    rabit.finalize()
    return out


def xgboost_rabit(rabit) -> dict:
    """``xgboost.rabit`` (1.x-2.0): RabitContext with bytes arguments, Op, bytes host name."""
    args = [b"DMLC_TRACKER_URI=127.0.0.1", b"DMLC_TRACKER_PORT=9091", b"DMLC_TASK_ID=0"]
    with rabit.RabitContext(args):
        world = rabit.get_world_size()
        name = rabit.get_processor_name()
        assert name.decode() == socket.gethostname(), name
        assert rabit.broadcast(["xgboost.rabit", 2], 0) == ["xgboost.rabit", 2]
        ret = rabit.allreduce(np.asarray([4, 0, 9]), rabit.Op.SUM)
        assert np.array_equal(ret, np.asarray([4, 0, 9]) * world), ret
        flags = rabit.allreduce(np.asarray([1 << rabit.get_rank()], np.int32), rabit.Op.OR)
        return {"rank": rabit.get_rank(), "world": world, "or": int(flags[0]),
                "distributed": bool(rabit.is_distributed())}


def semantics(rabit) -> dict:
    """What Rabit's allreduce writes and returns, and its printing."""
    rabit.init()
    rank, world = rabit.get_rank(), rabit.get_world_size()
    owned = np.arange(6, dtype=np.float64).reshape(2, 3).copy()    # owns its memory
    result = rabit.allreduce(owned, rabit.SUM)
    base = np.arange(8, dtype=np.int64)
    view = base[2:6]
    view_result = rabit.allreduce(view, rabit.SUM)
    rabit.tracker_print(f"hello from rank {rank}\n")
    out = {"rank": rank, "world": world, "result_shape": list(result.shape),
           "result": result.ravel().tolist(), "owned_after": owned.ravel().tolist(),
           "owned_shared": bool(np.shares_memory(owned, result)),
           "view_after": view.tolist(), "view_result": view_result.tolist(),
           "host": rabit.get_processor_name().decode()
           if isinstance(rabit.get_processor_name(), bytes) else None}
    rabit.finalize()
    return out


def main() -> int:
    module = sys.argv[sys.argv.index("--module") + 1]
    rabit = importlib.import_module(module)
    for scenario in [a for a in sys.argv[1:] if a in SCENARIOS]:
        result = SCENARIOS[scenario](rabit)
        print("RESULT " + scenario + " " + json.dumps(result), flush=True)
    return 0


SCENARIOS = {"basic": basic, "broadcast": broadcast, "lazy": lazy, "recover": recover,
             "xgboost_rabit": xgboost_rabit, "semantics": semantics}

if __name__ == "__main__":
    sys.exit(main())
