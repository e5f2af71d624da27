"""This rank's committed checkpoint and the durable store behind it.

The engine numbers versions (a checkpoint ends one); this holds what the last
one committed -- the global model as bytes, or as the object of a
``lazy_checkpoint`` (serialized only if a replacement needs it), and this
rank's local model as bytes -- and writes versions to, and adopts them from,
the durable store (Note [durable store] in ``_store.py``).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Tuple

from ._mpistart import MPI

from ._checkpoint import deserialize, serialize
from .._unpickle import NotData, load_data
from ._store import DurableStore
from ..errors import CheckpointError
from . import _control as control
from ._lifecycle import mark_every_rank
from .base import CheckpointResult

__all__ = ["Checkpoints", "NO_LAZY"]

log = logging.getLogger("rabit_py")

NO_LAZY = object()      # the global model is not a lazy checkpoint's object


class Checkpoints:
    """The models of the last committed version on this rank.

    Args:
        store: the durable store (``RABIT_CHECKPOINT_DIR``), or None.
        allowed: classes its files may hold beyond data (``module.Name``).
        trust: load its files as any pickle (Note [checkpoints are data]).
    """

    def __init__(self, store: Optional[DurableStore], allowed: Tuple[str, ...] = (),
                 trust: bool = False) -> None:
        self.store = store
        self._allowed = allowed
        self._trust = trust
        self.global_blob: Optional[bytes] = None
        self.local_blob: Optional[bytes] = None
        self.lazy_global: Any = NO_LAZY
        # A durable version's models as its check loaded them: (version,
        # global, local), handed out once instead of loading them again.
        self._checked: Optional[Tuple[int, Any, Any]] = None

    def commit(self, global_blob: Optional[bytes], local_blob: Optional[bytes],
               lazy: Any = NO_LAZY) -> None:
        """A new version's models: bytes, or ``lazy`` (the object itself)."""
        self.global_blob, self.local_blob, self.lazy_global = global_blob, local_blob, lazy
        self._checked = None

    def save(self, version: int, global_blob: Optional[bytes],
             local_blob: Optional[bytes]) -> None:
        """Queue ``version`` for the disk, if there is a store."""
        if self.store is not None:
            self.store.save(version, global_blob, local_blob, local_blob is not None)

    def global_bytes(self) -> Optional[bytes]:
        """The global model as bytes (a lazy one is serialized now)."""
        if self.lazy_global is not NO_LAZY:
            return serialize(self.lazy_global, "global model")
        return self.global_blob

    def result(self, version: int, with_local: bool) -> CheckpointResult:
        """``version`` and its models, as ``load_checkpoint`` returns them."""
        if version == 0:
            return (0, None, None) if with_local else (0, None)
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] == version:
            # Loaded once by the check (a fresh object, as deserialize gives).
            _, global_model, local_model = checked
        else:
            global_model = local_model = NO_LAZY
        if self.lazy_global is not NO_LAZY:
            global_model = self.lazy_global
        elif global_model is NO_LAZY:
            global_model = deserialize(self.global_blob, "global model")  # type: ignore[arg-type]
        if not with_local:
            return version, global_model
        if local_model is NO_LAZY:
            local_model = (None if self.local_blob is None
                           else deserialize(self.local_blob, "local model"))
        return version, global_model, local_model

    def load_durable(self, comm: Any, rank: int, version: int) -> int:
        """On a fresh start (``version`` 0) with a store: adopt the newest
        version on disk that every rank can load (collective on ``comm``).
        Returns the version now committed.

        Raises:
            CheckpointError: on every rank, when a rank cannot read the store.
        """
        if self.store is None or version != 0:
            return version
        problem: Optional[str] = None
        mine = 0
        try:
            mine = self.store.newest_loadable()
        except CheckpointError as exc:
            problem = str(exc)
        # Agree: the oldest of the ranks' newest versions; -1 if a rank failed.
        agreed = control.reduce_int(comm, -1 if problem else mine, MPI.MIN)
        if agreed >= 0 and rank == 0:
            # Before anyone writes again: a newer set would make pruning remove
            # the files of the versions this job now writes again.
            self.store.discard_after(agreed)
        if agreed < 0:
            failed = control.allgather(comm, problem, "durable.problems")
            raise mark_every_rank(CheckpointError("; ".join(p for p in failed if p)))
        if agreed == 0:
            return version
        blobs: Tuple[Optional[bytes], Optional[bytes]] = (None, None)
        checked: Optional[Tuple[int, Any, Any]] = None
        try:
            blobs = self.store.load(agreed)
            checked = self._check_data(agreed, *blobs)
        except CheckpointError as exc:
            problem = str(exc)
        failed = control.allgather(comm, problem, "durable.problems")
        if any(failed):
            # The global model's problem is every rank's: said once.
            said = list(dict.fromkeys(p for p in failed if p))
            raise mark_every_rank(CheckpointError("; ".join(said)))
        self.commit(*blobs)
        self._checked = checked
        log.warning("rank %d: resumed from durable checkpoint version %d in %s", rank,
                    agreed, self.store.folder)
        return agreed

    def _check_data(self, version: int, global_blob: Optional[bytes],
                    local_blob: Optional[bytes]) -> Optional[Tuple[int, Any, Any]]:
        """Note [checkpoints are data] in ``rabit_py/_unpickle.py``: the
        models of ``version``, read from the folder, are loaded as data
        before they are taken. Returns ``(version, global, local)`` as
        loaded (``load_checkpoint`` hands them out instead of loading the
        bytes again), or None where the folder is trusted (not loaded here).

        Raises:
            CheckpointError: a model names something else, or is corrupt.
        """
        if self._trust:
            return None
        loaded = []
        for what, blob in (("global model", global_blob), ("local model", local_blob)):
            if blob is None:
                loaded.append(None)
                continue
            try:
                loaded.append(load_data(blob, self._allowed))
            except NotData as exc:
                raise CheckpointError(
                    f"the {what} of checkpoint version {version} in {self.store.folder} "  # type: ignore[union-attr]
                    f"{exc.advice()}") from None
            except Exception as exc:
                raise CheckpointError(
                    f"the {what} of checkpoint version {version} in {self.store.folder} "  # type: ignore[union-attr]
                    f"cannot be read back: {type(exc).__name__}: {exc}") from None
        return version, loaded[0], loaded[1]
