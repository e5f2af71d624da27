"""The exceptions of rabit_py.

Every public error is a :class:`RabitError`. Messages say what happened, on which
rank, and what to do about it. Bad arguments are plain ``TypeError`` /
``ValueError`` raised before any communication, as Python users expect.

``PeerFailure`` is internal: the MPI layer raises it when a peer process died, and
only the robust engine's recovery loop catches it. The plain ``"mpi"`` engine turns
it into :class:`RecoveryError`, so user code never sees it.
"""

from __future__ import annotations

__all__ = [
    "RabitError",
    "NotInitializedError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "RecoveryError",
    "CheckpointError",
    "KVStoreError",
    "TrainingError",
    "UnsupportedCallError",
    "PeerFailure",
]


class RabitError(RuntimeError):
    """Base class of every error rabit_py raises on purpose.

    Raised directly when the engine is unusable, e.g. after a timeout revoked its
    communicator.

    Attributes:
        secondary: True where this rank's error only says that another rank
            ended the job (that rank reports the cause, to rabit-run too).
        every_rank: True where every rank raised this error with the same
            meaning (an agreement's outcome): left uncaught, one rank prints
            it for the job (Note [one failure, read once] in
            ``engine/_lifecycle.py``).
    """

    secondary: bool = False
    every_rank: bool = False


class NotInitializedError(RabitError):
    """A rabit_py call that needs a job was made before ``init()`` or after
    ``finalize()``.

    Not raised by ``init()`` itself, nor by ``is_distributed()``.
    """


class CollectiveMismatchError(RabitError):
    """Ranks called different collectives: another kind, op, dtype, shape, root,
    or a rank skipped a call.

    Raised on **every** rank by the signature check (``RABIT_CHECK``, on by
    default), naming the ranks and what differed. Not raised when the check is
    off: a mismatch then gives undefined results or a timeout.
    """


class CollectiveTimeoutError(RabitError):
    """A collective did not complete within the configured ``timeout``.

    Raised on the ranks that waited, naming the ranks that did not arrive when
    that can be known. The engine cannot be used afterwards (its communicator is
    revoked); finish the job and restart it. Not raised when ``timeout`` is 0.
    """


class RecoveryError(RabitError):
    """A peer failed and the job cannot recover in place: the engine has no
    fault tolerance (``"mpi"``), a needed result or model has no living copy,
    a repair did not complete within ``recovery_timeout``, or a rank keeps
    dying right after being replaced.

    Attributes:
        restartable: whether a restart from the durable checkpoint may help
            (the launcher, ``rabit-run --max-restarts``, then restarts the job).
            False for a rank that keeps dying right after being replaced
            (``crash_loop``): a bug in the program, which a restart repeats.
    """

    def __init__(self, message: str, restartable: bool = True) -> None:
        super().__init__(message)
        self.restartable = restartable


class UnsupportedCallError(RabitError, NotImplementedError):
    """A call that rabit_py's drop-ins (``rabit_py.mpi4py``) do not run,
    because it cannot be made fault tolerant (point-to-point messages,
    nonblocking calls, new communicators) or is not built. The message names
    the call, why, and what to use instead. Raised before any communication.
    """


class CheckpointError(RabitError):
    """A checkpoint is missing, truncated, corrupt, or cannot be serialized."""


class KVStoreError(RabitError, ValueError):
    """A :class:`rabit_py.kvstore.KVStore` was used wrongly: a key pulled or
    pushed before ``init``, initialized twice, a value of another shape or
    dtype than the key's, or the store used after one of its reductions failed.

    Every rank makes the same calls in a BSP job, so every rank raises it at
    the same call; nothing was sent.
    """


class TrainingError(RabitError):
    """Training inside a library that rabit_py drives (``rabit_py.xgboost``)
    failed on every rank for a reason that is not a lost peer: bad parameters
    or data, or the same error on every attempt. Raised on every rank, with
    the message of the lowest rank that failed, so that the job ends instead
    of retrying forever.

    Attributes:
        rank: the rank whose error is quoted; the other ranks' errors are
            ``secondary``.
    """

    def __init__(self, message: str, rank: int, secondary: bool = False) -> None:
        super().__init__(message)
        self.rank = rank
        self.secondary = secondary


class PeerFailure(Exception):
    """Internal: an MPI operation failed because a peer process died or the
    communicator was revoked after a failure.

    Deliberately not a :class:`RabitError`: only the robust engine catches it;
    it must never reach user code.

    Attributes:
        error_class: the MPI error class (``ERR_PROC_FAILED`` or ``ERR_REVOKED``).
    """

    def __init__(self, message: str, error_class: int) -> None:
        super().__init__(message)
        self.error_class = error_class
