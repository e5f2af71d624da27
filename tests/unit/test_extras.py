"""Optional dependencies are checked before the work starts, with a message
naming the extra: rabit_py.extras, the scripts' --plot, the trainers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rabit_py.extras import missing, require

ROOT = Path(__file__).resolve().parents[2]
# Scripts that import mpi4py start a one-process MPI job: without the
# shared-memory BTL it leaves no file in /dev/shm (engine/_mpistart.py).
ENV = {**os.environ, "OMPI_MCA_btl": "^ofi,sm"}


def test_require_names_the_extra():
    assert not missing("numpy")
    assert missing("surely_not_a_module_rabit")
    require("numpy", "test")                    # installed: nothing happens
    with pytest.raises(SystemExit, match=r'--plot needs surely_not_a_module_rabit, which is '
                                         r'not installed: pip install -e "\.\[bench\]"'):
        require("surely_not_a_module_rabit", "bench", "--plot")


@pytest.mark.parametrize("script", ["bench_collectives", "bench_kvstore", "bench_overlap",
                                    "bench_recovery", "bench_trainers", "bench_hotpath",
                                    "bench_no_checkpoint", "bench_xgboost"])
def test_benchmarks_check_matplotlib_before_the_work(script):
    # matplotlib made unimportable (a None entry in sys.modules): the script
    # must stop at once with the extra's name, not after minutes of work.
    plot = ["--plot"] if script in ("bench_trainers", "bench_xgboost") else ["--plot", "x.png"]
    if script == "bench_hotpath":
        plot += ["--before", "HEAD"]
    env_code = (f"import sys, runpy; sys.modules['matplotlib'] = None; "
                f"sys.argv = ['{script}'] + {plot!r}; "
                f"runpy.run_path('scripts/{script}.py', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", env_code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=ENV)
    assert done.returncode != 0
    assert 'pip install -e ".[bench]"' in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]


def test_the_trainers_name_their_extra_without_scikit_learn():
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['sklearn'] = None; "
                                                 "import trainers.kmeans"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr
    assert 'need scikit-learn, which is not installed: pip install -e ".[trainers]"' in \
        done.stderr, done.stderr[-2000:]


def test_the_scripts_that_need_xgboost_say_so():
    done = subprocess.run([sys.executable, "-c",
                           "import sys, runpy; sys.modules['xgboost'] = None; "
                           "runpy.run_path('scripts/xgboost_train.py', run_name='__main__')"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode != 0
    assert 'needs xgboost, which is not installed: pip install -e ".[xgboost]"' in \
        done.stderr, done.stderr[-2000:]


def test_a_missing_extra_is_said_by_rank_0_only(monkeypatch):
    # Issue 28: a benchmark under rabit-run printed the hint once per rank.
    from rabit_py.extras import require
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    with pytest.raises(SystemExit) as stopped:
        require("surely_not_a_module_rabit", "bench", "--plot")
    assert stopped.value.code == 2                  # stops, silently
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(SystemExit) as stopped:
        require("surely_not_a_module_rabit", "bench", "--plot")
    assert 'pip install -e ".[bench]"' in str(stopped.value.code)
