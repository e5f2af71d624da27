"""The result cache of the robust engine.

# Note [result cache]
Every rank keeps a copy of the result of every collective since the last
checkpoint, keyed by ``(epoch, seqno)``, so that a replacement can replay its
calls from any survivor: one survivor is enough, so any number of simultaneous
failures is covered. Epoch ``BOOT`` holds the calls made before the first
``load_checkpoint``/``checkpoint`` (Rabit's bootstrap cache, e.g. a config
broadcast at start-up); it is kept for the whole job. Other epochs are dropped
when the next checkpoint commits.

With ``result_copies`` = k >= 2 the results are spread instead, as Rabit
does: result #s is kept by ranks s..s+k-1 (modulo the world size) and every
rank keeps its latest result until its next call completes (a survivor still
inside that call needs it), so any single failure, and any in which not all k
holders of a needed result die, is recovered; the robust engine drops the
others (``RobustEngine._thin``).

Memory: the bytes of the results of the current version (plus the bootstrap
calls), on every rank (k/n of them when spread), up to a budget.

# Note [cache budget]
A program that never checkpoints (a plain allreduce loop from existing code)
would keep every result until the OOM killer ends it (measured before the
budget: 400 allreduces of 4 MiB grew a rank to 1.65 GB). So the cache has a
budget (``RABIT_CACHE_BUDGET``; by default 1/16 of the machine's memory,
shared by the ranks on it). A result that would pass it is not kept, and the
engine says so once: a failure before the next checkpoint then needs a result
that nobody holds, so recovery ends the job with ``RecoveryError`` and
rabit-run restarts it from the durable checkpoint. Time: one copy of each
result (arrays; broadcast objects are kept as the pickled bytes already
made), none for allreduces from ``shm_keep_min_bytes`` on a node that shares
memory: the cache keeps the area the reduction wrote (read-only; Note [kept
results] in ``_shm.py``), counted in full on every rank though the ranks of
a node share it. Arrays freed at a commit are reused for later results of the
same size, areas once no node rank holds them, so a training loop stops
allocating after its first versions.

Past the budget an allreduce keeps nothing, so it needs neither an intact
input nor the kept-result protocol: it runs as the plain engine's does (Open
MPI's in-place allreduce below ``shm_min_bytes``, Note [in-place robust
allreduce]). All ranks must then take that path in the same call (the
shared-memory protocol and MPI's allreduce do not meet), so the decision is
made alike everywhere (Note [uniform budget]).

The bootstrap calls (epoch ``BOOT``) get 1/8 of the budget
(``BOOT_SHARE``): their results are kept for the job's whole life (a
replacement replays them before its ``load_checkpoint``), and in a program
that never checkpoints they buy an in-job recovery only until the budget is
full. Measured (``scripts/bench_no_checkpoint.py``, 2 ranks, 4 MiB calls):
each result kept there cost 2.7 ms against raw MPI's 0.55 ms per call, fresh
memory being most of it (a 4 MiB copy into warm memory: 0.26 ms; into fresh
memory: 2.2 ms on this VM), and the whole budget (753 MiB a rank) bought a
recovery in the first 188 calls (0.5 s) of a 1000-call loop at 2.2x raw's
time. A program that calls ``load_checkpoint`` first, as Rabit programs do,
spends nothing there.

# Note [uniform budget]
Whether a call is past the budget must be the same on every rank. What each
rank *holds* is not: with ``result_copies`` each keeps its share, and a
replacement holds what it replayed. So the budget is charged with
:attr:`ResultCache.counted`, the bytes of every result admitted since the
epoch began (plus the bootstrap calls'), which is the same on every rank
that made the same calls, a replacement that replayed them included (a
replayed result was admitted by the survivor that served it; an epoch with a
refused result cannot be replayed at all). The budget itself is agreed at
the job's start (the smallest rank's: default budgets differ with each
host's memory) and a replacement takes it with the job's settings.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["BOOT", "BOOT_SHARE", "Entry", "ResultCache", "default_budget", "key_code",
           "code_key"]

BOOT = -1   # the epoch of calls made before the first load_checkpoint / checkpoint
BOOT_SHARE = 8      # the bootstrap calls may use 1/BOOT_SHARE of the budget (Note [cache budget])

Key = Tuple[int, int]


class Entry(NamedTuple):
    """A cached result: the call's kind, its description (the engine's
    ``Call``; sent to a replacement as ``replay_key``, and checked against the
    replacement's own call), the payload (an array or bytes), and
    whether the call's result was a device array (kept as its host copy; a
    replacement gets a device array back)."""

    kind: int
    signature: tuple
    payload: Any
    device: bool = False


class ResultCache:
    """Results since the last checkpoint (and of the bootstrap epoch)."""

    def __init__(self, budget: int = 0, copies: int = 0) -> None:
        self.copies = copies             # RABIT_RESULT_COPIES: 0 = every rank keeps all
        self._last: Optional[Key] = None
        self._warned = False
        self._entries: Dict[Key, Entry] = {}
        self._pool: Dict[Tuple[Tuple[int, ...], np.dtype], List[np.ndarray]] = {}
        self.nbytes = 0                  # bytes this rank holds
        self.budget = budget             # bytes; 0 = no limit
        self.refused = 0                 # results not kept since the last epoch change
        # Note [uniform budget]: bytes admitted in the current epoch and the
        # bootstrap one, the same on every rank; and the bootstrap's part.
        self.counted = 0
        self.boot_counted = 0

    @property
    def full(self) -> bool:
        """Whether a result was refused in the current epoch (Note [cache budget])."""
        return self.refused > 0

    def fits(self, key: Key, nbytes: int) -> bool:
        """Whether the result of ``key``, ``nbytes`` long, can be kept (Note
        [cache budget]); if so it is charged to the budget, if not counted as
        refused. The same answer on every rank (Note [uniform budget])."""
        budget = self.budget
        if budget and (self.counted + nbytes > budget or (
                key[0] == BOOT and self.boot_counted + nbytes > budget // BOOT_SHARE)):
            self.refused += 1
            return False
        self._charge(key, nbytes)
        return True

    def _charge(self, key: Key, nbytes: int) -> None:
        self.counted += nbytes
        if key[0] == BOOT:
            self.boot_counted += nbytes

    def missing_hint(self) -> str:
        """Why a needed result may be missing (for the RecoveryError)."""
        if not self.full:
            return ""
        return (f" ({self.refused} result(s) since the last checkpoint were not kept: they "
                f"passed the cache budget, RABIT_CACHE_BUDGET={self.budget} bytes; "
                f"checkpoint more often or raise it)")

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Optional[Entry]:
        """The entry for ``key``, or None."""
        return self._entries.get(key)

    def put_array(self, key: Key, kind: int, signature: tuple, result: np.ndarray,
                  device: bool = False) -> None:
        """Keep a copy of the host array ``result`` (the caller still owns
        it); ``device``: the call's result was a device array."""
        if not self.fits(key, result.nbytes):
            return
        copy = self.buffer_like(result)
        np.copyto(copy, result)
        self._put(key, Entry(kind, signature, copy, device))

    def buffer_like(self, data: np.ndarray) -> np.ndarray:
        """A C-contiguous array of ``data``'s shape and dtype, reused from
        dropped results when one is free (for :meth:`put_owned`)."""
        spares = self._pool.get((data.shape, data.dtype))
        return spares.pop() if spares else np.empty(data.shape, dtype=data.dtype)

    def put_owned(self, key: Key, kind: int, signature: tuple, result: np.ndarray) -> None:
        """Keep ``result`` itself (from :meth:`buffer_like`; the caller lets
        go of it), or take it back for reuse if it does not fit."""
        # Entry's fields as a plain tuple.__new__: a NamedTuple's own __new__
        # costs 0.2 us of the robust allreduce's hot path.
        entry = _new_entry(Entry, (kind, signature, result, False))
        if not self._admit(key, entry, result.nbytes):
            self._recycle(entry)

    def put_kept(self, key: Key, kind: int, signature: tuple, result: np.ndarray) -> None:
        """Keep the read-only ``result`` as it is (an area of the node's
        shared memory: Note [kept results] in ``_shm.py``); if it does not
        fit, let it go."""
        self._admit(key, _new_entry(Entry, (kind, signature, result, False)), result.nbytes)

    def _admit(self, key: Key, entry: Entry, nbytes: int) -> bool:
        """:meth:`fits` and :meth:`_put` in one (the allreduce's hot path)."""
        budget = self.budget
        boot = key[0] == BOOT
        if budget and (self.counted + nbytes > budget
                       or (boot and self.boot_counted + nbytes > budget // BOOT_SHARE)):
            self.refused += 1
            return False
        self.counted += nbytes
        if boot:
            self.boot_counted += nbytes
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= _size(old.payload)
        self._entries[key] = entry
        self.nbytes += nbytes
        return True

    def give_back(self, buffer: np.ndarray) -> None:
        """Take back an unused array of :meth:`buffer_like` for reuse."""
        self._recycle(_new_entry(Entry, (0, (), buffer, False)))

    def put_bytes(self, key: Key, kind: int, signature: tuple, payload: bytes) -> None:
        """Keep immutable bytes as they are."""
        if self.fits(key, len(payload)):
            self._put(key, Entry(kind, signature, payload))

    def put_entry(self, key: Key, entry: Entry) -> None:
        """Keep an entry received from a peer during recovery (admitted by
        the peer that kept it: charged without a check, Note [uniform
        budget])."""
        if key not in self._entries:
            self._charge(key, _size(entry.payload))
        self._put(key, entry)

    def _put(self, key: Key, entry: Entry) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= _size(old.payload)
        self._entries[key] = entry
        self.nbytes += _size(entry.payload)

    def thin(self, key: Key, rank: int, size: int) -> bool:
        """After the result of ``key`` was kept: drop the previous call's
        unless ``rank`` is one of its ``copies`` holders (result #s lives on
        ranks s..s+copies-1 modulo ``size``; the latest on every rank).
        Returns True once, the first time a result was refused for the
        budget (for the caller to say so)."""
        warn = self.refused > 0 and not self._warned
        self._warned = self._warned or warn
        copies = self.copies
        if copies == 0:
            return warn                 # every rank keeps every result (the default)
        previous, self._last = self._last, key
        if previous is None or previous == key or previous[0] == BOOT or copies >= size:
            return warn
        if (previous[1] - rank) % size >= copies:
            self.drop(previous)
        return warn

    def drop(self, key: Key) -> None:
        """Forget one entry (if held), keeping its array for reuse."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= _size(entry.payload)
            self._recycle(entry)

    def drop_epochs_before(self, epoch: int) -> None:
        """Forget every entry of an epoch < ``epoch`` except the bootstrap ones,
        keeping their large arrays for reuse (at every checkpoint: kept lean).
        One pass that keeps what stays: it runs at every checkpoint (a
        training loop's), and popping each key and pooling small arrays took
        6.7-8.3 us for 10 entries, this 2.5-2.9 us."""
        kept: Dict[Key, Entry] = {}
        freed = 0
        for key, entry in self._entries.items():
            if key[0] == BOOT or key[0] >= epoch:
                kept[key] = entry
                continue
            payload = entry.payload
            if type(payload) is np.ndarray:
                freed += payload.nbytes
                if payload.nbytes >= _POOL_MIN_BYTES:
                    self._recycle(entry)
            else:
                freed += len(payload)
        self._entries = kept
        self.nbytes -= freed
        self.refused = 0
        self.counted = self.boot_counted

    def _recycle(self, entry: Entry) -> None:
        # Pooled by shape: a reshape on the way in and out cost more than the
        # copy of a small result. Only arrays of _POOL_MIN_BYTES or more: a
        # small one costs less to allocate again than to pool.
        array = entry.payload
        if type(array) is np.ndarray and array.nbytes >= _POOL_MIN_BYTES:
            flags = array.flags
            if flags.c_contiguous and flags.writeable:
                spares = self._pool.get((array.shape, array.dtype))
                if spares is None:
                    self._pool[(array.shape, array.dtype)] = [array]
                elif len(spares) < 64:
                    spares.append(array)


_new_entry = tuple.__new__

# Arrays at least this large are pooled for reuse (Note [cache budget]): from
# there NumPy's allocator hands out fresh pages (glibc maps 128 KiB and more),
# which the first write faults in; below it a new array costs about 0.3 us.
_POOL_MIN_BYTES = 64 << 10


def key_code(key: Key) -> int:
    """A key as one int64, ordered like the calls: bootstrap calls first
    (the recovery round's summary reduces them with MAX)."""
    return 1 + ((key[0] + 1) << 32) + key[1]


def code_key(code: int) -> Key:
    """The key of :func:`key_code`."""
    return ((code - 1) >> 32) - 1, (code - 1) & 0xFFFFFFFF


def default_budget() -> int:
    """1/16 of the machine's memory, shared by the ranks on it (Open MPI says
    how many in ``OMPI_COMM_WORLD_LOCAL_SIZE``; 1 if unknown)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 << 30
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
    return max(64 << 20, memory // 16 // max(1, int(local) if local.isdigit() else 1))


def _size(payload: Any) -> int:
    return payload.nbytes if isinstance(payload, np.ndarray) else len(payload)
