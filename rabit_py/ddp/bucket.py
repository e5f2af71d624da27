"""GradientBucketer: bucketed gradient allreduce that overlaps the backward pass.

# Note [buckets]
As in PyTorch DDP: parameters are given in forward order; gradients appear in
roughly reverse order during the backward pass. Parameters are packed into
flat buckets in reverse order (the first bucket small, ``first_bucket_mb``, so
communication starts early; the others up to ``bucket_cap_mb``; a parameter
larger than the cap gets a bucket of its own; a dtype change starts a new
bucket). ``mark_ready`` copies a gradient into its bucket; when every gradient
of a bucket is in, the bucket is handed to one communication thread, which
reduces it with the bucketer's communication hook (by default
``allreduce_hook``: a sum, averaged if ``average``; or the one registered)
while the caller keeps computing. Buckets are
reduced strictly in bucket order, whatever order gradients arrive in, so every
rank makes the same collective calls in the same order (which the engine's
signature check and recovery rely on). ``wait`` zero-fills gradients that were
never marked (parameters unused in this step), starts what is left, waits,
and returns the reduced gradients as views into the buckets (no copy back).

Only the communication thread makes collective calls between ``mark_ready``
and ``wait``: the caller must not call rabit collectives in that window.
Bucketers share one communication thread (the engine's, or an
``executor`` given to several): their buckets are reduced in the order they
were started, across bucketers, which keeps every rank's calls in one order
(two threads calling the engine at once would not). ``on_reduced`` runs on
that thread after each bucket's allreduce (the KVStore applies its optimizer
there, overlapped with later buckets), and ``wait_for`` waits for one
parameter's bucket only.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .commthread import comm_thread
from .comm_hooks import CommHook, GradBucket, allreduce_hook, sum_hook

__all__ = ["GradientBucketer", "plan_buckets"]


def plan_buckets(sizes: Sequence[int], dtypes: Sequence[Any], bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0) -> List[List[int]]:
    """Parameter indices per bucket, in reduction order (Note [buckets]).

    Args:
        sizes: bytes of each parameter, in forward order.
        dtypes: dtype of each parameter.
        bucket_cap_mb, first_bucket_mb: bucket sizes in MiB.

    Raises:
        ValueError: a cap is not positive, or the lists differ in length.
    """
    if bucket_cap_mb <= 0 or first_bucket_mb <= 0:
        raise ValueError("bucket_cap_mb and first_bucket_mb must be > 0")
    if len(sizes) != len(dtypes):
        raise ValueError(f"{len(sizes)} sizes for {len(dtypes)} dtypes")
    buckets: List[List[int]] = []
    current: List[int] = []
    filled = 0
    cap = first_bucket_mb * 2 ** 20
    for index in reversed(range(len(sizes))):
        if current and (filled + sizes[index] > cap
                        or np.dtype(dtypes[index]) != np.dtype(dtypes[current[0]])):
            buckets.append(current)
            current, filled, cap = [], 0, bucket_cap_mb * 2 ** 20
        current.append(index)
        filled += sizes[index]
    if current:
        buckets.append(current)
    return buckets


def _array_module(params: Sequence[Any]) -> Any:
    """numpy or cupy, whichever every parameter belongs to."""
    from .._arrays import is_device_array

    device = [is_device_array(p) for p in params]
    if any(device) and not all(device):
        raise TypeError("params mix NumPy and CuPy arrays; GradientBucketer takes one kind")
    if any(device):
        import cupy  # noqa: PLC0415 - only for CuPy parameters

        return cupy
    for i, p in enumerate(params):
        if not isinstance(p, np.ndarray):
            raise TypeError(f"params[{i}] is a {type(p).__name__}; GradientBucketer takes "
                            f"NumPy or CuPy arrays")
    return np


class GradientBucketer:
    """Reduce the gradients of ``params`` across ranks in buckets, overlapped
    with the caller's backward pass (Note [buckets]).

    Args:
        params: the parameters (NumPy arrays), in forward order; only their
            shapes and dtypes are used.
        bucket_cap_mb: the largest bucket, MiB (default 25).
        first_bucket_mb: the first bucket reduced, MiB (default 1).
        average: divide the sums by the world size: the default hook is
            ``allreduce_hook`` (a sum, then the division, bucket by bucket on
            the communication thread), ``sum_hook`` without it; a registered
            communication hook decides instead.
        executor: what runs the allreduces, shared with other bucketers: an
            object whose ``submit(fn, *args)`` returns a Future and runs tasks
            one at a time in submission order, such as a one-thread
            ``ThreadPoolExecutor`` (default: the engine's one communication
            thread, shared by every bucketer made without an executor, so
            that their collective calls come in one order on every rank;
            stopped at ``finalize``).
        on_reduced: called on the communication thread with a bucket's index
            once its allreduce is done (before the bucket counts as done).

    Raises:
        TypeError: a parameter is neither a NumPy nor a CuPy array, or both
            kinds are mixed.
        ValueError: bad bucket sizes.

    With CuPy parameters the buckets live on the device and are reduced
    through rabit_py's device path (NCCL where chosen, Note [device arrays]);
    a bucket's reduction waits, through an event, for the work queued on the
    stream that was current when its last gradient was marked ready.
    """

    def __init__(self, params: Sequence[np.ndarray], bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, average: bool = True,
                 executor: Optional[Any] = None,
                 on_reduced: Optional[Callable[[int], None]] = None) -> None:
        self._xp = _array_module(params)
        self._shapes = [p.shape for p in params]
        self._dtypes = [p.dtype for p in params]
        self.buckets = plan_buckets([p.nbytes for p in params], self._dtypes, bucket_cap_mb,
                                    first_bucket_mb)
        self.average = average
        self._bucket_of = {}
        self._offset = {}
        self._flat: List[np.ndarray] = []
        for b, members in enumerate(self.buckets):
            offset = 0
            for index in members:
                self._bucket_of[index] = b
                self._offset[index] = offset
                offset += int(np.prod(self._shapes[index], dtype=np.int64))
            self._flat.append(self._xp.zeros(offset, dtype=self._dtypes[members[0]]))
        self._views = [self._slot(i) for i in range(len(self._shapes))]
        self._lock = threading.Lock()
        self._executor = executor if executor is not None else comm_thread()
        self._on_reduced = on_reduced
        self._hook: Tuple[Any, CommHook] = (None, allreduce_hook if average else sum_hook)
        self._hook_registered = False
        self._accumulating = False
        self._written: set = set()         # slots holding this step's data
        self._reset()

    def _reset(self) -> None:
        self._ready = [set() for _ in self.buckets]
        self._futures: List[Optional[Future]] = [None] * len(self.buckets)
        self._next = 0                        # the next bucket to start, in order

    def view(self, index: int) -> np.ndarray:
        """Parameter ``index``'s gradient slot in its bucket (shape of the parameter)."""
        return self._views[index]

    def _slot(self, index: int) -> np.ndarray:
        b = self._bucket_of[index]
        start = self._offset[index]
        size = int(np.prod(self._shapes[index], dtype=np.int64))
        return self._flat[b][start:start + size].reshape(self._shapes[index])

    def mark_ready(self, index: int, grad: np.ndarray) -> None:
        """Gradient of parameter ``index`` is computed: add it to its bucket, and
        start the bucket's allreduce when it is complete (and every earlier
        bucket has started). Under :meth:`no_sync` it is only accumulated.

        Raises:
            IndexError: no such parameter. ValueError: wrong shape, or marked
                twice in one step.
        """
        if not 0 <= index < len(self._shapes):
            raise IndexError(f"parameter {index} does not exist ({len(self._shapes)} given)")
        grad = self._xp.asarray(grad)
        if grad.shape != self._shapes[index]:
            raise ValueError(f"gradient of parameter {index} has shape {grad.shape}, the "
                             f"parameter {self._shapes[index]}")
        b = self._bucket_of[index]
        with self._lock:
            if index in self._ready[b]:
                raise ValueError(f"parameter {index} was marked ready twice in one step")
            view = self.view(index)
            if index in self._written:        # a sum kept by no_sync
                view += grad
            else:                             # a copy: no zeroing pass over the buckets
                view[...] = grad
                self._written.add(index)
            self._ready[b].add(index)
            if not self._accumulating:
                self._start_complete_buckets()

    def _start_complete_buckets(self) -> None:
        while (self._next < len(self.buckets)
               and len(self._ready[self._next]) == len(self.buckets[self._next])):
            ready = None
            if self._xp is not np:
                # The copies into the bucket were queued on this thread's stream.
                ready = self._xp.cuda.Event()
                ready.record(self._xp.cuda.get_current_stream())
            self._futures[self._next] = self._executor.submit(self._reduce, self._next, ready)
            self._next += 1

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Reduce each bucket with ``hook(state, bucket)`` instead of an
        allreduce (as DDP's ``register_comm_hook``; hooks and their contract
        in :mod:`rabit_py.ddp.comm_hooks`, e.g. ``fp16_compress_hook``). The hook
        leaves the final gradients in the bucket, so ``average`` no longer
        applies: the hook decides (it replaces the default, ``allreduce_hook``,
        which averages, or ``sum_hook`` with ``average=False``).
        Every rank must register the same hook.

        Raises:
            RuntimeError: a hook is registered already, or a step has started.
            TypeError: ``hook`` is not callable.
        """
        if not callable(hook):
            raise TypeError(f"hook must be callable as hook(state, bucket), got "
                            f"{type(hook).__name__}")
        if self._hook_registered:
            raise RuntimeError("a communication hook is registered already (one per "
                               "bucketer, as in DDP)")
        if self._next or self._written:
            raise RuntimeError("register the communication hook before the first step")
        self._hook = (state, hook)
        self._hook_registered = True

    def _reduce(self, bucket: int, ready: Any = None) -> None:
        if ready is not None:
            self._xp.cuda.get_current_stream().wait_event(ready)
        flat = self._flat[bucket]
        state, hook = self._hook
        result = hook(state, GradBucket(bucket, flat, tuple(self.buckets[bucket])))
        if result is not None and result is not flat:
            if tuple(result.shape) != tuple(flat.shape):
                raise ValueError(f"the communication hook returned shape "
                                 f"{tuple(result.shape)} for bucket {bucket} of "
                                 f"{flat.shape[0]} values")
            flat[...] = result
        if self._on_reduced is not None:
            self._on_reduced(bucket)

    def wait_for(self, index: int) -> np.ndarray:
        """Wait until the bucket of parameter ``index`` is reduced (and its
        ``on_reduced`` ran); returns the parameter's reduced gradient, as the
        hook left it (a view; averaged by the default hook when ``average``).
        The step still ends with :meth:`wait`.

        Raises:
            RuntimeError: that bucket has not been started.
            whatever its allreduce or ``on_reduced`` raised.
        """
        future = self._futures[self._bucket_of[index]]
        if future is None:
            raise RuntimeError(f"the bucket of parameter {index} has not been started")
        future.result()
        return self.view(index)

    def wait(self) -> List[np.ndarray]:
        """Finish the step: unmarked gradients count as zero, remaining buckets
        are reduced (and averaged, if asked, by the default hook). Returns the gradients in
        parameter order, as views into the buckets (valid until the next
        ``mark_ready``). Under :meth:`no_sync`: the local sums, unreduced.

        Raises:
            whatever the allreduce raised (RabitError and subclasses).
        """
        with self._lock:
            for index in range(len(self._shapes)):
                if index not in self._written:     # an unused parameter: zero
                    self.view(index)[...] = 0
                    self._written.add(index)
            for b, members in enumerate(self.buckets):
                self._ready[b].update(members)
            if not self._accumulating:
                self._start_complete_buckets()
        if self._accumulating:
            self._ready = [set() for _ in self.buckets]
            return [self.view(i) for i in range(len(self._shapes))]
        errors = []
        for future in self._futures:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, first one wins
                errors.append(exc)
        if errors:
            self._reset()
            self._written = set()
            raise errors[0]
        self._reset()
        self._written = set()           # the next step's gradients overwrite these
        return [self.view(i) for i in range(len(self._shapes))]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) inside the block;
        the first step after it reduces the accumulated sums."""
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def close(self) -> None:
        """Wait for the buckets already started (the communication thread
        itself belongs to the engine, or to whoever gave it)."""
        for future in self._futures:
            if future is not None:
                try:
                    future.result()
                except BaseException:  # noqa: BLE001 - wait() reports it; close must not
                    pass
