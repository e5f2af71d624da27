"""The public surface is exactly DESIGN.md's, and importing starts no MPI."""

import subprocess
import sys

import rabit_py

DESIGN_NAMES = {
    "init", "finalize", "get_rank", "get_world_size", "is_distributed", "get_processor_name",
    "allreduce", "broadcast", "allgather", "checkpoint", "lazy_checkpoint", "load_checkpoint",
    "version_number", "tracker_print", "session", "Op", "RabitError",
    "CollectiveMismatchError", "CollectiveTimeoutError", "RecoveryError", "CheckpointError",
    "NotInitializedError",
}


def test_all_design_names_are_exported():
    assert DESIGN_NAMES <= set(rabit_py.__all__)
    for name in rabit_py.__all__:
        assert hasattr(rabit_py, name), name


def test_errors_form_one_hierarchy():
    for name in ("CollectiveMismatchError", "CollectiveTimeoutError", "RecoveryError",
                 "CheckpointError", "NotInitializedError", "KVStoreError"):
        assert issubclass(getattr(rabit_py, name), rabit_py.RabitError)
    from rabit_py.errors import PeerFailure
    assert not issubclass(PeerFailure, rabit_py.RabitError)


def test_public_functions_are_documented():
    for name in rabit_py.__all__:
        obj = getattr(rabit_py, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name


def test_import_starts_no_mpi():
    code = ("import sys, rabit_py, rabit_py.api, rabit_py.engine; "
            "print('mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_checkpoint_function_is_not_shadowed_by_a_module():
    code = ("import rabit_py as r; r.init(); import rabit_py.engine._checkpoint; "
            "print(callable(r.checkpoint)); r.finalize()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "True", out.stderr
