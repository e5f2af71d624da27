"""Run a command in its own process group, under a timeout, and reap it all."""

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]


def rabit_run(n: int, *program: str, spares: int = 0) -> List[str]:
    """The command that starts ``program`` on ``n`` ranks (and ``spares``
    spare processes) with rabit-run."""
    return [sys.executable, "-m", "rabit_py.launcher", "-n", str(n),
            *(["--spares", str(spares)] if spares else []), "--", *program]


def run(cmd: List[str], timeout: float, env: Optional[dict] = None,
        cwd: Optional[Path] = None,
        on_line: Optional[Callable[[str], None]] = None,
        clear_env: bool = False,
        finished: Optional[Callable[[List[str]], bool]] = None) -> Tuple[int, str]:
    """Run ``cmd`` (in ``cwd``, default the checkout); return (exit code,
    stdout+stderr). ``env`` is added to this process's environment, or is
    the whole environment with ``clear_env``. ``on_line`` is called with
    each line as it comes (to act on cues: kill a process when the job says
    something). A command still running at ``timeout`` has its whole process
    group killed and fails the test (with the stacks of its processes where
    py-spy can take them). ``finished(lines)``: the job's work is done (every
    rank said so); a plain ``mpirun`` job still there ``TEARDOWN_GRACE_S``
    later is stopped then and its output returned, as the README tells
    users to do: Open MPI's ``MPI_Finalize`` can hang after a spawned
    recovery (Note [teardown hang] in rabit_py/launcher/_supervisor.py)."""
    proc = subprocess.Popen(cmd, cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env=dict(env or {}) if clear_env else {**os.environ, **(env or {})})
    lines: List[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _wait(proc, timeout, lines, finished)
        reader.join(timeout=30)
    except subprocess.TimeoutExpired:
        stacks = stacks_of(proc.pid)
        _kill_tree(proc.pid)
        reader.join(timeout=30)
        raise AssertionError(
            f"timed out after {timeout} s: {' '.join(cmd)}\n{''.join(lines)[-6000:]}"
            f"{stacks}") from None
    finally:
        _kill_tree(proc.pid)                        # leftovers of the job, if any
    return proc.returncode, "".join(lines)


TEARDOWN_GRACE_S = 15.0


def _wait(proc: "subprocess.Popen[str]", timeout: float, lines: List[str],
          finished: Optional[Callable[[List[str]], bool]]) -> None:
    """Wait for ``proc`` as :func:`run` says; raises ``TimeoutExpired``."""
    if finished is None:
        proc.wait(timeout=timeout)
        return
    deadline = time.monotonic() + timeout
    done_at = None
    while proc.poll() is None:
        now = time.monotonic()
        if done_at is None and finished(list(lines)):
            done_at = now
        if done_at is not None and now - done_at > TEARDOWN_GRACE_S:
            lines.append(f"[test: stopped {TEARDOWN_GRACE_S:.0f} s after its work was done: "
                         f"Open MPI's teardown hang]\n")
            _kill_tree(proc.pid)
            proc.wait(timeout=30)
            return
        if now > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(0.1)


def stacks_of(pid: int) -> str:
    """The Python stacks of ``pid``'s descendants (``py-spy dump``, where it
    is installed and may trace them), for the message of a test that hung."""
    import shutil
    from rabit_py.launcher._processes import descendants as _descendants
    spy = shutil.which("py-spy")
    if spy is None:
        return ""
    dumps = []
    for child in _descendants(pid):
        try:
            done = subprocess.run([spy, "dump", "--pid", str(child)], capture_output=True,
                                  text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and "python" in done.stdout.lower():
            dumps.append(done.stdout.strip())
    return "\n\nstacks of the job's processes (py-spy):\n" + "\n\n".join(dumps) if dumps else ""


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


@contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes beside the block, killed after it."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


def server_processes(replacements: Optional[bool] = None) -> List[int]:
    """The parameter-server processes this process started (``python -m
    rabit_py.kvstore.server``; mpirun's own line names the module too, after
    other words), oldest PID first: the servers start in index order. With
    ``replacements``, only those spawned in a dead one's place (True) or
    only the job's first ones (False)."""
    from rabit_py.launcher._processes import descendants

    found = []
    for pid in sorted(descendants(os.getpid())):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if words[1:3] == [b"-m", b"rabit_py.kvstore.server"] and (
                replacements is None or (b"--replaces" in words) == replacements):
            found.append(pid)
    return found

