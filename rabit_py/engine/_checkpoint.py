"""Serialization of checkpointed models.

DESIGN.md calls this module ``rabit_py/checkpoint.py``; it is underscored
because a submodule named ``checkpoint`` would replace the public function
``rabit_py.checkpoint`` as soon as it is imported.

Models are pickled (protocol 5, so NumPy arrays travel without extra copies).
Ring replication of local models and the durable on-disk store build on these
helpers in the robust engine and the launcher.
"""

from __future__ import annotations

import pickle
from typing import Any

from ..errors import CheckpointError

__all__ = ["serialize", "deserialize"]


def serialize(model: Any, what: str = "model") -> bytes:
    """Pickle ``model``.

    Args:
        model: any picklable object.
        what: how to name the model in an error ("global model", ...).

    Raises:
        CheckpointError: the model cannot be pickled (the message says why).
    """
    try:
        return pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # pickle raises many types (TypeError, AttributeError, ...)
        raise CheckpointError(
            f"the {what} ({type(model).__name__}) cannot be pickled for the checkpoint: "
            f"{type(exc).__name__}: {exc}. Checkpoint plain data (NumPy arrays, dicts, "
            f"lists) or define __getstate__") from exc


def deserialize(blob: bytes, what: str = "model") -> Any:
    """Unpickle a model made by :func:`serialize`.

    Raises:
        CheckpointError: the bytes are not a valid pickle (truncated or corrupt).
    """
    try:
        return pickle.loads(blob)
    except Exception as exc:
        raise CheckpointError(f"the {what} of the checkpoint cannot be read back: "
                              f"{type(exc).__name__}: {exc}") from exc
