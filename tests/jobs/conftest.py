"""Whole jobs: each test starts real ranks (``rabit-run``/``mpirun``), kills
or freezes them from outside, and compares results bitwise; marked ``jobs``
(``-m "not jobs"`` leaves them out). Minutes, where ``tests/unit`` takes one."""

from typing import Any, List

import pytest


def pytest_collection_modifyitems(items: List[Any]) -> None:
    for item in items:
        if "/tests/jobs/" in str(item.fspath):
            item.add_marker(pytest.mark.jobs)
