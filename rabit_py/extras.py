"""Optional dependencies: check them before the work starts, with a message
that names the extra to install.

A benchmark that runs for minutes and then fails to import matplotlib for its
plot loses the user's time; so does a CLI that dies on its first import.
Scripts and CLIs call :func:`require` first thing for what they will need.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from .config import launched_rank

__all__ = ["require", "missing"]


def missing(module: str) -> bool:
    """Whether ``module`` cannot be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def require(module: str, extra: str, purpose: Optional[str] = None) -> None:
    """Raise ``SystemExit`` with a message naming the extra to install if
    ``module`` is not installed.

    Args:
        module: the import name (e.g. ``"matplotlib"``).
        extra: the rabit_py extra that installs it (e.g. ``"bench"``).
        purpose: what needs it (e.g. ``"--plot"``), for the message.

    Raises:
        SystemExit: the module is missing.
    """
    if missing(module):
        if launched_rank() != 0:
            raise SystemExit(2)         # every rank stops; rank 0 says why, once
        what = f"{purpose} needs {module}" if purpose else f"this needs {module}"
        raise SystemExit(f"{what}, which is not installed: pip install -e \".[{extra}]\" "
                         f"from a checkout (or pip install \"rabit_py[{extra}]\")")
