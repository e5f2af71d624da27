"""Which server holds which part of a key (Note [key partition] in
rabit_py/kvstore/_protocol.py), without MPI."""

import zlib

import pytest

from rabit_py.kvstore._protocol import partition


def test_small_keys_live_whole_on_one_server_that_every_worker_computes_alike():
    assert partition(7, 10, 3, 1000) == [(1, 0, 10)]
    assert partition(9, 10, 3, 1000) == [(0, 0, 10)]
    owner = zlib.crc32(b"weight") % 4
    assert partition("weight", 999, 4, 1000) == [(owner, 0, 999)]
    owners = {partition(f"layer{i}", 5, 4, 1000)[0][0] for i in range(40)}
    assert owners == {0, 1, 2, 3}                   # string keys spread over the servers


@pytest.mark.parametrize("size,servers", [(1000, 3), (1001, 4), (64, 2), (5000, 7)])
def test_large_keys_are_cut_into_one_contiguous_slice_per_server(size, servers):
    parts = partition("big", size, servers, 64)
    assert [p[0] for p in parts] == list(range(servers))
    assert parts[0][1] == 0 and parts[-1][2] == size
    for (_, _, end), (_, start, _) in zip(parts, parts[1:]):
        assert end == start
    lengths = [stop - start for _, start, stop in parts]
    assert max(lengths) - min(lengths) <= 1


def test_one_server_or_a_key_below_the_bound_is_not_cut():
    assert partition("big", 10 ** 6, 1, 64) == [(0, 0, 10 ** 6)]
    assert len(partition("big", 63, 4, 64)) == 1
    assert len(partition("big", 3, 4, 2)) == 1      # fewer elements than servers


def test_a_restarted_worker_resumes_at_the_oldest_part_and_skips_what_parts_hold():
    # Note [shard checkpoints]: key "small" restored on one server holding
    # this worker's pushes 1..49, key 7's two parts on two servers holding
    # 1..48 and 1..49. The worker resumes at step 48 for every key and sends
    # step 49's push (its 49th) only to the part that lacks it.
    import numpy as np
    from rabit_py.kvstore._remote import _Entry, resume_clock

    small = _Entry(np.zeros(5), partition("small", 5, 2, 64))
    big = _Entry(np.zeros(200), partition(7, 200, 2, 64))
    small.restored, big.restored = [49], [48, 49]
    assert resume_clock([small, big]) == 48
    small.pushes = big.pushes = 48
    assert small.holds(0) and not big.holds(0) and big.holds(1)
    small.pushes = big.pushes = 49
    assert not small.holds(0) and not big.holds(0) and not big.holds(1)
    fresh = _Entry(np.zeros(3), partition("x", 3, 2, 64))
    assert resume_clock([fresh]) == 0 and resume_clock([]) == 0 and not fresh.holds(0)


def test_a_snapshot_gives_a_new_server_the_parts_and_the_optimizer_state():
    # Note [replaced servers] in server.py: the handover carries values,
    # clocks and each key's optimizer state (Adam's moments, its step
    # count), so the new server's next step is the one the old would take.
    import pickle

    import numpy as np

    from rabit_py.kvstore.optimizer import Adam, get_updater
    from rabit_py.kvstore.server import _restore, _snapshot, _Store

    blob = pickle.dumps(get_updater(Adam(learning_rate=0.1)))
    old = _Store(staleness=2, workers=3, owner=1)
    old.updater, old.updater_blob = pickle.loads(blob), blob
    old.values[("w", 0)] = np.zeros(4, dtype=np.float32)
    old.clocks[("w", 0)] = np.array([5, 4, 5])
    for step in range(5):
        old.updater("w", np.full(4, step + 1.0, dtype=np.float32), old.values[("w", 0)])
    shard = pickle.loads(pickle.dumps(_snapshot(old)))     # as it travels
    new = _restore(shard, serving=True)
    assert (new.owner, new.staleness, new.workers, new.serving, new.replicated) == \
        (1, 2, 3, True, True)
    assert new.clocks[("w", 0)].tolist() == [5, 4, 5]
    assert _restore(shard, serving=False).replicated is False     # a copy keeps no copy
    new.updater = pickle.loads(new.updater_blob)
    new.updater.set_states(new.restored_states)
    grad = np.full(4, 0.5, dtype=np.float32)
    old.updater("w", grad, old.values[("w", 0)])
    new.updater("w", grad, new.values[("w", 0)])
    assert new.values[("w", 0)].tobytes() == old.values[("w", 0)].tobytes()
    assert new.values[("w", 0)] is not old.values[("w", 0)]


@pytest.mark.parametrize("world,local,one", [("4", "4", True), ("6", "3", False),
                                             (None, None, False), ("1", "1", True)])
def test_servers_are_replaced_by_new_processes_only_on_one_host(monkeypatch, world, local, one):
    # Note [servers on several hosts]: unknown counts as several.
    from rabit_py.kvstore.server import _on_one_host

    for name, value in (("OMPI_COMM_WORLD_SIZE", world), ("OMPI_COMM_WORLD_LOCAL_SIZE", local)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert _on_one_host() is one


@pytest.mark.parametrize("published,want", [({}, "first"), ({0: "first", 1: "p1"}, "p1"),
                                            ({0: "first", 1: "p1", 3: "p3"}, "p3"),
                                            ({1: "p1", 2: "p2"}, "p2")])
def test_a_replacement_worker_finds_the_newest_published_port(monkeypatch, published, want):
    # Note [the servers' port]: the newest generation, past missing ones (a
    # dead publisher's names may be dropped); the first port where none is.
    from mpi4py import MPI

    from rabit_py._servers import current_port, port_service

    names = {f"{port_service('first')}-{g}": port for g, port in published.items()}

    def lookup(name):
        if name not in names:
            raise MPI.Exception(MPI.ERR_NAME)
        return names[name]

    monkeypatch.setattr(MPI, "Lookup_name", lookup)
    assert current_port("first") == want
