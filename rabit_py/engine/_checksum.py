"""CRC-32C, the checksum of control messages, broadcast payloads and
checkpoint files, from the ``crc32c`` package's C extension.

# Note [checksum import]
The package's ``__init__`` imports ``importlib.metadata`` to learn its own
version: 16-22 ms of every rank's start on the development VM (``python -X
importtime``), and of every replacement's, on the path from a kill to the
job's progress. The C function is all rabit_py uses, so its extension module
is loaded from the package's folder directly; anything unexpected (another
layout, a pure-Python build) falls back to the plain import.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from typing import Callable

__all__ = ["crc32c"]


def _load() -> Callable[[bytes], int]:
    spec = importlib.util.find_spec("crc32c")       # finds the package without running it
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_crc32c" + suffix)
            if not os.path.isfile(path):
                continue
            try:
                loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
                module = importlib.util.module_from_spec(
                    importlib.util.spec_from_loader("crc32c._crc32c", loader))
                loader.exec_module(module)
                return module.crc32c
            except (ImportError, AttributeError):
                break
    from crc32c import crc32c as plain
    return plain


crc32c: Callable[[bytes], int] = _load()
