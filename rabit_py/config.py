"""The one configuration object of a rabit_py job.

Settings come from ``init(**kwargs)`` and from ``RABIT_*`` environment variables;
keyword arguments win. :meth:`Config.from_env` is the only code in rabit_py that
reads ``RABIT_*`` variables.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import warnings
from typing import Any, Mapping, Optional, Tuple

from ._unpickle import qualified_name

__all__ = ["Config", "ENGINES", "GPU_BACKENDS", "RABIT_LIBS", "from_rabit_args"]

ENGINES = ("auto", "mpi", "robust", "mock")
GPU_BACKENDS = ("auto", "staged", "nccl")       # Note [device arrays] in gpu/__init__.py

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings of one job (immutable).

    Attributes:
        engine: ``"auto"``, ``"mpi"``, ``"robust"`` or ``"mock"`` (``RABIT_ENGINE``).
        timeout: seconds a collective may take before ``CollectiveTimeoutError``;
            0 disables the watchdog (``RABIT_TIMEOUT``, default 600).
        check: agree on each collective's signature before running it, so that
            mismatched calls raise ``CollectiveMismatchError`` on every rank
            (``RABIT_CHECK``, default on).
        mock: fault-injection plan ``"rank,version,seqno,trial;..."`` for the
            ``"mock"`` engine (``RABIT_MOCK``).
        checkpoint_dir: directory for durable checkpoints (``RABIT_CHECKPOINT_DIR``);
            unset: checkpoints live in memory only.
        keep_checkpoints: complete durable versions kept on disk
            (``RABIT_KEEP_CHECKPOINTS``, default 2).
        restart_count: how many times rabit-run has restarted the whole job
            (``RABIT_RESTART_COUNT``, set by rabit-run; 0 on the first start).
        log_level: level of the ``rabit_py`` logger (``RABIT_LOG_LEVEL``).
        replicas: extra copies of each rank's local model kept on its ring
            neighbours by the robust engine (``RABIT_REPLICAS``, default 1).
        result_copies: ranks that keep each collective's result for replay:
            0 (default) every rank, so any number of simultaneous failures is
            recovered; k >= 2 spreads the results Rabit-style (result #s on
            ranks s..s+k-1 modulo the world size, the latest on every rank), so
            each rank copies k/n of them, and a failure is recovered unless all
            k holders of a needed result die together (``RABIT_RESULT_COPIES``).
        max_recoveries: recoveries allowed in one job before the robust engine
            gives up with ``RecoveryError`` (``RABIT_MAX_RECOVERIES``, default
            100; a rank that keeps dying right after being replaced is caught
            sooner by ``crash_loop``).
        shm: reduce large arrays through shared memory between the ranks of a
            node, hierarchically across nodes (``RABIT_SHM``, default on).
        shm_min_bytes: the smallest array that takes the shared-memory path
            (``RABIT_SHM_MIN_BYTES``, default 32 MiB: below it, where the data
            stays in cache, Open MPI's own allreduce was as fast or faster on
            the machines measured; smaller arrays stay on MPI). Custom
            reducers take the path from 256 KiB (or this, if smaller).
        shm_keep_min_bytes: the robust engine's: the smallest array it
            reduces through shared memory, keeping the result where the
            reduction wrote it instead of copying it (Note [kept results];
            ``RABIT_SHM_KEEP_MIN_BYTES``, default 1 MiB; the smaller of this
            and ``shm_min_bytes`` applies).
        node_size: pretend that nodes hold this many consecutive ranks, to
            exercise the hierarchical path on one machine (``RABIT_NODE_SIZE``;
            0: the real nodes).
        spares: processes of the job kept waiting, MPI and the program already
            started, to take a dead rank's place faster than spawning a new one
            (``RABIT_SPARES``, default 0; ``rabit-run --spares k`` starts n + k
            processes and sets it). The last ``spares`` processes of
            ``MPI.COMM_WORLD`` wait inside ``init()``; the job's world size is
            the rest. Robust engine only (Note [spares] in ``engine/_spares.py``).
        servers: parameter-server processes beside the workers (``RABIT_SERVERS``,
            default 0; ``rabit-run --servers S`` starts them and sets it): the
            last ``servers`` processes of ``MPI.COMM_WORLD`` run
            ``rabit_py.kvstore.server`` and the job's world size is the rest
            (Note [server processes] in ``rabit_py/_servers.py``).
        recovery_timeout: seconds one in-job repair may take (survivors
            shrinking, spawning and merging, a replacement joining, spares
            rebuilding) before the job is ended for a restart from the durable
            checkpoint (``RABIT_RECOVERY_TIMEOUT``, default 30; measured repairs
            take 0.01-2 s on the development VM; 0 = no limit). Replayed calls
            are collectives and wait up to ``timeout`` like any other.
        crash_loop: a rank whose replacements die this many times in a row
            before catching up with the others is taken for a bug (a crash or an
            exit at start-up that every replacement repeats), not a fault: the
            job ends with ``RecoveryError`` naming the rank
            (``RABIT_CRASH_LOOP``, default 3; 0 = never).
        cache_budget: bytes of results the robust engine keeps for replay on
            one rank (``RABIT_CACHE_BUDGET``; 0, the default, means 1/16 of
            the machine's memory shared by the ranks on it, the smallest
            rank's when hosts differ); calls made before the first
            checkpoint may use 1/8 of it. Results past it are not kept (said
            once, as a warning) and allreduces run as on plain MPI: a failure
            before the next checkpoint then ends the job for a restart from
            the durable checkpoint instead of an in-job recovery (Note [cache
            budget]).
        run_status_dir: the folder where ranks report to ``rabit-run``
            (``RABIT_RUN_STATUS_DIR``, set by rabit-run; Note [status folder]
            in ``rabit_py/_status.py``).
        gpu_backend: how CuPy arrays are reduced: ``"auto"``, ``"staged"``
            (through host memory) or ``"nccl"`` (not built yet)
            (``RABIT_GPU_BACKEND``; see Note [device arrays] in ``rabit_py/gpu``).
        checkpoint_classes: classes a checkpoint file may hold beyond data,
            as comma-separated ``module.Name`` (``RABIT_CHECKPOINT_CLASSES``;
            ``init`` also takes a list of classes or names). Note
            [checkpoints are data] in ``rabit_py/_unpickle.py``.
        trust_checkpoints: take a checkpoint folder that other users can
            write, and load checkpoint files as any pickle, running what they
            name: only for a folder whose writers you all trust
            (``RABIT_TRUST_CHECKPOINTS``, default off; Note [private folder]
            in ``rabit_py/engine/_store.py``).
        strict_checkpoints: a durable checkpoint that cannot be written (a
            full disk) ends the job at the next checkpoint, instead of being
            said once and skipped (``RABIT_STRICT_CHECKPOINTS``, default off;
            Note [failed writes] in ``rabit_py/engine/_store.py``).
    """

    engine: str = "auto"
    timeout: float = 600.0
    check: bool = True
    mock: str = ""
    checkpoint_dir: Optional[str] = None
    keep_checkpoints: int = 2
    restart_count: int = 0
    log_level: str = "WARNING"
    replicas: int = 1
    result_copies: int = 0
    max_recoveries: int = 100
    shm: bool = True
    shm_min_bytes: int = 32 << 20
    shm_keep_min_bytes: int = 1 << 20
    node_size: int = 0
    spares: int = 0
    servers: int = 0
    recovery_timeout: float = 30.0
    crash_loop: int = 3
    cache_budget: int = 0
    run_status_dir: Optional[str] = None
    gpu_backend: str = "auto"
    checkpoint_classes: str = ""
    trust_checkpoints: bool = False
    strict_checkpoints: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_classes, str):
            try:
                names = [qualified_name(c) for c in self.checkpoint_classes]
            except TypeError as exc:
                raise TypeError(f"checkpoint_classes: {exc}") from None
            object.__setattr__(self, "checkpoint_classes", ",".join(names))
        for name in self.allowed_checkpoint_classes:
            if "." not in name or any(ch.isspace() for ch in name):
                raise ValueError(f"checkpoint_classes: {name!r} is not a 'module.Name' of a "
                                 f"class (e.g. mypackage.models.MyModel)")
        for name in ("trust_checkpoints", "strict_checkpoints"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be a bool")
        if self.engine not in ENGINES:
            raise ValueError(
                f"engine={self.engine!r} is not one of {', '.join(ENGINES)}")
        if not isinstance(self.timeout, (int, float)) or self.timeout < 0:
            raise ValueError(
                f"timeout={self.timeout!r} must be a number of seconds >= 0 (0 = no timeout)")
        if not isinstance(self.recovery_timeout, (int, float)) or self.recovery_timeout < 0:
            raise ValueError(f"recovery_timeout={self.recovery_timeout!r} must be a number of "
                             f"seconds >= 0 (0 = no limit)")
        if not isinstance(self.check, bool):
            raise TypeError(f"check={self.check!r} must be a bool")
        if isinstance(self.keep_checkpoints, bool) or not isinstance(self.keep_checkpoints, int) \
                or self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints={self.keep_checkpoints!r} must be an integer >= 1")
        if self.result_copies == 1:
            raise ValueError("result_copies=1 would lose a result with the one rank that holds "
                             "it; use 0 (every rank) or at least 2 (any single failure is "
                             "recovered)")
        if self.gpu_backend not in GPU_BACKENDS:
            raise ValueError(f"gpu_backend={self.gpu_backend!r} is not one of "
                             f"{', '.join(GPU_BACKENDS)}")
        if not isinstance(self.shm, bool):
            raise TypeError(f"shm={self.shm!r} must be a bool")
        for name in ("replicas", "max_recoveries", "restart_count", "shm_min_bytes",
                     "shm_keep_min_bytes",
                     "node_size", "result_copies", "spares", "servers", "crash_loop",
                     "cache_budget"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r} must be an integer >= 0")
        if self.log_level.upper() not in _LOG_LEVELS:
            raise ValueError(
                f"log_level={self.log_level!r} is not one of {', '.join(_LOG_LEVELS)}")

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None,
                 **overrides: Any) -> "Config":
        """Build the config from ``RABIT_*`` variables, then apply ``overrides``.

        Args:
            environ: the environment to read (default ``os.environ``).
            **overrides: field values that win over the environment
                (the keyword arguments of ``init``).

        Returns:
            The frozen config.

        Raises:
            TypeError: an override names no field of ``Config``.
            ValueError: a value (from either source) is invalid; the message
                names the variable or argument.
        """
        environ = os.environ if environ is None else environ
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise TypeError(
                f"unknown rabit_py setting(s) {', '.join(unknown)}; "
                f"valid ones are {', '.join(fields)}")
        values: dict = {}
        for name, field in fields.items():
            var = "RABIT_" + name.upper()
            if var in environ:
                try:
                    values[name] = _parse(field.type, environ[var])
                except ValueError as exc:
                    raise ValueError(f"{var}={environ[var]!r}: {exc}") from None
        for var in environ:
            if (var.startswith("RABIT_") and var[6:].lower() not in fields
                    and var not in _KNOWN_FOREIGN):
                warnings.warn(f"{var} is not a rabit_py setting and is ignored; "
                              f"known settings: {', '.join('RABIT_' + f.upper() for f in fields)}",
                              stacklevel=2)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def allowed_checkpoint_classes(self) -> Tuple[str, ...]:
        """``checkpoint_classes`` as a tuple of ``module.Name``."""
        return tuple(n.strip() for n in self.checkpoint_classes.split(",") if n.strip())

    def apply_logging(self) -> None:
        """Set the ``rabit_py`` logger's level from ``log_level``; below WARNING,
        give it a stderr handler if the program configured none."""
        logger = logging.getLogger("rabit_py")
        logger.setLevel(self.log_level.upper())
        if logger.level < logging.WARNING and not logger.handlers \
                and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("rabit_py %(levelname)s: %(message)s"))
            logger.addHandler(handler)


