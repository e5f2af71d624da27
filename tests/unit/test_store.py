"""The durable checkpoint store, without MPI: two "ranks" share one folder."""

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rabit_py.engine._store import DurableStore, read_file, write_file
from rabit_py.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


def stores(folder, world=2, keep=2):
    return [DurableStore(str(folder), r, world, keep) for r in range(world)]


def save_versions(ranks, versions, with_local=True):
    for v in versions:
        for s in ranks:
            local = f"local {s.rank} v{v}".encode() if with_local else None
            s.save(v, f"global v{v}".encode() if s.rank == 0 else None, local, with_local)
        for s in ranks:
            s.flush()
        # The leader prunes after its own write, maybe before the other ranks'
        # files of the version are there; once all are, as at its next write:
        for s in ranks:
            if s.rank == 0:
                s.prune()


def test_versions_round_trip_and_old_ones_are_pruned(tmp_path):
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2, 3])
    assert ranks[0].versions() == [2, 3]              # keep=2
    for s in ranks:
        assert s.newest_loadable() == 3
        assert s.load(3) == (b"global v3", f"local {s.rank} v3".encode())
    assert sorted(os.listdir(tmp_path)) == [
        ".recycle", "v00000002.MANIFEST.f2.w2.local", "v00000002.global.ckpt",
        "v00000002.local-0.ckpt", "v00000002.local-1.ckpt", "v00000003.MANIFEST.f2.w2.local",
        "v00000003.global.ckpt", "v00000003.local-0.ckpt", "v00000003.local-1.ckpt"]


def test_pruned_files_are_recycled_by_later_versions(tmp_path):
    ranks = stores(tmp_path)
    for v in range(1, 8):
        # Payload sizes change from version to version: a recycled file that
        # was longer must end up exactly as long as the new payload.
        for s in ranks:
            s.save(v, (b"G%d" % v) * (40 - 5 * v) if s.rank == 0 else None,
                   (b"L%d-%d" % (s.rank, v)) * (3 + v % 3), True)
        for s in ranks:
            s.flush()
    ranks[0].prune()                    # as save_versions does
    assert ranks[0].versions() == [6, 7]
    recycled = sorted(os.listdir(tmp_path / ".recycle"))
    assert recycled == ["global.ckpt", "local-0.ckpt", "local-1.ckpt"]
    # The next version's files are the recycled ones (the same inodes: never
    # deleted, so no inode number was freed and handed out again).
    for s in ranks:
        assert s.newest_loadable() == 7
        assert s.load(7) == ((b"G7" * 5), (b"L%d-7" % s.rank) * 4)
        assert s.load(6) == ((b"G6" * 10), (b"L%d-6" % s.rank) * 3)
    waiting = {n: os.stat(tmp_path / ".recycle" / n).st_ino for n in recycled}
    save_versions(ranks, [8])
    assert {n: os.stat(tmp_path / f"v00000008.{n}").st_ino for n in recycled} == waiting
    for s in ranks:
        assert s.load(8) == (b"global v8", f"local {s.rank} v8".encode())


def test_write_file_without_a_recycled_file_creates_one(tmp_path):
    write_file(str(tmp_path / "a.ckpt"), b"abc", 1, 3, recycled=str(tmp_path / "none"))
    assert read_file(str(tmp_path / "a.ckpt"), 3) == (b"abc", 1)


def test_no_version_is_pruned_under_a_rank_still_writing(tmp_path):
    leader, slow = stores(tmp_path)
    save_versions([leader], [1, 2, 3, 4])         # rank 1 has written nothing yet
    assert leader.versions() == [1, 2, 3, 4]      # none complete without local-1
    save_versions([slow], [1, 2, 3, 4])           # the slow rank catches up, in order
    leader.prune()
    assert leader.versions() == [3, 4]
    assert slow.newest_loadable() == 4 and slow.load(4)[1] == b"local 1 v4"
    # Without local models only the leader writes: nothing for a slow rank to race.
    other = tmp_path / "global-only"
    leader, slow = stores(other)
    save_versions([slow], [1, 2], with_local=False)
    assert not other.exists() or leader.versions() == []
    save_versions([leader], [1, 2, 3], with_local=False)
    assert leader.versions() == [2, 3] and slow.newest_loadable() == 3


