"""No debris (issue 28): no Open MPI session folder and no /dev/shm segment
is left by a one-process run, a multi-rank run or a benchmark."""

import json
import sys

from .._proc import debris, rabit_run, run

ONE_ALLREDUCE = ("import numpy as np, rabit_py as r\n"
                 "r.init()\n"
                 "x = r.allreduce(np.full(3, float(r.get_rank())), r.Op.SUM)\n"
                 "print('SUM', x.tolist(), flush=True)\n"
                 "r.finalize()\n")


def test_a_one_process_run_leaves_nothing():
    # Each `python train.py` left an empty /tmp/ompi.<host>.<uid>/jf.0/<job>
    # folder (37 after the README's tour).
    before = debris()
    for _ in range(2):
        code, out = run([sys.executable, "-c", ONE_ALLREDUCE], timeout=60)
        assert code == 0 and "SUM [0.0, 0.0, 0.0]" in out, out
    assert debris() - before == set()


def test_a_multi_rank_run_leaves_nothing():
    before = debris()
    code, out = run(rabit_run(3, sys.executable, "-c", ONE_ALLREDUCE), timeout=120)
    assert code == 0 and out.count("SUM [3.0, 3.0, 3.0]") == 3, out
    assert debris() - before == set()


def test_a_one_process_collectives_benchmark_is_refused_and_leaves_nothing(tmp_path):
    # It left a 16 MiB /dev/shm/sm_segment.* at every run and replaced the
    # last real figures with a one-rank table.
    before = debris()
    result = tmp_path / "collectives.json"
    result.write_text('{"ranks": 2}')
    code, out = run([sys.executable, "scripts/bench_collectives.py", "--json", str(result)],
                    timeout=120)
    assert code != 0
    assert ("bench_collectives times collectives across ranks: run it on 2 or more, e.g. "
            "rabit-run -n 2 python scripts/bench_collectives.py") in out, out
    assert json.loads(result.read_text()) == {"ranks": 2}
    assert debris() - before == set()
