"""Every shell command of the README works as written (issue 19): the
commands are taken from the README's fenced ``sh`` blocks, so the README
cannot drift from what runs. Each one is either run here (in a scratch
folder holding the README's ``train.py`` and a link to ``scripts/``, one
block after the other, so a block's data feeds its next command) or listed
in ``NOT_RUN_HERE`` with the reason and where it is run instead; a command
added to the README and in neither fails the test."""

import os
import re
import sys
from typing import List

import pytest

from .._proc import ROOT, run

README = (ROOT / "README.md").read_text()

# Commands not run by this test, and why (each is run elsewhere).
NOT_RUN_HERE = {
    'pip install -e ".[test]" && rabit-run -n 4 python scripts/demo.py':
        ".ci/run runs this set-up command itself, in a fresh virtualenv",
    "python -m pytest": "the test suite itself (.ci/run runs it)",
    "rabit-run -n 4 --checkpoint-dir /shared/ckpt --max-restarts 3 -- python train.py":
        "the README's sbatch script: it needs a Slurm allocation and a shared folder; "
        "tests/jobs/test_slurm.py runs such a script with sbatch on a real Slurm",
}


def fenced_commands(text: str) -> List[List[str]]:
    """The commands of each fenced ``sh`` block (and of blocks with no
    language whose lines start with a command we ship), continuations joined,
    comments dropped."""
    blocks = []
    for language, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        if language not in ("sh", ""):
            continue
        lines = body.replace("\\\n", " ").splitlines()
        commands = [re.sub(r"\s+#\s.*$", "", line).strip() for line in lines]
        commands = [re.sub(r"\s+", " ", c) for c in commands if c and not c.startswith("#")]
        if language == "" and not all(c.split()[0] in ("rabit-run", "mpirun", "python")
                                      for c in commands):
            continue                        # a layout or an output, not commands
        if commands:
            blocks.append(commands)
    return blocks


def test_the_readme_commands_are_found():
    found = [c for block in fenced_commands(README) for c in block]
    assert 'pip install -e ".[test]" && rabit-run -n 4 python scripts/demo.py' == found[0]
    assert "python -m pytest" == found[1]
    assert "rabit-run -n 4 python train.py" in found
    assert set(NOT_RUN_HERE) <= set(found), set(NOT_RUN_HERE) - set(found)


def _train_py() -> str:
    """The README's usage example, which its commands call ``train.py``."""
    blocks = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)
    return next(b for b in blocks if "rabit.init()" in b and "rabit.finalize()" in b)


BLOCKS = [b for b in fenced_commands(README) if not all(c in NOT_RUN_HERE for c in b)]


@pytest.mark.parametrize("block", BLOCKS, ids=[b[0][:60] for b in BLOCKS])
def test_readme_commands_work_as_written(block, tmp_path):
    (tmp_path / "train.py").write_text(_train_py())
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    (tmp_path / "data").mkdir()
    bin_dir = os.path.dirname(sys.executable)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    for command in block:
        if command in NOT_RUN_HERE:
            continue
        words = command
        if command.startswith("mpirun ") and os.geteuid() == 0:
            # The README's comment on this line: as root, add this.
            words = command.replace("mpirun ", "mpirun --allow-run-as-root ", 1)
        code, out = run(["bash", "-c", words], timeout=240, env=env, cwd=tmp_path)
        assert code == 0, f"{command}\n{out[-4000:]}"
        if command.endswith("python train.py"):
            assert "done at version 10" in out, out[-2000:]