def test_a_corrupt_global_file_falls_back_with_a_warning(tmp_path, caplog):
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2])
    path = tmp_path / "v00000002.global.ckpt"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING, logger="rabit_py"):
        assert ranks[1].newest_loadable() == 1
    assert f"{path}: corrupt (checksum mismatch)" in caplog.text
    with pytest.raises(CheckpointError, match="corrupt"):
        ranks[1].load(2)


def test_a_truncated_local_file_makes_only_its_rank_fall_back(tmp_path):
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2])
    path = tmp_path / "v00000002.local-1.ckpt"
    path.write_bytes(path.read_bytes()[:-3])
    assert ranks[0].newest_loadable() == 2
    assert ranks[1].newest_loadable() == 1          # the engine agrees on the minimum
    with pytest.raises(CheckpointError, match=r"local-1.ckpt: truncated \(payload"):
        read_file(str(path), 2)


def test_foreign_and_misplaced_files_are_recognized(tmp_path):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint at all, just bytes")
    with pytest.raises(CheckpointError, match="not a rabit_py checkpoint file"):
        read_file(str(junk), 1)
    write_file(str(tmp_path / "a.ckpt"), b"x", 2, 5)
    with pytest.raises(CheckpointError, match="holds version 5, expected 6"):
        read_file(str(tmp_path / "a.ckpt"), 6)
    (tmp_path / "short.ckpt").write_bytes(b"RABIT")
    with pytest.raises(CheckpointError, match="shorter than its header"):
        read_file(str(tmp_path / "short.ckpt"), 1)


def test_a_crash_before_the_rename_leaves_the_previous_version(tmp_path):
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2])
    # Version 3 died while writing: only temporary files, no manifest.
    stale = tmp_path / "v00000003.global.ckpt.tmp-4242"
    stale.write_bytes(b"half")
    assert ranks[0].versions() == [1, 2, 3]
    assert ranks[0].newest_loadable() == 2
    assert ranks[0].load(2)[0] == b"global v2"
    # The restarted job writes version 3 again; the crashed writer's temporary
    # file goes when version 3 is pruned.
    save_versions(ranks, [3, 4, 5])
    assert ranks[0].newest_loadable() == 5 and not stale.exists()
    assert ranks[0].versions() == [4, 5]


def test_world_size_change_refused_with_local_models_allowed_without(tmp_path):
    save_versions(stores(tmp_path / "a"), [1])
    bigger = DurableStore(str(tmp_path / "a"), 0, 4)
    assert bigger.newest_loadable() == 1
    with pytest.raises(CheckpointError, match="written by 2 ranks with local models; this job "
                                              "has 4 ranks"):
        bigger.load(1)
    save_versions(stores(tmp_path / "b"), [1], with_local=False)
    assert DurableStore(str(tmp_path / "b"), 3, 4).load(1) == (b"global v1", None)


