"""Note [tracker address]: the address rank 0's XGBoost tracker listens on
when the job spans hosts -- the one its host name resolves to, only if it is
this host's own and not loopback."""

import socket

import pytest

pytest.importorskip("xgboost")

from rabit_py.xgboost import _session  # noqa: E402


def test_a_name_that_resolves_to_loopback_gives_no_address(monkeypatch):
    # Debian maps a machine's name to 127.0.1.1: not an address other hosts reach.
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")
    assert _session.host_address() is None


def test_a_name_that_does_not_resolve_gives_no_address(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "no-such-host.invalid")
    assert _session.host_address() is None


def test_an_address_of_another_machine_is_not_taken(monkeypatch):
    # A stale name entry: the name resolves to an address this host does not have.
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.7", 0))])
    assert _session.host_address() is None


def test_an_own_non_loopback_address_is_taken(monkeypatch):
    # Any address this host can bind stands in for its own interface address;
    # 127.0.0.1 is loopback and skipped, the next entry taken.
    own = [socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [tuple(own), tuple(
        own[:4] + [("10.255.255.254", 0)])])
    bound = []

    class Probe:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            bound.append(address[0])

    monkeypatch.setattr(socket, "socket", Probe)
    assert _session.host_address() == "10.255.255.254"
    assert bound == ["10.255.255.254"]
