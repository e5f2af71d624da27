"""The durable checkpoint store: versions on disk that a restarted job resumes from.

# Note [durable store]
All versions share one folder (no folder per version: a new folder costs a
mkdir, a second folder fsync and a removal per version, about a third of a
1 MiB version's cost here). Version 42 is

- ``v00000042.global.ckpt``: the global model, written by the leader (rank 0);
- ``v00000042.local-R.ckpt``: rank R's local model, written by rank R itself,
  in versions that use local models (only the leader writes a version that
  does not, so no rank lags behind in a version the leader may prune);
- ``v00000042.MANIFEST.f2.w4.local`` (or ``.global``): an empty file whose
  name says the format, the world size and whether local models are used,
  created by the leader after its global file. Empty, it has no data to
  flush: its creation is made durable by the folder fsync that the renames
  need anyway (a manifest with contents cost one more flush of the disk, a
  fifth of a 1 MiB version).

Every ``.ckpt`` file is written to a temporary name, fdatasync'ed, renamed,
and the folder fsync'ed, so a crash leaves either the old state or the whole
new file (the leader fsyncs the folder once per version, after creating the
manifest).
A ``.ckpt`` file starts with a header (magic, format, world size, version,
payload length, CRC-32C) so that a truncated, corrupt or foreign file is
recognized. A version is *complete* when the manifest and every file it lists
are there and valid; loading takes the newest complete version and falls back
to older ones (with a warning) past a bad file. No rank waits for another:
completeness is read from the files themselves, which also lets the writes run
on a background thread while training goes on. The leader removes versions
older than the newest ``keep`` complete ones.

# Note [recycled files]
Pruning moves a version's files to ``.recycle/`` instead of deleting them,
and the next write of the same name takes one back (an atomic rename to its
temporary name) and overwrites it. A new file needs a journal commit to make
its blocks and size durable, and the rename needs another; an overwritten
file of the same size needs only its data flushed, so a steady-state version
costs one commit (the folder's), like a raw write of the same bytes. The
folder holds at most one pruned version's files more. The temporary files of
a pruned version (a writer that crashed) are deleted.

# Note [unfinished versions]
A rank killed while its writer thread is behind (a loaded node: the queue
holds a version or two) leaves versions without its file, or without a
manifest if it was the leader. Such versions were never finished: they are
skipped, and if no version was finished the job starts from the beginning
(with a warning), as it would have with an empty folder. A file that is
there but cannot be read is different: the version was finished and then
damaged; if no older version can be loaded, loading fails rather than
silently dropping the work.

The folder is meant to be shared by all ranks (one path on a shared
filesystem); with per-node folders, local models are found only when each
rank restarts on the node where it wrote them.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import struct
import threading
from typing import BinaryIO, Callable, Dict, List, NamedTuple, Optional, Tuple

from ._checksum import crc32c

from .._version import __version__
from ..errors import CheckpointError

__all__ = ["DurableStore", "read_file", "write_file", "MAGIC"]

log = logging.getLogger("rabit_py")

MAGIC = b"RABITCKP"
# 2: CRC-32C (Castagnoli, hardware-computed: 1 MiB in 0.04 ms here, where
# zlib's CRC-32 of format 1 took 0.25-0.4 ms, a quarter of a 1 MiB version)
FORMAT = 2
# magic, format, world size, version, has payload, payload length, crc32c
_HEADER = struct.Struct("<8sIIQBQI")
# vNNNNNNNN.<name>; <name> is recyclable, or a temporary file (name.tmp-PID)
_VERSION_FILE = re.compile(r"^v(\d{8,})\.(.+)$")
_RECYCLABLE = re.compile(r"^(global|local-\d+)\.ckpt$")
_MANIFEST = re.compile(r"^MANIFEST\.f(\d+)\.w(\d+)\.(local|global)$")


class Manifest(NamedTuple):
    """What a version's manifest says (Note [durable store])."""
    format: int
    world_size: int
    uses_local: bool

    @property
    def name(self) -> str:
        kind = "local" if self.uses_local else "global"
        return f"MANIFEST.f{self.format}.w{self.world_size}.{kind}"
