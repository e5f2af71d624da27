"""KVStore: MXNet/ps-lite-style push/pull on the fault-tolerant allreduce.

# Note [kvstore]
A ``dist_sync`` store in a BSP job is an allreduce behind a key-value
interface: ``push`` adds this rank's value to the key's aggregate, every rank
gets the same sum, and the store either keeps the sum (no updater) or runs
the updater/optimizer on it, identically on every rank, so every rank holds
the same weights without sending them. There is no server: each rank holds
the whole store.

Pushes are queued (a copy of the local sum: the caller may reuse its arrays
at once). A queue is *launched* when a pull, ``wait_all``, ``barrier``,
``checkpoint`` or ``save_optimizer_states`` needs it, when a key already in
the queue is pushed again (so one key's updates keep their order), or when
the queue holds ``bucket_cap_mb`` (so a backward pass that pushes as it goes
overlaps with the reduction). A launch sorts the queue by priority (higher
first, then push order) and hands it to a :class:`GradientBucketer`, cached
per launch signature, which packs the values into buckets and reduces them in
that order on the store's one communication thread; the update of each key
runs on that thread right after its bucket (``on_reduced``), overlapped with
the next buckets. ``pull`` waits only for the bucket of its own key.

Every launch point depends only on the sequence of calls, never on timing,
so every rank launches the same buckets in the same order: the engine's
signature check and the robust engine's replay rely on it.

Between a push and the pull of that key (or ``wait_all``), the store's thread
may be making collectives: the caller must not call rabit_py collectives
itself in that window (as with the bucketer). The store's own collective
methods (``init``, ``barrier``, ``checkpoint``, ...) finish the queue first.

Fault tolerance: :meth:`KVStore.checkpoint` stores the weights and the
optimizer state as the job's global model; after a failure, the replacement
calls :meth:`KVStore.load_checkpoint` and gets them back (Note [robust
protocol] in ``engine/robust.py``).

Asynchronous and bounded-delay consistency (``dist_async``, ``dist_ssp``)
run on server processes instead: :class:`ServerKVStore` (Note
[server-backed store] in ``_remote.py``), made by :func:`create`.

Tier T3 of DESIGN.md ("Tiers"): a feature on the public API. It uses
``rabit_py.api``, ``rabit_py.ddp`` and tier T0 only, never an engine; its
``_plans`` and ``_state`` are used only here (``tests/unit/test_layout.py``).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import api
from ..ddp.commthread import comm_thread
from ._plans import Key, Plan, Plans, Push, check_key
from ._state import model_of, read_states, restore_model, write_states
from ..errors import CheckpointError, KVStoreError, NotInitializedError
from .._arrays import to_host
from ..ops import Op
from .optimizer import Optimizer, Updater
from ._remote import ASYNC_TYPES, ServerKVStore
from ._values import copy_out, local_sum, pairs

__all__ = ["KVStore", "ServerKVStore", "create"]

_SYNC_TYPES = ("dist_sync", "dist_sync_device", "dist_device_sync")


def create(name: str = "dist_sync", **kwargs: Any) -> Union["KVStore", ServerKVStore]:
    """A store of type ``name`` (MXNet's ``mx.kv.create``): ``"dist_sync"``
    (BSP on allreduce, :class:`KVStore`), or on server processes
    ``"dist_async"`` and ``"dist_ssp"`` (bounded delay, ``staleness=tau``;
    :class:`ServerKVStore`)."""
    if name in ASYNC_TYPES:
        return ServerKVStore(name, **kwargs)
    return KVStore(name, **kwargs)


class KVStore:
    """A synchronous (BSP) key-value store over all ranks (Note [kvstore]).

    Joins the job with ``rabit_py.init()`` if the caller has not.

    Args:
        kvtype: ``"dist_sync"`` (``"dist_sync_device"`` is accepted as the same).
        bucket_cap_mb: the largest bucket of a launch, and the queued bytes
            that launch the queue without waiting for a pull (MiB).
        first_bucket_mb: the first bucket of a launch (default: the cap).

    Raises:
        ValueError: an asynchronous or unknown type, or bad bucket sizes.
    """

    def __init__(self, kvtype: str = "dist_sync", bucket_cap_mb: float = 25.0,
                 first_bucket_mb: Optional[float] = None) -> None:
        if kvtype not in _SYNC_TYPES:
            if kvtype in ASYNC_TYPES:
                raise ValueError(f"kvtype={kvtype!r} runs on server processes: make it with "
                                 f"rabit_py.kvstore.create({kvtype!r}) (a ServerKVStore)")
            raise ValueError(f"kvtype={kvtype!r}: use 'dist_sync' (with one process it is a "
                             f"local store), or create('dist_async') / create('dist_ssp', "
                             f"staleness=tau) on server processes")
        if bucket_cap_mb <= 0 or (first_bucket_mb is not None and first_bucket_mb <= 0):
            raise ValueError("bucket_cap_mb and first_bucket_mb must be > 0")
        try:
            api.get_rank()
        except NotInitializedError:
            api.init()
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.first_bucket_mb = float(first_bucket_mb or bucket_cap_mb)
        self._store: Dict[Key, np.ndarray] = {}
        self._pending: List[Push] = []
        self._pending_keys: set = set()
        self._pending_bytes = 0
        self._seq = 0
        self._plans = Plans()
        self._inflight: Dict[Key, Tuple[Plan, int]] = {}
        self._updater: Optional[Callable[[Key, np.ndarray, np.ndarray], None]] = None
        # The engine's one communication thread (shared with bucketers and
        # the torch adapter, so that collectives keep one order).
        self._executor = comm_thread()
        self._error: Optional[BaseException] = None
        self._closed = False
        #: The keys of every bucket, in the order the buckets were launched
        #: (the last 1000): what priority ordering produced.
        self.launched: "collections.deque[Tuple[Key, ...]]" = collections.deque(maxlen=1000)

    # ------------------------------------------------------------ properties
    @property
    def type(self) -> str:
        """The store's type: ``"dist_sync"``."""
        return "dist_sync"

    @property
    def rank(self) -> int:
        """This worker's rank (``rabit_py.get_rank()``)."""
        return api.get_rank()

    @property
    def num_workers(self) -> int:
        """The number of workers (``rabit_py.get_world_size()``)."""
        return api.get_world_size()

    # ------------------------------------------------------------ data
    def init(self, key: Union[Key, Sequence[Key]], value: Any) -> None:
        """Create keys with rank 0's values (broadcast). Collective.

        Args:
            key: a key (int or str) or a list of keys.
            value: an array (NumPy or CuPy), or a list of one array per key.

        Raises:
            KVStoreError: a key exists already (or appears twice).
            TypeError, ValueError: a bad key or value, or lists of different lengths.
        """
        self._check_usable()
        keys, values = pairs(key, value)
        for k in keys:
            if k in self._store or keys.count(k) > 1:
                raise KVStoreError(f"rank {self.rank}: key {k!r} is initialized twice; init "
                                   f"each key once, before its first push or pull")
        arrays = []
        for k, v in zip(keys, values):
            if isinstance(v, (list, tuple)):
                raise TypeError(f"init of key {k!r}: give one array, not a list")
            arrays.append(np.ascontiguousarray(to_host(v)))
        self.wait_all()
        received = api.broadcast(arrays if self.rank == 0 else None, root=0)
        for k, v in zip(keys, received):
            self._store[k] = np.array(v, copy=True)

    def push(self, key: Union[Key, Sequence[Key]], value: Any, priority: int = 0) -> None:
        """Queue values to be summed over all ranks (Note [kvstore]); with an
        updater, the key's weight is updated with the sum, otherwise the key
        takes the sum.

        Args:
            key: a key or a list of keys.
            value: for one key an array, or a list of arrays summed locally
                first (e.g. one per device); for a list of keys, one such
                entry per key.
            priority: higher is reduced first.

        Raises:
            KVStoreError: a key was not initialized, a value's shape or dtype
                is not the key's, or the store failed earlier.
            TypeError, ValueError: a bad key or value.
        """
        self._push(key, value, priority, stage=True)

    def _push(self, key: Any, value: Any, priority: int, stage: bool) -> List[Key]:
        """Queue the pushes; ``stage=False`` queues the caller's arrays
        themselves (no copy), for a caller that launches before returning."""
        self._check_usable()
        keys, values = pairs(key, value)
        sums = []
        for k, v in zip(keys, values):
            stored = self._known(k, "push")
            sums.append(local_sum(k, v, stored.shape, stored.dtype, self.rank, stage))
        for k, total in zip(keys, sums):
            if k in self._pending_keys:      # the earlier push of k must be reduced first
                self._launch()
            self._pending.append(Push(k, total, int(priority), self._seq))
            self._pending_keys.add(k)
            self._pending_bytes += total.nbytes
            self._seq += 1
        if self._pending_bytes >= self.bucket_cap_mb * 2 ** 20:
            self._launch()
        return keys

    def pull(self, key: Union[Key, Sequence[Key]], out: Any = None,
             priority: int = 0) -> Any:
        """Copy keys' current values into ``out``, waiting for their queued
        pushes (only those: later buckets may still be reducing).

        Args:
            key: a key or a list of keys.
            out: an array (or a list of arrays, each gets a copy) per key;
                None returns new arrays.
            priority: accepted for MXNet compatibility (pulls are synchronous).

        Returns:
            ``out``, or the new array(s) when ``out`` is None.

        Raises:
            KVStoreError: an unknown key, an ``out`` of another shape, or the
                store failed earlier (or while waiting: then also the cause).
        """
        self._check_usable()
        single = not isinstance(key, (list, tuple))
        keys = [check_key(k) for k in ([key] if single else key)]
        if out is None:
            outs: List[Any] = [None] * len(keys)
        else:
            outs = [out] if single else list(out)
            if len(outs) != len(keys):
                raise ValueError(f"{len(keys)} keys but {len(outs)} outputs")
        for k in keys:
            self._known(k, "pull")
        if any(k in self._pending_keys for k in keys):
            self._launch()
        results = []
        for k, o in zip(keys, outs):
            self._wait_key(k)
            value = self._store[k]
            results.append(value.copy() if o is None else copy_out(k, value, o, self.rank))
        return results[0] if single else results

    def pushpull(self, key: Union[Key, Sequence[Key]], value: Any, out: Any = None,
                 priority: int = 0) -> Any:
        """``push`` then ``pull``; with ``out=None`` the result is written back
        into ``value`` (into each array of a list). See :meth:`push` and :meth:`pull`.

        Raises:
            as :meth:`push` and :meth:`pull`.
        """
        out = value if out is None else out   # a list for one key: a copy in each
        if isinstance(key, (list, tuple)) and (not isinstance(out, (list, tuple))
                                               or len(out) != len(key)):
            raise ValueError(f"{len(key)} keys need a list of {len(key)} outputs")
        # The values are copied into the buckets by the launch below, before
        # this returns, so they need no staging copy.
        self._push(key, value, priority, stage=False)
        if self._pending:
            with self._executor.inline():
                self._launch()
        return self.pull(key, out, priority)

    def wait_all(self) -> None:
        """Reduce and apply every queued push and wait for all of them. After
        it, the caller may make rabit_py collectives of its own.

        Raises:
            KVStoreError: a reduction or update failed (from its cause).
        """
        self._check_usable()
        if self._pending:
            self._launch()
        for plan in self._plans.all():
            if plan.active:
                self._finish(plan)
        self._inflight.clear()

    # ------------------------------------------------------------ updates
    def set_updater(self, updater: Callable[[Key, np.ndarray, np.ndarray], None]) -> None:
        """Use ``updater(key, grad, weight)`` (updates ``weight`` in place) on
        every push; it runs on every rank with the same arguments, on the
        store's communication thread. Its state is checkpointed only if it
        has ``get_states``/``set_states`` (as :class:`rabit_py.optimizer.Updater`).

        Raises:
            TypeError: ``updater`` is not callable.
        """
        if not callable(updater):
            raise TypeError(f"the updater must be callable, got {type(updater).__name__}")
        self.wait_all()
        self._updater = updater

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Update weights with ``optimizer`` (e.g. ``rabit_py.optimizer.SGD``
        or ``Adam``) after every push, identically on every rank.

        Raises:
            TypeError: not a :class:`rabit_py.optimizer.Optimizer`.
        """
        self.set_updater(Updater(optimizer))

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer state (rank 0 writes ``fname`` atomically; every
        rank must call it, as it finishes the queued pushes).

        Args:
            fname: the file.
            dump_optimizer: accepted for MXNet compatibility (the optimizer's
                hyper-parameters are always saved with the states).

        Raises:
            KVStoreError: no optimizer is set (or the updater has no states).
            OSError: the file cannot be written (rank 0).
        """
        self.wait_all()
        states = self._updater_states("save_optimizer_states")
        if self.rank == 0:
            write_states(fname, states)

    def load_optimizer_states(self, fname: str) -> None:
        """Load states written by :meth:`save_optimizer_states` (rank 0 reads
        ``fname`` and broadcasts it). Collective.

        Raises:
            KVStoreError: no optimizer is set.
            CheckpointError: the file is missing or not a states file (on
                every rank, with rank 0's reason).
            ValueError: the states are of another optimizer.
        """
        self.wait_all()
        self._updater_states("load_optimizer_states")
        info = api.engine_info()
        status, body = api.broadcast(
            read_states(fname, info.checkpoint_classes, info.trust_checkpoints)
            if self.rank == 0 else None, root=0)
        if status != "ok":
            raise CheckpointError(f"cannot load optimizer states from {fname!r} (read on rank "
                                  f"0): {body}")
        self._updater.set_states(body)  # type: ignore[union-attr]

    # ------------------------------------------------------------ fault tolerance
    def checkpoint(self, local_model: Any = None) -> None:
        """``rabit_py.checkpoint`` with the store's weights and optimizer
        state as the global model (plus the caller's ``local_model``).
        Finishes the queued pushes first. Collective.

        Raises:
            as ``rabit_py.checkpoint``; KVStoreError as :meth:`wait_all`.
        """
        self.wait_all()
        states = None
        if self._updater is not None and hasattr(self._updater, "get_states"):
            states = self._updater.get_states()
        api.checkpoint(model_of(self._store, states), local_model)

    def load_checkpoint(self, with_local: bool = False) -> Any:
        """``rabit_py.load_checkpoint``: restore the store's weights and
        optimizer state from the latest version (a replacement worker gets
        them back here). Collective.

        Returns:
            the version (0 on a fresh start: nothing is changed), or
            ``(version, local_model)`` with ``with_local``.

        Raises:
            KVStoreError: the checkpoint was not written by
                :meth:`checkpoint`, or holds optimizer states but no optimizer
                with ``set_states`` is set.
            CheckpointError: as ``rabit_py.load_checkpoint``.
        """
        self.wait_all()
        result = api.load_checkpoint(with_local)
        version, model = result[0], result[1]
        if model is not None:
            self._store = restore_model(model, version, self.rank, self._updater)
        return (version, result[2]) if with_local else version

    def barrier(self) -> None:
        """Wait until every rank got here (after finishing the queued pushes).
        Collective."""
        self.wait_all()
        api.allreduce(np.zeros(1, dtype=np.int32), Op.SUM)

    def close(self) -> None:
        """Finish the queued pushes (the communication thread is the
        engine's: it stops at ``finalize``)."""
        if self._closed:
            return
        try:
            if self._error is None:
                self.wait_all()
        finally:
            self._closed = True

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:                      # do not hide the caller's error behind ours
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------ internals
    def _known(self, key: Key, action: str) -> np.ndarray:
        try:
            return self._store[key]
        except KeyError:
            raise KVStoreError(f"rank {self.rank}: {action} of key {key!r}, which was never "
                               f"initialized; call init({key!r}, value) first") from None

    def _launch(self) -> None:
        """Reduce the queue: priority order, bucketed (Note [kvstore])."""
        group = sorted(self._pending, key=lambda p: (-p.priority, p.seq))
        self._pending, self._pending_keys, self._pending_bytes = [], set(), 0
        if not group:
            return
        signature = tuple((p.key, p.value.shape, p.value.dtype.str) for p in group)
        # The bucketer plans from its last parameter: give it the group reversed.
        plan, made = self._plans.get(signature, lambda: Plan(
            [p.key for p in reversed(group)], [p.value for p in reversed(group)],
            self.bucket_cap_mb, self.first_bucket_mb, self._executor, self._apply))
        if not made and plan.active:          # its previous launch must end first
            self._finish(plan)
        plan.active = True
        last = len(group) - 1
        for position, item in enumerate(group):
            plan.bucketer.mark_ready(last - position, item.value)
            self._inflight[item.key] = (plan, last - position)
        for members in plan.bucketer.buckets:
            self.launched.append(tuple(plan.keys[i] for i in members))

    def _apply(self, plan: Plan, bucket: int) -> None:
        """On the communication thread: a bucket is reduced; update its keys."""
        for index in plan.bucketer.buckets[bucket]:
            key = plan.keys[index]
            grad = plan.bucketer.view(index)
            if self._updater is None:
                # The key's value is its slot: the slot is only written again
                # by a later push of this key, and pulls wait for that one.
                self._store[key] = grad
            else:
                self._updater(key, grad, self._store[key])

    def _wait_key(self, key: Key) -> None:
        entry = self._inflight.pop(key, None)
        if entry is None:
            return
        plan, index = entry
        try:
            plan.bucketer.wait_for(index)
        except BaseException as exc:
            self._fail(exc)

    def _finish(self, plan: Plan) -> None:
        plan.active = False
        try:
            plan.bucketer.wait()
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        raise KVStoreError(f"rank {api.get_rank()}: a reduction or update of the store failed "
                           f"({type(exc).__name__}: {exc}); the store cannot be used any more "
                           f"(recovery failed or the updater raised): end the job, rabit-run "
                           f"restarts it from the last checkpoint") from exc

    def _check_usable(self) -> None:
        if self._closed:
            raise KVStoreError("the KVStore is closed")
        if self._error is not None:
            raise KVStoreError(f"the KVStore is unusable after an earlier failure "
                               f"({type(self._error).__name__}: {self._error})") from self._error

    def _updater_states(self, action: str) -> Dict[str, Any]:
        if self._updater is None or not hasattr(self._updater, "get_states"):
            raise KVStoreError(f"rank {self.rank}: {action} needs an optimizer: call "
                               f"set_optimizer first (a plain updater function has no states)")
        return self._updater.get_states()  # type: ignore[union-attr]
