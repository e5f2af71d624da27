"""Run the per-rank suite (tests/mpi) on real ranks: 1 rank without mpirun,
then 2 and 4 ranks under rabit-run (mpirun --with-ft ulfm). One start per
world size runs every check in that suite."""

import re
import sys

import pytest

from .._proc import rabit_run, run

PYTEST = [sys.executable, "-m", "pytest", "tests/mpi", "--with-mpi", "-q", "--color=no",
          "-p", "no:cacheprovider"]


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_per_rank_suite(ranks):
    cmd = PYTEST if ranks == 1 else rabit_run(ranks, *PYTEST)
    code, out = run(cmd, timeout=300)
    summaries = re.findall(r"^(?:=+ )?(\d+) passed(.*?)(?: =+)?$", out, flags=re.M)
    assert code == 0, out[-8000:]
    assert len(summaries) == ranks, out[-8000:]        # every rank reported
    assert all("failed" not in rest and "error" not in rest for _, rest in summaries), out[-8000:]
    assert all(int(passed) >= 30 for passed, _ in summaries), summaries