RECYCLE_DIR = ".recycle"


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _datasync(fd: int) -> None:
    # fdatasync makes the data (and the size) durable without flushing
    # timestamps: on a recycled file of the same size, no journal commit.
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _claim(recycled: str, tmp: str) -> bool:
    """Take the recycled file for ``tmp`` (atomically: several writers may
    race for it); False if there is none."""
    try:
        os.replace(recycled, tmp)
        return True
    except OSError:
        return False


def _write_atomic(path: str, write: Callable[[BinaryIO], int], recycled: Optional[str],
                  sync_folder: bool) -> None:
    """Write through a temporary name: ``write(f)`` returns the file's size;
    then fdatasync, rename, and (``sync_folder``) fsync of the folder."""
    tmp = f"{path}.tmp-{os.getpid()}"
    reused = recycled is not None and _claim(recycled, tmp)
    # New files are the owner's only (Note [private folder]); a recycled one
    # was made so.
    fd = os.open(tmp, os.O_RDWR if reused else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "r+b" if reused else "wb") as f:
            size = write(f)
            if reused and os.fstat(f.fileno()).st_size != size:
                f.truncate(size)
            f.flush()
            _datasync(f.fileno())
    except BaseException:
        # A full disk: what was written of it would only take more room.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.replace(tmp, path)
    if sync_folder:
        _fsync_dir(os.path.dirname(path) or ".")


def write_file(path: str, payload: Optional[bytes], world_size: int, version: int,
               recycled: Optional[str] = None, sync_folder: bool = True) -> None:
    """Write one checkpoint file atomically (temporary name, fdatasync,
    rename, fsync of the folder). ``payload`` None records "no model".

    Args:
        recycled: a file of a pruned version to overwrite instead of creating
            a new one (Note [recycled files]); used only if it exists.
        sync_folder: fsync the folder after the rename; False when the caller
            fsyncs it after renaming more files into it.
    """
    data = payload if payload is not None else b""
    header = _HEADER.pack(MAGIC, FORMAT, world_size, version, payload is not None, len(data),
                          crc32c(data))

    def write(f: BinaryIO) -> int:
        f.write(header)
        f.write(data)
        return _HEADER.size + len(data)

    _write_atomic(path, write, recycled, sync_folder)