# Variables that rabit_py tools set for the program, not settings of the engine.
_KNOWN_FOREIGN: frozenset = frozenset()


def _parse(type_name: Any, text: str) -> Any:
    type_name = str(type_name)
    if type_name == "bool":
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError("expected 1/0, true/false, yes/no or on/off")
    if type_name == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError("expected an integer") from None
    if type_name == "float":
        try:
            return float(text)
        except ValueError:
            raise ValueError("expected a number of seconds") from None
    if type_name == "Optional[str]":
        return text or None
    return text


# Rabit's ``init(lib=...)`` libraries, as rabit_py engines.
RABIT_LIBS = {"standard": "auto", "base": "auto", "robust": "auto", "mpi": "auto",
              "empty": "auto", "mock": "mock"}


# Note [Rabit arguments]
# Rabit's ``init(args, lib)`` takes ``key=value`` strings (or bytes, as
# ``xgboost.rabit`` passed them), usually ``sys.argv``, and ignores what it
# does not know. The tracker's keys (``rabit_tracker_uri``, ``DMLC_*``...)
# have no use under MPI, which started the job; the ones with a meaning here
# become settings: ``mock=rank,version,seqno,trial`` (repeatable; Rabit's
# fault plan, used with ``lib='mock'``), ``rabit_timeout_sec`` /
# ``dmlc_timeout`` (the collective timeout), ``rabit_local_replica``
# (replicas of the local model), ``rabit_debug`` (the log level).
_RABIT_KEYS = {"rabit_timeout_sec": "timeout", "dmlc_timeout": "timeout",
               "rabit_local_replica": "replicas", "rabit_debug": "log_level"}