def test_no_loadable_version_is_an_error_not_a_fresh_start(tmp_path):
    ranks = stores(tmp_path, keep=1)
    save_versions(ranks, [1])
    (tmp_path / "v00000001.global.ckpt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"no version in .* can be loaded \(found \[1\]; "
                                              r"unreadable: \[1\]\)"):
        ranks[0].newest_loadable()
    assert DurableStore(str(tmp_path / "empty"), 0, 2).newest_loadable() == 0


def test_versions_never_finished_mean_a_fresh_start(tmp_path, caplog):
    # Rank 1 killed while its writer was still behind (under load): neither
    # version has its local file; version 2 lacks the manifest
    # too (the leader's writer was behind as well).
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2])
    os.unlink(tmp_path / "v00000001.local-1.ckpt")
    os.replace(tmp_path / "v00000002.local-1.ckpt", tmp_path / "v00000002.local-1.ckpt.tmp-9")
    os.unlink(tmp_path / "v00000002.MANIFEST.f2.w2.local")
    assert ranks[0].newest_loadable() == 1          # its own files are all there
    with caplog.at_level(logging.WARNING, logger="rabit_py"):
        assert ranks[1].newest_loadable() == 0      # the engine agrees on the minimum
    assert "v00000001.local-1.ckpt: missing: the version was not finished" in caplog.text
    assert "no version in" in caplog.text and "starting from the beginning" in caplog.text


def test_a_bad_file_is_an_error_even_beside_unfinished_versions(tmp_path):
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2])
    os.unlink(tmp_path / "v00000002.local-1.ckpt")
    (tmp_path / "v00000001.local-1.ckpt").write_bytes(b"RABITCKP garbage")
    with pytest.raises(CheckpointError, match=r"unreadable: \[1\]"):
        ranks[1].newest_loadable()


def test_pruning_ignores_newer_leftovers_of_an_earlier_attempt(tmp_path):
    # An attempt wrote versions 1-4 (3 and 4 are left); the next one resumed
    # from version 1 (say) and writes 2 again. Versions 3 and 4 (complete)
    # must not make the leader prune version 2 while rank 1 still writes it.
    save_versions(stores(tmp_path), [1, 2, 3, 4])
    ranks = stores(tmp_path)                        # the next attempt
    ranks[0].save(2, b"global v2", b"local 0 v2", True)
    ranks[0].flush()
    assert "v00000002.global.ckpt" in os.listdir(tmp_path)
    ranks[1].save(2, None, b"local 1 v2", True)
    ranks[1].flush()
    assert ranks[1].load(2) == (b"global v2", b"local 1 v2")


def test_a_failed_write_ends_a_strict_job_at_the_next_call(tmp_path):
    store = DurableStore(str(tmp_path), 0, 1, strict=True)
    # A folder where the writer's temporary file should be: the open fails.
    (tmp_path / f"v00000001.global.ckpt.tmp-{os.getpid()}").mkdir()
    store.save(1, b"g", None, False)
    with pytest.raises(CheckpointError, match="rank 0: writing a durable checkpoint failed"):
        store.flush()
    store.close()


def test_a_failed_write_is_said_once_and_skipped_and_later_versions_are_written(
        tmp_path, caplog):
    # Note [failed writes]: the default.
    store = DurableStore(str(tmp_path), 0, 1)
    store.save(1, b"g1", None, False)
    store.flush()
    blockers = [tmp_path / f"v0000000{v}.global.ckpt.tmp-{os.getpid()}" for v in (2, 3)]
    for blocker in blockers:
        blocker.mkdir()
    with caplog.at_level(logging.WARNING, logger="rabit_py"):
        for v in (2, 3):
            store.save(v, f"g{v}".encode(), None, False)
            store.flush()                       # no error: the job goes on
        assert store.failed_versions == [2, 3]
        assert store.newest_loadable() == 1 and store.load(1) == (b"g1", None)
        said = [r.getMessage() for r in caplog.records
                if "writing durable checkpoint" in r.getMessage()]
        assert len(said) == 1, said             # once for this kind of failure
        assert "writing durable checkpoint version 2" in said[0]
        assert "versions before it stay loadable" in said[0]
        assert "RABIT_STRICT_CHECKPOINTS=1" in said[0]
        for blocker in blockers:
            blocker.rmdir()                     # the space came back
        store.save(4, b"g4", None, False)
        store.flush()
    assert store.newest_loadable() == 4 and store.load(4) == (b"g4", None)
    assert any("written to" in r.getMessage() and "again, from version 4" in r.getMessage()
               for r in caplog.records)
    store.close()


