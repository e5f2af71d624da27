"""The README's demo, at one rank without mpirun and at four under rabit-run."""

import re
import sys

import pytest

from .._proc import rabit_run, run


@pytest.mark.parametrize("ranks", [1, 4])
def test_demo_converges_with_identical_models(ranks):
    program = [sys.executable, "scripts/demo.py", "--iterations", "25"]
    code, out = run(program if ranks == 1 else rabit_run(ranks, *program), timeout=120)
    assert code == 0, out
    match = re.search(r"demo OK: ranks \[(.*?)\], version (\d+), max \|w - w_true\| = ([\d.]+), "
                      r"model identical on all ranks: True", out)
    assert match, out
    assert match.group(1) == ", ".join(str(r) for r in range(ranks))
    assert int(match.group(2)) == 25
    assert float(match.group(3)) < 0.05
    assert out.count("demo OK") == 1        # printed once, by rank 0


def test_demo_with_a_kill_ends_with_the_same_model():
    program = [sys.executable, "scripts/demo.py", "--iterations", "12"]
    digests = []
    for extra in ([], ["--kill", "2:5"]):
        code, out = run(rabit_run(4, *program, *extra), timeout=120)
        assert code == 0, out
        digests.append(re.search(r"model digest ([0-9a-f]+)", out).group(1))
        pids = re.search(r"process ids by rank: \[(.*?)\]", out).group(1)
        if extra:
            assert "rabit_py mock: rank 2 killed at version 5" in out
            assert "replaced rank(s) [2]" in out
    assert digests[0] == digests[1]
    assert pids
