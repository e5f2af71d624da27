"""Run a command in its own process group, under a timeout, and reap it all."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]


def rabit_run(n: int, *program: str, spares: int = 0) -> List[str]:
    """The command that starts ``program`` on ``n`` ranks (and ``spares``
    spare processes) with rabit-run."""
    return [sys.executable, "-m", "rabit_py.launcher", "-n", str(n),
            *(["--spares", str(spares)] if spares else []), "--", *program]


def run(cmd: List[str], timeout: float, env: Optional[dict] = None,
        cwd: Optional[Path] = None) -> Tuple[int, str]:
    """Run ``cmd`` (in ``cwd``, default the checkout); return (exit code,
    stdout+stderr). A command still running at ``timeout`` has its whole
    process group killed and fails the test."""
    proc = subprocess.Popen(cmd, cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, _ = proc.communicate(timeout=30)
        raise AssertionError(
            f"timed out after {timeout} s: {' '.join(cmd)}\n{out[-6000:]}") from None
    finally:
        _kill_tree(proc.pid)                        # leftovers of the job, if any
    return proc.returncode, out


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant (MPI ranks run in
    process groups of their own)."""
    from rabit_py.launcher._processes import descendants as _descendants
    for child in _descendants(pid):
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def debris() -> set:
    """What MPI jobs may leave behind on this machine: /dev/shm entries, and
    under the temporary folder Open MPI's session folders (with everything
    inside them: the top one ``ompi.<host>.<uid>`` may predate the test)
    and rabit_py's and rabit-run's private folders."""
    import tempfile
    found = set()
    if os.path.isdir("/dev/shm"):
        found |= {f"/dev/shm/{n}" for n in os.listdir("/dev/shm")}
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if name.startswith(("ompi.", "prte.", "rabit-run-", "rabit_py-mpi-")):
            top = os.path.join(tmp, name)
            found.add(top)
            for folder, dirs, files in os.walk(top):
                found |= {os.path.join(folder, n) for n in dirs + files}
    return found