FILL_DISK = """
import logging, os, sys
from rabit_py.engine._store import DurableStore
logging.basicConfig(level=logging.WARNING, format="%(message)s")
folder = sys.argv[1]
store = DurableStore(os.path.join(folder, "ckpt"), 0, 1)
version = 0
while not store.failed_versions and version < 100:     # growing versions, 256 KiB disk
    version += 1
    payload = os.urandom((20 + 8 * version) << 10)      # (a recycled file of the same
                                                        # size would need no new room)
    filler = os.path.join(folder, f"filler-{version}")
    try:
        with open(filler, "wb") as f:                   # the disk fills up beside us
            f.write(os.urandom(30 << 10))
    except OSError:
        pass
    store.save(version, payload + bytes([version]), None, False)
    store.flush()
print("FAILED", store.failed_versions, "LOADABLE", store.newest_loadable(), flush=True)
loadable = store.newest_loadable()
blob = store.load(loadable)[0]
assert len(blob) == ((20 + 8 * loadable) << 10) + 1 and blob[-1] == loadable
for name in os.listdir(folder):                         # space returns
    if name.startswith("filler-"):
        os.unlink(os.path.join(folder, name))
payload = os.urandom(20 << 10)
store.save(version + 1, payload + bytes([version + 1]), None, False)
store.flush()
print("AFTER", store.newest_loadable(), flush=True)
assert store.load(version + 1)[0] == payload + bytes([version + 1])
store.close()
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="mounts a small tmpfs: needs root and unshare")
def test_a_filesystem_that_fills_up_loses_no_complete_version(tmp_path):
    # A real full disk: a 256 KiB tmpfs in a mount namespace of the test's own.
    script = tmp_path / "fill.py"
    script.write_text(FILL_DISK)
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size=256k none {disk} && {sys.executable} {script} {disk}"],
        capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    failed = re.search(r"FAILED \[(\d+)\] LOADABLE (\d+)", out)
    assert failed and int(failed.group(2)) == int(failed.group(1)) - 1, out
    assert "No space left on device" in out and out.count("failed (") == 1, out
    assert re.search(r"AFTER (\d+)", out) and "again, from version" in out, out
    assert os.listdir(disk) == []               # the mount went with its namespace


def test_a_version_written_again_gets_one_new_manifest(tmp_path):
    save_versions(stores(tmp_path), [1, 2], with_local=False)
    # A restarted job of 3 ranks (a global-only checkpoint may change size)
    # writes version 2 again: the old manifest goes, the new one says 3 ranks.
    bigger = stores(tmp_path, world=3)
    save_versions(bigger, [2], with_local=False)
    assert sorted(n for n in os.listdir(tmp_path) if ".MANIFEST." in n) == [
        "v00000001.MANIFEST.f2.w2.global", "v00000002.MANIFEST.f2.w3.global"]
    assert bigger[2].newest_loadable() == 2 and bigger[2].load(2) == (b"global v2", None)


def test_a_manifest_of_another_format_is_skipped_with_the_reason(tmp_path, caplog):
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2])
    os.rename(tmp_path / "v00000002.MANIFEST.f2.w2.local",
              tmp_path / "v00000002.MANIFEST.f1.w2.local")
    with caplog.at_level(logging.WARNING, logger="rabit_py"):
        assert ranks[0].newest_loadable() == 1
    assert "v00000002.MANIFEST.f1.w2.local: checkpoint format 1, this rabit_py" in caplog.text


def test_a_resumed_job_rewriting_versions_is_not_pruned_by_a_failed_attempts_leftovers(tmp_path):
    # A failed attempt wrote versions 2..4; rank 1's file of version 4 is
    # missing, so the restarted ranks agree on 3 and write 4, 5 again. Without
    # discarding the leftovers first, the leader's pruning saw versions newer
    # than the ones being rewritten and removed files under a writing rank.
    ranks = stores(tmp_path)
    save_versions(ranks, [1, 2, 3, 4])
    os.unlink(tmp_path / "v00000004.local-1.ckpt")
    restarted = stores(tmp_path)
    agreed = min(s.newest_loadable() for s in restarted)
    assert agreed == 3
    restarted[0].discard_after(agreed)
    assert restarted[0].versions() == [3]
    assert not any(n.startswith("v00000004") for n in os.listdir(tmp_path))
    save_versions(restarted, [4, 5])
    for s in restarted:
        assert s.load(5) == (b"global v5", f"local {s.rank} v5".encode())
        s.close()


# ---------------------------------------------------------------- Note [private folder]
def test_the_folder_and_files_are_the_owners_only(tmp_path):
    folder = tmp_path / "made" / "ckpt"
    old = os.umask(0o002)                   # a user-private-groups umask
    try:
        ranks = stores(folder)
        save_versions(ranks, [1, 2])
    finally:
        os.umask(old)
        for s in ranks:
            s.close()
    assert os.stat(folder).st_mode & 0o777 == 0o700
    modes = {name: os.stat(folder / name).st_mode & 0o777 for name in os.listdir(folder)
             if not name.startswith(".")}
    assert modes and set(modes.values()) == {0o600}, modes


def private_group(folder) -> bool:
    import grp
    import pwd
    me = pwd.getpwuid(os.geteuid()).pw_name
    group = grp.getgrgid(os.stat(folder).st_gid)
    return group.gr_name == me and not (set(group.gr_mem) - {me})


@pytest.mark.parametrize("mode", [0o777, 0o703])
def test_a_folder_others_can_write_is_refused_unless_trusted(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    who = "its group and others" if mode & 0o020 and not private_group(folder) else "others"
    with pytest.raises(CheckpointError) as info:
        DurableStore(str(folder), 0, 1)
    message = str(info.value)
    assert f"the checkpoint folder {folder} can be written by {who} (mode {oct(mode)})" \
        in message, message
    assert f"chmod 700 {folder}" in message and "RABIT_TRUST_CHECKPOINTS=1" in message
    DurableStore(str(folder), 0, 1, trust=True).close()     # trusted: taken


def test_a_group_writable_folder_of_a_private_group_is_the_users(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    folder.chmod(0o770)
    if private_group(folder):
        DurableStore(str(folder), 0, 1).close()
        if os.geteuid() != 0:
            return
        import grp
        os.chown(folder, -1, grp.getgrnam("daemon").gr_gid)     # a group of others
    with pytest.raises(CheckpointError, match="can be written by its group \\(mode 0o770\\)"):
        DurableStore(str(folder), 0, 1)


def test_a_durable_version_is_unpickled_once_at_a_resume():
    # Note [checkpoints are data]: the check loads the models as data; the
    # first load_checkpoint hands out those objects instead of unpickling the
    # bytes again (a model of GBs was unpickled twice); later ones load fresh.
    import pickle

    import numpy as np

    from rabit_py.engine._versions import Checkpoints

    model, local = {"w": np.arange(5.0)}, [1, 2]
    blobs = (pickle.dumps(model), pickle.dumps(local))
    checkpoints = Checkpoints(None)
    checked = checkpoints._check_data(3, *blobs)
    checkpoints.commit(*blobs)
    checkpoints._checked = checked
    version, first, first_local = checkpoints.result(3, with_local=True)
    assert version == 3 and first is checked[1] and first_local is checked[2]
    version, again = checkpoints.result(3, with_local=False)
    assert again is not first and (again["w"] == model["w"]).all()
    # Trusted folders are not loaded by the check: nothing to hand out.
    assert Checkpoints(None, trust=True)._check_data(3, *blobs) is None
    # A new version drops what the check loaded.
    checkpoints._checked = checked
    checkpoints.commit(pickle.dumps("v4"), None)
    assert checkpoints.result(4, with_local=False) == (4, "v4")
