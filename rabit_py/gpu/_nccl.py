"""The NCCL backend for CuPy arrays (Note [nccl backend]).

# Note [nccl backend]
One ``NcclCommunicator`` per engine, made at the first device call that
takes this path: rank 0's unique id reaches the others over the engine's MPI
communicator (outside the program's numbered calls), and each rank joins on
the device of the array it passed (one rank per GPU: ``auto`` takes this
backend only where no two ranks of a node share a device). The allreduce runs
in place on a dedicated stream that first waits, through an event, for the
work already queued on the caller's stream (the producer of the gradients);
the call returns when that stream is done, like every rabit_py collective.

The engine frames the call (``device_allreduce``: numbering, signature
check, watchdog; the robust engine also keeps a host copy of the result for
replay and a device copy of the input to run the call again), so a
mismatched call is reported as for NumPy arrays. NCCL itself never gives up
on a peer that is gone: the wait polls the stream, asks NCCL for an
asynchronous error, and asks MPI whether a peer failed (``check_peers``:
ULFM's detector knows). A dead peer drops the communicator and raises the
engine's failure: the robust engine recovers (a spare or a new process takes
the rank), and the next executed call makes a new communicator for the new
membership (``engine.membership``); the plain engine reports it. Past the
engine's timeout the wait aborts the communicator and raises
``CollectiveTimeoutError``; after that or a NCCL error the backend refuses
further calls with a clear error.

Broadcast and allgather take NCCL once the backend is chosen: an allgather
chooses it like an allreduce (every rank passes a device array), a broadcast
cannot (receivers may pass None), so one made before the first
device allreduce or allgather is staged. The engine frames both (numbering,
signature check, watchdog). A broadcast's header (shape, dtype) travels over
MPI from the root in mode ``DEVICE``, so that a receiver that passes None or
a host array still takes part: it gets a new device array, or the values
copied into its matching NumPy array. An allgather's row counts travel over
MPI; NCCL gathers equal pieces, so unequal counts are padded to the largest
and the padding dropped. Both move bytes (``NCCL_UINT8``): every dtype of the
API is carried, bool and complex included. The robust engine keeps a host
copy of their results, marked as device results, and serves a replacement
device arrays made from it (in place where it passes a matching one). Dtypes
and ops
that NCCL cannot reduce (bool, bitwise ops, custom reducers) and
non-contiguous arrays take the staged allreduce.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional

from ..errors import CollectiveTimeoutError, RabitError
from .._arrays import is_device_array
from ..ops import OPS

__all__ = ["NcclBackend", "nccl_reason", "takes_nccl"]

# NumPy dtype chars -> names of cupy.cuda.nccl's data type constants
_DTYPES = {"b": "NCCL_INT8", "B": "NCCL_UINT8", "i": "NCCL_INT32", "I": "NCCL_UINT32",
           "l": "NCCL_INT64", "L": "NCCL_UINT64", "q": "NCCL_INT64", "Q": "NCCL_UINT64",
           "e": "NCCL_FLOAT16", "f": "NCCL_FLOAT32", "d": "NCCL_FLOAT64"}
_OPS = {code: info.nccl for code, info in OPS.items() if info.nccl}
_SPIN_SECONDS = 1e-3            # poll without sleeping for this long, then nap
_MAX_PIECE = 1 << 30            # bytes per ncclBroadcast: its count is a C int


def _modules() -> Any:
    import cupy  # noqa: PLC0415 - optional, imported only for device arrays
    from cupy.cuda import nccl  # noqa: PLC0415

    return cupy, nccl


def nccl_reason() -> Optional[str]:
    """Why NCCL cannot be used in this process (None if it can)."""
    try:
        _, nccl = _modules()
    except ImportError as exc:
        return f"cupy.cuda.nccl cannot be imported ({exc})"
    if not getattr(nccl, "available", True):
        return "this CuPy was built without NCCL"
    return None


def takes_nccl(data: Any, op: Any) -> bool:
    """Whether an allreduce of ``data`` with ``op`` can run on NCCL (the
    same answer on every rank that makes the same call); ``op`` None: an
    allgather, which moves bytes (any dtype, any layout)."""
    if op is None:
        return True
    return (getattr(data.dtype, "char", "?") in _DTYPES
            and isinstance(op, int) and not isinstance(op, bool) and op in _OPS
            and bool(getattr(getattr(data, "flags", None), "c_contiguous", False)))


class NcclBackend:
    """The NCCL communicator of one engine (Note [nccl backend]).

    Args:
        engine: the job's engine.
        device: the CUDA device this rank uses.

    The communicator itself is made (collectively) inside the first call,
    and made again after the engine's membership changed (a recovery).
    """

    def __init__(self, engine: Any, device: int) -> None:
        cupy, nccl = _modules()
        self._cupy, self._nccl = cupy, nccl
        self._engine = engine
        self._broken: Optional[str] = None
        self._comm: Any = None
        self._membership = -1
        self.device = device
        self.communicators_made = 0
        self._stream = self._new_stream()

    def _new_stream(self) -> Any:
        with self._cupy.cuda.Device(self.device):
            return self._cupy.cuda.Stream(non_blocking=True)

    def allreduce(self, data: Any, op: Any, prepare_fun: Optional[Callable[[Any], None]]) -> Any:
        """Reduce the CuPy array ``data`` in place across ranks; returns it.

        Raises:
            CollectiveMismatchError: the ranks made different calls.
            CollectiveTimeoutError: it did not complete within the timeout
                (the communicator is aborted).
            RabitError: an earlier NCCL failure made the backend unusable, or
                NCCL reported an error.
            PeerFailure (internal): a peer died; the robust engine recovers
                and runs the call again on a new communicator.
        """
        return self._engine.device_allreduce(data, op, prepare_fun,
                                             lambda: self._run(data, op))

    def _ensure_communicator(self) -> None:
        """Make the communicator for the engine's current membership
        (collective: every rank gets here at the same executed call)."""
        membership = self._engine.membership
        if self._comm is not None and self._membership == membership:
            return
        if self._comm is not None:
            self._abandon()             # made for ranks that are gone
        nccl = self._nccl
        uid = nccl.get_unique_id() if self._engine.rank == 0 else None
        uid = self._engine.side_allgather(uid)[0]
        with self._cupy.cuda.Device(self.device):
            self._comm = nccl.NcclCommunicator(self._engine.world_size, uid, self._engine.rank)
        self._membership = membership
        self.communicators_made += 1

    def carries(self, data: Any) -> bool:
        """Whether ``data`` is a device array this backend can move (the
        engine's broadcast asks: Note [nccl backend])."""
        return is_device_array(data)

    def to_host(self, data: Any) -> Any:
        """A device array's contents in a new NumPy array."""
        return data.get()

    def upload(self, host: Any, target: Any = None) -> Any:
        """The host array ``host`` on this backend's device: copied into the
        device array ``target`` (same shape and dtype) if given, else into a
        new one, which is returned (the robust engine serves kept results so)."""
        cupy = self._cupy
        with cupy.cuda.Device(self.device):
            if target is None:
                return cupy.asarray(host)
            if target.flags.c_contiguous:
                target.set(host)
            else:
                target[...] = cupy.asarray(host)
            return target

    def _run(self, data: Any, op: Any) -> None:
        nccl = self._nccl
        dtype = getattr(nccl, _DTYPES[data.dtype.char])
        code = getattr(nccl, _OPS[op])
        ptr = data.data.ptr
        self._on_stream("allreduce", lambda stream: self._comm.allReduce(
            ptr, ptr, data.size, dtype, code, stream))

    def broadcast(self, target: Any, shape: tuple, dtype: Any, root: int) -> Any:
        """Inside the engine's broadcast (the header told every rank the shape
        and dtype): send the root's ``target``, or receive into ``target``
        (a device array of that shape and dtype) or, if None, into a new
        device array. Returns the array holding the root's values. Any dtype:
        the bytes move as NCCL_UINT8, in pieces whose count fits NCCL's int.

        Raises:
            as :meth:`allreduce`.
        """
        cupy, nccl = self._cupy, self._nccl
        with cupy.cuda.Device(self.device):
            if target is None:
                buffer = cupy.empty(shape, dtype=dtype)
            elif target.flags.c_contiguous:
                buffer = target
            else:
                buffer = cupy.ascontiguousarray(target)
            nbytes, ptr = buffer.nbytes, buffer.data.ptr

            def launch(stream: int) -> None:
                for start in range(0, nbytes, _MAX_PIECE):
                    count = min(_MAX_PIECE, nbytes - start)
                    self._comm.broadcast(ptr + start, ptr + start, count, nccl.NCCL_UINT8,
                                         root, stream)

            if nbytes:
                self._on_stream("broadcast", launch)
            if target is not None and buffer is not target and self._engine.rank != root:
                target[...] = buffer
        return target if target is not None else buffer

    def allgather(self, data: Any, rows: List[int]) -> Any:
        """Inside the engine's allgather (``rows``: every rank's row count,
        exchanged over MPI): every rank's ``data`` concatenated along axis 0,
        in rank order, as a new device array. NCCL gathers equal pieces: when
        the counts differ, each rank sends its rows padded to the largest
        count and the padding is dropped after.

        Raises:
            as :meth:`allreduce`.
        """
        cupy, nccl = self._cupy, self._nccl
        trailing = tuple(data.shape[1:])
        most, ranks = max(rows), len(rows)
        with cupy.cuda.Device(self.device):
            out = cupy.empty((sum(rows),) + trailing, dtype=data.dtype)
            if most == 0 or out.nbytes == 0:
                return out
            if min(rows) == most:
                send, gathered = cupy.ascontiguousarray(data), out
            else:
                send = cupy.empty((most,) + trailing, dtype=data.dtype)
                send[:data.shape[0]] = data
                gathered = cupy.empty((ranks * most,) + trailing, dtype=data.dtype)
            self._on_stream("allgather", lambda stream: self._comm.allGather(
                send.data.ptr, gathered.data.ptr, send.nbytes, nccl.NCCL_UINT8, stream))
            if gathered is not out:
                offset = 0
                for rank, count in enumerate(rows):
                    out[offset:offset + count] = gathered[rank * most:rank * most + count]
                    offset += count
        return out

    def _on_stream(self, what: str, launch: Callable[[int], None]) -> None:
        """Run ``launch(stream)`` (NCCL calls) on the backend's stream, after
        the work queued on the caller's stream, and wait for it."""
        if self._broken is not None:
            raise RabitError(self._broken)
        self._ensure_communicator()
        cupy = self._cupy
        with cupy.cuda.Device(self.device):
            ready = cupy.cuda.Event()
            ready.record(cupy.cuda.get_current_stream())
            self._stream.wait_event(ready)
            try:
                launch(self._stream.ptr)
            except Exception as exc:  # noqa: BLE001 - nccl.NcclError, reported as ours
                raise self._fail(f"NCCL {what} failed: {exc}") from exc
            self._wait(what)

    def _wait(self, what: str) -> None:
        # Give up a little before the engine's watchdog (armed for this call
        # too), so that the error is ours rather than the watchdog's.
        timeout = 0.9 * self._engine.config.timeout
        start = time.monotonic()
        while not self._stream.done:
            try:
                self._comm.check_async_error()
            except Exception as exc:  # noqa: BLE001 - nccl.NcclError
                raise self._fail(f"NCCL reported an error: {exc}") from exc
            try:
                # NCCL waits for a dead peer forever: ask MPI, whose failure
                # detector knows (raises the engine's failure).
                self._engine.check_peers()
            except BaseException:
                self._abandon()
                raise
            elapsed = time.monotonic() - start
            if timeout > 0 and elapsed > timeout:
                raise self._fail(
                    f"a NCCL {what} did not complete within {timeout:.3g} s (a peer is "
                    f"gone or stuck); the NCCL communicator was aborted",
                    CollectiveTimeoutError)
            if elapsed > _SPIN_SECONDS:
                time.sleep(1e-4)

    def _abort(self) -> None:
        try:
            self._comm.abort()
        except Exception:  # noqa: BLE001 - aborting a communicator that already failed
            pass

    def _abandon(self) -> None:
        """Drop the communicator (a peer died, or the membership changed):
        the next executed call makes a new one, on a new stream (the old one
        may hold the aborted operation)."""
        self._abort()
        self._comm = None
        self._stream = self._new_stream()

    def _fail(self, what: str, kind: type = RabitError) -> BaseException:
        self._broken = (f"rank {self._engine.rank}: {what}; device collectives cannot go on "
                        f"in this job (RABIT_GPU_BACKEND=staged avoids NCCL)")
        self._abort()
        return kind(self._broken)

    def close(self) -> None:
        """Release the communicator (at the engine's finalize)."""
        try:
            if self._broken is None and self._comm is not None:
                self._stream.synchronize()
                self._comm.destroy()
        except Exception:  # noqa: BLE001 - nothing to do about it at finalize
            pass
