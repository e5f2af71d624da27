"""What rabit-run checks before it starts a job: a program that cannot start
(its file is missing), settings that ``init`` would refuse, a checkpoint
folder that cannot be used. Each is a set-up error: found at once, with one
message, and never restarted (a restart would fail the same way)."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from typing import Dict, List, Optional

from ..config import Config
from ..engine import checkpoint_folder_problem

__all__ = ["setup_problem"]

_PYTHON = re.compile(r"python[0-9.]*$")
_PYTHON_TAKES_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def setup_problem(program: List[str], env: Dict[str, str], one_node: bool,
                  srun: bool = False) -> Optional[str]:
    """Why the job cannot start as given, or None.

    Args:
        program: the program and its arguments.
        env: the environment the job gets (its ``RABIT_*`` settings).
        one_node: whether the job runs on this machine only (files and
            folders are then checked here; on several hosts they may exist
            on the others only).
        srun: the ranks are started by Slurm's srun (``--launcher srun``).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # the ranks warn of unknown names
            config = Config.from_env(env)
    except (TypeError, ValueError) as exc:
        return f"a setting is invalid: {exc}"
    if srun and config.engine in ("robust", "mock"):
        return (f"RABIT_ENGINE={config.engine} recovers in the job, which needs MPI fault "
                f"tolerance (mpirun --with-ft ulfm), and srun starts the ranks without it: "
                f"drop --launcher srun (rabit-run's mpirun runs inside the allocation and "
                f"starts its daemons with srun), or leave RABIT_ENGINE unset for restarts "
                f"from durable checkpoints only")
    if not one_node:
        return None
    folder = env.get("RABIT_CHECKPOINT_DIR")
    if folder:
        problem = checkpoint_folder_problem(folder, config.trust_checkpoints)
        if problem is not None:
            return problem
    return _program_problem(program, env)


def _program_problem(program: List[str], env: Dict[str, str]) -> Optional[str]:
    command = program[0]
    if os.sep in command:
        if not (os.path.isfile(command) and os.access(command, os.X_OK)):
            return f"the program {command} does not exist or is not executable"
    elif shutil.which(command, path=env.get("PATH")) is None:
        return f"the program {command} is not on PATH"
    if not _PYTHON.match(os.path.basename(command)):
        return None
    args = iter(program[1:])
    for word in args:
        if word in ("-c", "-m", "-"):
            return None                 # code or a module, no script file
        if word in _PYTHON_TAKES_VALUE:
            next(args, None)
        elif not word.startswith("-"):
            if not os.path.isfile(word):
                return f"{command} cannot open the program's file {word}: no such file"
            return None
    return None