def read_file(path: str, version: int) -> Tuple[Optional[bytes], int]:
    """(payload or None, world size) of a checkpoint file.

    Raises:
        CheckpointError: missing, truncated, corrupt (checksum), foreign, or of
            another version; the message names the path and the reason.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    if raw[:len(MAGIC)] != MAGIC[:len(raw)]:
        raise CheckpointError(f"{path}: not a rabit_py checkpoint file (bad magic)")
    if len(raw) < _HEADER.size:
        raise CheckpointError(f"{path}: truncated ({len(raw)} bytes, shorter than its header)")
    magic, fmt, world, file_version, has, length, crc = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise CheckpointError(f"{path}: not a rabit_py checkpoint file (bad magic)")
    if fmt != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {fmt}, this rabit_py "
                              f"({__version__}) reads format {FORMAT}")
    if file_version != version:
        raise CheckpointError(f"{path}: holds version {file_version}, expected {version}")
    data = raw[_HEADER.size:]
    if len(data) != length:
        raise CheckpointError(f"{path}: truncated (payload {len(data)} of {length} bytes)")
    if crc32c(data) != crc:
        raise CheckpointError(f"{path}: corrupt (checksum mismatch)")
    return (data if has else None), world


def folder_problem(folder: str, trust: bool = False) -> Optional[str]:
    """Why ``folder`` cannot hold checkpoints (it is a file, it cannot be
    created or written, or, unless ``trust``, other users can write it:
    Note [private folder]), or None. Creates nothing that stays: a missing
    folder is judged by its nearest existing parent, an existing one by
    writing and removing a probe file."""
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        return f"the checkpoint folder {folder} is a file, not a folder"
    if os.path.isdir(folder) and not trust:
        shared = shared_with_others(folder)
        if shared is not None:
            return (f"the checkpoint folder {folder} {shared}: whoever can write it can "
                    f"plant a version that every rank of a resumed job loads. Make it "
                    f"yours alone (chmod 700 {folder}), or, if you trust everyone who can "
                    f"write it, set RABIT_TRUST_CHECKPOINTS=1")
    if not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        while not os.path.exists(parent) and parent != os.path.dirname(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            return f"the checkpoint folder {folder} cannot be made: {parent} is a file"
        if not os.access(parent, os.W_OK | os.X_OK):
            return (f"the checkpoint folder {folder} cannot be made: {parent} is not "
                    f"writable by this user")
        return None
    probe = os.path.join(folder, f".rabit-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(probe, "wb") as f:
            f.write(b"x")
        os.unlink(probe)
    except OSError as exc:
        return (f"the checkpoint folder {folder} is not writable "
                f"({exc.strerror or exc})")
    return None


# Note [private folder]
# A checkpoint folder that other users can write is a place to plant a
# version that the next resumed job loads (Note [checkpoints are data] in
# rabit_py/_unpickle.py limits what loading it can do; this keeps them out).
# The store makes its folder with mode 0700 and its files 0600, and refuses,
# at the job's start (rabit-run before it starts anything), an existing
# folder that another user owns or that its group or others may write,
# unless the program trusts its checkpoints (RABIT_TRUST_CHECKPOINTS=1).
def shared_with_others(folder: str) -> Optional[str]:
    """How other users can write ``folder`` (``"is owned by uid 1001"``,
    ``"can be written by its group and others (mode 0o777)"``), or None."""
    st = os.stat(folder)
    if st.st_uid != os.geteuid():
        return f"is owned by another user (uid {st.st_uid})"
    who = []
    if st.st_mode & 0o020 and not _private_group(st.st_gid, st.st_uid):
        who.append("its group")
    if st.st_mode & 0o002:
        who.append("others")
    if who:
        return f"can be written by {' and '.join(who)} (mode {oct(st.st_mode & 0o7777)})"
    return None


def _private_group(gid: int, uid: int) -> bool:
    """Whether group ``gid`` is user ``uid``'s own (Debian's user private
    groups: the user's name, no other member), so that umask 002 folders
    are not taken for shared ones."""
    import grp
    import pwd
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    return group.gr_name == user.pw_name and not (set(group.gr_mem) - {user.pw_name})


class DurableStore:
    """Versions of the checkpoint on disk (Note [durable store]).

    Args:
        folder: the checkpoint folder (created if missing).
        rank, world_size: this process in the job.
        keep: complete versions to keep (older ones are removed by the leader).
        trust: take a folder that other users can write (Note [private folder]).
        strict: a failed write is raised at the next call (Note [failed
            writes]); by default it is said once per kind and skipped.
    """

    def __init__(self, folder: str, rank: int, world_size: int, keep: int = 2,
                 trust: bool = False, strict: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep} must be >= 1")
        self.folder = os.path.abspath(folder)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        problem = folder_problem(self.folder, trust)
        try:
            if problem is None and not os.path.isdir(self.folder):
                os.makedirs(self.folder, mode=0o700, exist_ok=True)
                _fsync_dir(os.path.dirname(self.folder))   # the new folder itself
                problem = folder_problem(self.folder, trust)
        except OSError as exc:
            problem = f"cannot create the checkpoint folder {self.folder}: {exc}"
        if problem is not None:
            # Found here, not at the first write: a job must not compute for
            # an hour and then find that it cannot save.
            raise CheckpointError(f"rank {rank}: {problem} (RABIT_CHECKPOINT_DIR, "
                                  f"rabit-run --checkpoint-dir)")
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._strict = strict
        self._failures_said: set = set()     # kinds of failed writes said already
        self._failing = False                # the last write failed
        #: versions whose write failed on this rank (Note [failed writes])
        self.failed_versions: List[int] = []
        self._thread = threading.Thread(target=self._run, name="rabit-checkpoint-writer",
                                        daemon=True)
        self._thread.start()
        self.write_seconds = 0.0            # time spent writing (for the benchmark)
        # Versions seen complete: they stay so until pruned (no need to read
        # their manifests again at every checkpoint).
        self._known_complete: set = set()
        self._have_bin = False              # .recycle/ made (by this process)
        self._newest_listed: Optional[int] = None   # newest version in the last listing

    # ------------------------------------------------------------ writing
    def path(self, version: int, name: str) -> str:
        """Where file ``name`` (``global.ckpt``, ``local-R.ckpt``, a
        manifest) of ``version`` lives."""
        return os.path.join(self.folder, f"v{version:08d}.{name}")

    def save(self, version: int, global_blob: Optional[bytes], local_blob: Optional[bytes],
             uses_local: bool) -> None:
        """Queue this rank's files of ``version`` for writing (the bytes are
        immutable, so no copy is needed); returns at once.

        Raises:
            CheckpointError: an earlier write failed (disk full, permissions...).
        """
        self._raise_pending()
        self._queue.put((version, global_blob, local_blob, uses_local))

    def flush(self) -> None:
        """Wait until every queued write is on disk.

        Raises:
            CheckpointError: a write failed.
        """
        self._queue.join()
        self._raise_pending()

    def close(self) -> None:
        """Finish the queued writes and stop the writer thread."""
        self._queue.put(None)
        self._thread.join()
        self._raise_pending()

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(f"rank {self.rank}: writing a durable checkpoint failed: "
                                  f"{error}") from error

    def _run(self) -> None:
        import time

        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                start = time.perf_counter()
                self._write(*item)
                self.write_seconds += time.perf_counter() - start
                if self._failing:
                    self._failing = False
                    log.warning("rank %d: durable checkpoints are written to %s again, from "
                                "version %d", self.rank, self.folder, item[0])
            except OSError as exc:
                if self._strict:
                    self._error = exc
                else:
                    self._failed(item[0], exc)      # type: ignore[index]
            except Exception as exc:  # noqa: BLE001 - reported on the caller's thread
                self._error = exc
            finally:
                self._queue.task_done()

    # Note [failed writes]
    # A version's write that fails (a full disk, a quota, an I/O error,
    # permission lost) leaves the versions before it as they were: every file
    # is written under a temporary name (removed on failure) and renamed, and
    # a version is complete only with its manifest, made last. So by default
    # the job goes on: its in-memory checkpoint still serves in-job recovery,
    # a restart resumes from the last complete version on disk, and the next
    # versions are tried again (said once when they succeed). Each kind of
    # failure (errno) is said once per rank. With ``strict`` the failure is
    # raised at the rank's next checkpoint instead, so that the job ends
    # rather than run on with its durable copy falling behind.
    def _failed(self, version: int, exc: OSError) -> None:
        self.failed_versions.append(version)
        self._failing = True
        kind = exc.errno if exc.errno is not None else type(exc).__name__
        if kind in self._failures_said:
            return
        self._failures_said.add(kind)
        log.warning("rank %d: writing durable checkpoint version %d to %s failed (%s); the "
                    "versions before it stay loadable, training goes on with the checkpoint "
                    "in memory, and later versions will be written again. Said once for "
                    "this kind of failure; RABIT_STRICT_CHECKPOINTS=1 ends the job instead",
                    self.rank, version, self.folder, exc.strerror or exc)

    def _write(self, version: int, global_blob: Optional[bytes], local_blob: Optional[bytes],
               uses_local: bool) -> None:
        if uses_local:
            name = f"local-{self.rank}.ckpt"
            # The leader fsyncs the folder once, after its manifest.
            write_file(self.path(version, name), local_blob, self.world_size, version,
                       recycled=self._recycled(name), sync_folder=self.rank != 0)
        if self.rank != 0:
            return
        # A version written again (after a restart) is incomplete until its
        # new manifest is there. Only this process makes manifests, one per
        # version, in order: none can exist above the newest version listed.
        if self._newest_listed is None or version <= self._newest_listed:
            for name in self._files().get(version, []):
                if _MANIFEST.match(name):
                    os.unlink(self.path(version, name))
        # Without local models only the leader writes: no other rank can be
        # left writing into a version that the leader has pruned already.
        write_file(self.path(version, "global.ckpt"), global_blob, self.world_size, version,
                   recycled=self._recycled("global.ckpt"), sync_folder=False)
        manifest = Manifest(FORMAT, self.world_size, uses_local)
        os.close(os.open(self.path(version, manifest.name),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        # One folder fsync makes the rename and the creation above durable
        # (the manifest's after the file's: a crash before it leaves the
        # version incomplete).
        _fsync_dir(self.folder)
        self.prune(upto=version)

    def _recycled(self, name: str) -> str:
        return os.path.join(self.folder, RECYCLE_DIR, name)

    def prune(self, upto: Optional[int] = None) -> None:
        """Remove versions older than the newest ``keep`` complete ones. With
        local models, complete means every rank's local file is there too: a
        rank writes its versions in order, so once it wrote a newer one it is
        done with the older ones, and none is removed under a slower rank.

        Args:
            upto: the version the leader just wrote; newer ones are leftovers
                of an earlier attempt and do not count (else the versions this
                job is writing again could be removed under their writers).
        """
        files = self._files()
        complete = [v for v in sorted(files) if (upto is None or v <= upto)
                    and self._complete(v, files[v])]
        if len(complete) < self.keep:
            return
        oldest_kept = complete[-self.keep]
        for v in sorted(files):
            if v < oldest_kept:
                self._known_complete.discard(v)
                self._recycle(v, files[v])

    def discard_after(self, version: int) -> None:
        """Remove the versions above ``version`` (the one the ranks agreed to
        resume from): a failed attempt's leftovers, which no rank could load
        (else the ranks would have agreed on them). Left there they made a
        complete-looking newer set, so pruning removed the files that the
        resumed job was writing again (a rank's rename then fails with
        ENOENT). Run by the leader before the ranks
        write again."""
        for v, names in self._files().items():
            if v > version:
                self._known_complete.discard(v)
                self._recycle(v, names)

    def _recycle(self, version: int, names: List[str]) -> None:
        """Keep a pruned version's files for the next writes (Note [recycled
        files]); the manifest goes first, so the version is incomplete before
        any of its files disappears. Temporary files left by a crash go too."""
        bin_dir = os.path.join(self.folder, RECYCLE_DIR)
        if not self._have_bin:
            try:
                os.makedirs(bin_dir, mode=0o700, exist_ok=True)
            except OSError:
                return
            self._have_bin = True
        for name in sorted(names, key=lambda n: not _MANIFEST.match(n)):
            try:
                if _RECYCLABLE.match(name):
                    os.replace(self.path(version, name), os.path.join(bin_dir, name))
                else:
                    os.unlink(self.path(version, name))
            except OSError:
                pass

    def _files(self) -> Dict[int, List[str]]:
        """Version number -> the names of its files (temporary ones too)."""
        try:
            entries = os.listdir(self.folder)
        except OSError:
            return {}
        files: Dict[int, List[str]] = {}
        for m in map(_VERSION_FILE.match, entries):
            if m:
                files.setdefault(int(m.group(1)), []).append(m.group(2))
        self._newest_listed = max(files, default=0)
        return files

    def _complete(self, version: int, names: List[str]) -> bool:
        """For pruning: the manifest, the global file and (with local models)
        every rank's local file present. Files are renamed into place only
        once written and synced, so presence is enough (reading every kept
        version back at each checkpoint would cost more than writing it);
        loading checks them fully, and falls back past a bad one."""
        if version in self._known_complete:
            return True
        try:
            manifest = self._manifest(version, names)
        except CheckpointError:
            return False
        needed = {"global.ckpt"} | ({f"local-{r}.ckpt" for r in range(manifest.world_size)}
                                    if manifest.uses_local else set())
        if not needed.issubset(names):
            return False
        self._known_complete.add(version)
        return True

    # ------------------------------------------------------------ reading
    def versions(self) -> List[int]:
        """Version numbers that have a file (complete or not), oldest first."""
        return sorted(self._files())

    def _manifest(self, version: int, names: Optional[List[str]] = None) -> Manifest:
        """The manifest of ``version`` (``names``: its files, if listed already).

        Raises:
            CheckpointError: none (the version was not finished), or of another
                format.
        """
        if names is None:
            names = self._files().get(version, [])
        found = [m for m in map(_MANIFEST.match, names) if m]
        if not found:
            raise CheckpointError(f"{self.path(version, 'MANIFEST.*')}: missing: the version "
                                  f"was not finished")
        m = found[0]
        manifest = Manifest(int(m.group(1)), int(m.group(2)), m.group(3) == "local")
        if manifest.format != FORMAT:
            raise CheckpointError(f"{self.path(version, m.group(0))}: checkpoint format "
                                  f"{manifest.format}, this rabit_py ({__version__}) reads "
                                  f"format {FORMAT}")
        return manifest

    def _problem(self, version: int, names: List[str]) -> Tuple[Optional[str], bool]:
        """Why this rank cannot load ``version`` (None if it can), and whether
        the reason is only that the version was never finished: its manifest,
        global file or this rank's local file is not there (a writer killed
        before its rename; Note [unfinished versions]). A file that is there
        but bad (truncated, corrupt, foreign) is not such a reason."""
        try:
            manifest = self._manifest(version, names)
        except CheckpointError as exc:
            return str(exc), not any(_MANIFEST.match(n) for n in names)
        needed = ["global.ckpt"]
        if manifest.uses_local and manifest.world_size == self.world_size:
            # A changed world size is refused with a clear error by load().
            needed.append(f"local-{self.rank}.ckpt")
        for name in needed:
            if name not in names:
                return (f"{self.path(version, name)}: missing: the version was not finished "
                        f"(its writer stopped first)"), True
        try:
            for name in needed:
                read_file(self.path(version, name), version)
        except CheckpointError as exc:
            return str(exc), False
        return None, False

    def newest_loadable(self) -> int:
        """The newest version this rank can load (0 if none), with a warning
        for each newer version skipped.

        Raises:
            CheckpointError: a version was finished but none can be loaded
                (bad files: truncated, corrupt, foreign); starting from the
                beginning would silently drop the work they hold.
        """
        files = self._files()
        bad = []
        for version in sorted(files, reverse=True):
            problem, unfinished = self._problem(version, files[version])
            if problem is None:
                return version
            if not unfinished:
                bad.append(version)
            log.warning("rank %d: durable checkpoint version %d is skipped: %s; trying an "
                        "older one", self.rank, version, problem)
        if bad:
            raise CheckpointError(f"rank {self.rank}: no version in {self.folder} can be loaded "
                                  f"(found {sorted(files)}; unreadable: {sorted(bad)}); see the "
                                  f"warnings above. Move the folder aside to start from the "
                                  f"beginning")
        if files:
            log.warning("rank %d: no version in %s was finished (found %s, each left by a "
                        "writer that stopped first); starting from the beginning", self.rank,
                        self.folder, sorted(files))
        return 0

    def load(self, version: int) -> Tuple[Optional[bytes], Optional[bytes]]:
        """(global blob, this rank's local blob) of ``version``.

        Raises:
            CheckpointError: a bad file, or the world size changed while local
                models are used (each rank's local model belongs to its rank).
        """
        manifest = self._manifest(version)
        global_blob, _ = read_file(self.path(version, "global.ckpt"), version)
        if manifest.uses_local and manifest.world_size != self.world_size:
            raise CheckpointError(
                f"rank {self.rank}: checkpoint version {version} in {self.folder} was written by "
                f"{manifest.world_size} ranks with local models; this job has "
                f"{self.world_size} ranks. Local models belong to their ranks: restart with "
                f"{manifest.world_size} ranks (a global-only checkpoint may change size)")
        local_blob = None
        if manifest.uses_local:
            local_blob, _ = read_file(self.path(version, f"local-{self.rank}.ckpt"), version)
        return global_blob, local_blob