def from_rabit_args(args: Any = None, lib: str = "standard",
                    lib_dll: Any = None) -> "tuple[str, dict]":
    """Rabit's ``init(args, lib, lib_dll)`` as rabit_py's engine name and
    ``init`` settings (Note [Rabit arguments]).

    Args:
        args: ``key=value`` strings or bytes (``sys.argv`` is fine: words
            without ``=`` are skipped); None reads ``sys.argv``, as Rabit's
            documentation says (so ``init(lib='mock')`` finds the ``mock=``
            arguments of the command line).
        lib: Rabit's library: ``"standard"``, ``"base"``, ``"robust"``,
            ``"mpi"`` (the engine rabit-run picks) or ``"mock"`` (fault
            injection by the ``mock=`` entries).
        lib_dll: Rabit's own loaded library; there is none to load here, so
            it is ignored.

    Returns:
        ``(engine, settings)`` for :func:`rabit_py.init`.

    Raises:
        TypeError: ``args`` is not a list of strings or bytes.
        ValueError: an unknown ``lib``, or a value that is not a number.
    """
    del lib_dll
    if args is None:
        args = sys.argv     # Rabit's docstring: "Defaults to sys.argv when it is None"
    if lib not in RABIT_LIBS:
        raise ValueError(f"lib={lib!r} is not one of Rabit's libraries "
                         f"({', '.join(RABIT_LIBS)})")
    if isinstance(args, (str, bytes)) or (args is not None
                                          and not isinstance(args, (list, tuple))):
        raise TypeError(f"args={args!r}: Rabit's init takes a list of 'key=value' strings "
                        f"(e.g. sys.argv)")
    settings: dict = {}
    plan = []
    for arg in args or ():
        text = arg.decode() if isinstance(arg, bytes) else arg
        if not isinstance(text, str):
            raise TypeError(f"args: {arg!r} is not a 'key=value' string")
        key, sep, value = text.partition("=")
        if not sep:
            continue
        if key == "mock":
            plan.append(value)
        elif key in _RABIT_KEYS:
            name = _RABIT_KEYS[key]
            if name == "log_level":
                settings[name] = "DEBUG" if value.strip() not in ("", "0") else "WARNING"
            else:
                kind = "float" if name == "timeout" else "int"
                try:
                    settings[name] = _parse(kind, value)
                except ValueError as exc:
                    raise ValueError(f"{key}={value!r}: {exc}") from None
    engine = RABIT_LIBS[lib]
    if engine == "mock":
        settings["mock"] = ";".join(plan)
    return engine, settings


def launched_rank() -> int:
    """This process's rank in the launched job, from the launcher's
    variables (0 for a process started alone): known before MPI starts, for
    messages that one rank prints for all."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0
