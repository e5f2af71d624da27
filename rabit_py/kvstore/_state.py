"""What a KVStore writes and reads back: its checkpoint model (weights and
optimizer states) and optimizer-states files."""

from __future__ import annotations

import os
import pickle
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

from .._unpickle import NotData, load_data
from ..errors import KVStoreError

__all__ = ["model_of", "restore_model", "write_states", "read_states"]

_STATES_FORMAT = "rabit_py-optimizer-states/1"
_MODEL_FORMAT = "rabit_py-kvstore/1"


def model_of(store: Dict[Any, np.ndarray], states: Any) -> Dict[str, Any]:
    """The global model of ``KVStore.checkpoint``: the weights and the
    optimizer states (None without an optimizer)."""
    return {"format": _MODEL_FORMAT, "weights": dict(store), "updater": states}


def restore_model(model: Any, version: int, rank: int,
                  updater: Optional[Any]) -> Dict[Any, np.ndarray]:
    """The weights of a checkpoint ``model`` (copies), with ``updater``'s
    states set from it.

    Raises:
        KVStoreError: ``model`` was not written by ``KVStore.checkpoint``, or
            holds optimizer states but ``updater`` cannot take them.
    """
    if not isinstance(model, dict) or model.get("format") != _MODEL_FORMAT:
        raise KVStoreError(f"rank {rank}: checkpoint version {version} was not written by "
                           f"KVStore.checkpoint")
    if model["updater"] is not None:
        if updater is None or not hasattr(updater, "set_states"):
            raise KVStoreError(f"rank {rank}: checkpoint version {version} holds optimizer "
                               f"states: call set_optimizer before load_checkpoint")
        updater.set_states(model["updater"])
    return {k: np.array(v, copy=True) for k, v in model["weights"].items()}


def write_states(fname: str, states: Any) -> None:
    """Write optimizer ``states`` to ``fname`` atomically (a temporary file,
    fsync, rename).

    Raises:
        OSError: the file cannot be written.
    """
    tmp = f"{fname}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump({"format": _STATES_FORMAT, "states": states}, f,
                    protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, fname)


def read_states(fname: str, allowed: Iterable[str] = (), trust: bool = False) -> Tuple[str, Any]:
    """``("ok", states)`` read from a file of :func:`write_states`, or
    ``("error", reason)`` (to broadcast: every rank raises the same). The
    file is loaded as data (Note [checkpoints are data] in
    ``rabit_py/_unpickle.py``): ``allowed`` classes beyond it, or anything
    with ``trust``."""
    try:
        with open(fname, "rb") as f:
            blob = f.read()
        saved = pickle.loads(blob) if trust else load_data(blob, allowed)
        if not isinstance(saved, dict) or saved.get("format") != _STATES_FORMAT:
            raise ValueError("not a rabit_py optimizer states file")
        return "ok", saved["states"]
    except NotData as exc:
        return "error", f"the file {exc.advice()}"
    except (OSError, ValueError, EOFError, pickle.UnpicklingError, KeyError) as exc:
        return "error", f"{type(exc).__name__}: {exc}"
