"""Updaters that the servers of tests/programs/kv_servers.py load by name
(an updater must be importable where it runs)."""


def scaled_add(key, grad, weight):
    """weight += 2 * grad."""
    weight += 2 * grad


def broken(key, grad, weight):
    """Raises: the servers report it to the pulls."""
    raise ZeroDivisionError(f"updater bug on key {key!r}")

