"""Telling device arrays from host arrays (no CuPy import: duck typing)."""

from __future__ import annotations

from typing import Any

__all__ = ["is_device_array", "to_host"]


def is_device_array(data: Any) -> bool:
    """Whether ``data`` is a CuPy array (checked without importing CuPy; on
    every collective call, so kept cheap)."""
    module = type(data).__module__
    return module.startswith("cupy") and (len(module) == 4 or module[4] == ".")


def to_host(data: Any) -> Any:
    """A device array's host copy (``.get()``); anything else as it is."""
    return data.get() if is_device_array(data) else data
