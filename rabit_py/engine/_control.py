"""Control messages: the Python objects rabit_py's own protocol exchanges
(who is alive, the join state, the recovery rounds' cached results, the local
models, the settings agreement), sealed, on zeroed buffers, revoke-checked.

# Note [sealed messages]
mpi4py's object calls (``comm.allgather(obj)``, ``comm.bcast(obj)``) send a
pickle in two steps: the sizes, then the bytes, into a buffer they allocate
without clearing. Under ULFM a peer's revoke between the two steps makes the
second step return *success* on ranks still inside it, with the buffer never
filled: they unpickle whatever the allocator left there. Reproduced
(tests/jobs/test_control_messages.py): three ranks, one revoking after the sizes;
on one of the other two, 54 to 60 of 60 allgathers returned success and
raised ``UnpicklingError: invalid load key, '\\x00'`` (or ``'\\xa7'``, or
"stack underflow"); a storm showed ``'\\x05'``. Inside a call frame that was caught
after the fact (Note [revoked success] in ``_frame.py``); the repair's and
the spare pool's exchanges ran outside any frame, so the error escaped as an
uncaught bug, and that rank's abort lost the replica of the rank killed just
before it (the storm's "local model ... is lost with all its replicas").
Worse, memory reused from an earlier message of the same size would
unpickle *without error* into that stale message: a silent wrong answer.
``comm.allreduce(obj, op)`` is worse still: mpi4py runs it on a hidden
duplicate of the communicator that a revoke of ours never reaches.

So every exchange of objects in the engine goes through this module:

- receive buffers are zero-filled: a part never filled reads as zeros;
- each message is *sealed*: a magic number, the exchange it belongs to (its
  purpose; a message of another exchange is refused), its length and a
  CRC-32C of its pickle;
- after each step the communicator is checked for a revoke;
- a message that fails its seal is an interrupted exchange: the
  communicator is revoked (so every member leaves it, those whose part
  succeeded too) and :class:`InterruptedExchange` raised, an
  ``MPI.Exception`` of class ``MPI_ERR_REVOKED``, which every caller already
  takes for a failure during the call (the repair starts over; a call's
  frame recovers).

Integers are reduced with buffer calls on the communicator itself
(:func:`reduce_int`). Arrays of the program's own collectives are not
sealed (that would cost a pass over the data): a broadcast's header and an
allgather's row counts carry the call's number, and an allreduce has the
signature check and the revoke check (Note [call stamps] in ``mpi.py``).
"""

from __future__ import annotations

import logging
import pickle
import struct
from typing import Any, List

import numpy as np
from ._checksum import crc32c

from ._mpistart import ERR_REVOKED, MPI

__all__ = ["InterruptedExchange", "seal", "unseal", "allgather", "bcast", "reduce_int",
           "send", "recv", "sendrecv", "stamp", "stamp_parts", "ERR_REVOKED"]

log = logging.getLogger("rabit_py")

_MAGIC = b"RBTm"
# magic, purpose code, body length, CRC-32C of the body
_HEADER = struct.Struct("<4sIQI")
HEADER_BYTES = _HEADER.size
_LIMIT = 1 << 40            # no control message comes near this: a count past it is garbage


class InterruptedExchange(MPI.Exception):
    """A control message that failed its seal (Note [sealed messages]): the
    exchange was interrupted, or a message of another exchange arrived. An
    ``MPI.Exception`` of class ``MPI_ERR_REVOKED``; ``detail`` says what was
    wrong."""

    def __init__(self, detail: str) -> None:
        super().__init__(ERR_REVOKED)
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.Get_error_string()} (an interrupted exchange: {self.detail})"


def purpose_code(purpose: str) -> int:
    """The 32-bit code of an exchange's purpose, as sealed."""
    return crc32c(purpose.encode())


def seal(obj: Any, purpose: str) -> bytes:
    """``obj`` pickled, behind its seal."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(_MAGIC, purpose_code(purpose), len(body), crc32c(body)) + body


def unseal(message: Any, purpose: str) -> Any:
    """The object of a sealed ``message`` (bytes-like).

    Raises:
        InterruptedExchange: the message is not a whole sealed message of
            ``purpose``.
    """
    view = memoryview(message)
    if len(view) < HEADER_BYTES:
        raise InterruptedExchange(f"{purpose}: a message of {len(view)} bytes, shorter than "
                                  f"its seal")
    magic, code, length, crc = _HEADER.unpack_from(view)
    body = view[HEADER_BYTES:]
    if magic != _MAGIC:
        raise InterruptedExchange(f"{purpose}: no seal (the buffer starts {bytes(view[:4])!r}:"
                                  f" never filled, or another message's bytes)")
    if code != purpose_code(purpose):
        raise InterruptedExchange(f"{purpose}: a message of another exchange "
                                  f"(purpose code {code:#x})")
    if length != len(body) or crc32c(body) != crc:
        raise InterruptedExchange(f"{purpose}: {len(body)} of {length} bytes arrived, or "
                                  f"they changed on the way (CRC-32C)")
    return pickle.loads(body)


def _refuse(comm: Any, error: InterruptedExchange) -> InterruptedExchange:
    """Revoke ``comm`` (every member leaves the exchange) and return ``error``."""
    log.warning("rank %d: %s; the communicator is revoked and the exchange counts as "
                "interrupted", comm.Get_rank(), error)
    try:
        comm.Revoke()
    except (MPI.Exception, AttributeError, NotImplementedError):
        pass                    # no ULFM: the caller's error ends the job instead
    return error


def _check(comm: Any) -> None:
    """A revoke during a step: the step's outcome cannot be trusted."""
    try:
        revoked = comm.Is_revoked()
    except (AttributeError, NotImplementedError, MPI.Exception):
        return
    if revoked:
        raise MPI.Exception(ERR_REVOKED)


def _unseal_or_refuse(comm: Any, message: Any, purpose: str) -> Any:
    try:
        return unseal(message, purpose)
    except InterruptedExchange as exc:
        raise _refuse(comm, exc) from None


def _valid_counts(comm: Any, counts: np.ndarray, purpose: str) -> None:
    bad = (counts < HEADER_BYTES) | (counts > _LIMIT)
    if bad.any():
        raise _refuse(comm, InterruptedExchange(
            f"{purpose}: message sizes {counts.tolist()} (a part never arrived)"))


def allgather(comm: Any, obj: Any, purpose: str) -> List[Any]:
    """Every member's ``obj``, in rank order (collective on ``comm``).

    Raises:
        MPI.Exception: a failure during the exchange (``InterruptedExchange``
            when a message failed its seal; the communicator is revoked).
    """
    mine = seal(obj, purpose)
    size = comm.Get_size()
    counts = np.zeros(size, dtype=np.int64)
    comm.Allgather(np.array([len(mine)], dtype=np.int64), counts)
    _check(comm)
    _valid_counts(comm, counts, purpose)
    displs = np.zeros(size, dtype=np.int64)
    np.cumsum(counts[:-1], out=displs[1:])
    gathered = bytearray(int(counts.sum()))
    comm.Allgatherv([mine, MPI.BYTE], [gathered, (counts.tolist(), displs.tolist()), MPI.BYTE])
    _check(comm)
    view = memoryview(gathered)
    return [_unseal_or_refuse(comm, view[d:d + c], purpose)
            for d, c in zip(displs.tolist(), counts.tolist())]


def bcast(comm: Any, obj: Any, root: int, purpose: str) -> Any:
    """The root's ``obj`` on every member (collective on ``comm``; the root
    gets a copy too, as from mpi4py's ``bcast``).

    Raises:
        MPI.Exception: as :func:`allgather`.
    """
    is_root = comm.Get_rank() == root
    message: Any = seal(obj, purpose) if is_root else None
    count = np.array([len(message) if is_root else 0], dtype=np.int64)
    comm.Bcast(count, root=root)
    _check(comm)
    if not is_root:
        _valid_counts(comm, count, purpose)
        message = bytearray(int(count[0]))
    comm.Bcast([message, MPI.BYTE], root=root)
    _check(comm)
    return _unseal_or_refuse(comm, message, purpose)


def reduce_int(comm: Any, value: int, op: Any) -> int:
    """``value`` reduced over the members with ``op`` (``MPI.MAX``,
    ``MPI.MIN``, ``MPI.SUM``), as one int64 buffer call on ``comm``."""
    buffer = np.array([value], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, buffer, op=op)
    _check(comm)
    return int(buffer[0])


def send(comm: Any, obj: Any, dest: int, tag: int, purpose: str) -> None:
    """Send ``obj`` to ``dest`` (one message, sealed)."""
    message = seal(obj, purpose)
    comm.Send([message, MPI.BYTE], dest=dest, tag=tag)


def recv(comm: Any, source: int, tag: int, purpose: str) -> Any:
    """The object :func:`send` sent from ``source`` with ``tag``.

    Raises:
        MPI.Exception: as :func:`allgather`.
    """
    status = MPI.Status()
    message = comm.Mprobe(source=source, tag=tag, status=status)
    received = bytearray(status.Get_count(MPI.BYTE))
    message.Recv([received, MPI.BYTE])
    return _unseal_or_refuse(comm, received, purpose)


def sendrecv(comm: Any, obj: Any, dest: int, source: int, tag: int, purpose: str) -> Any:
    """Send ``obj`` to ``dest`` and return what ``source`` sent with the
    same ``tag`` (as :func:`send` and :func:`recv` at once)."""
    message = seal(obj, purpose)
    request = comm.Isend([message, MPI.BYTE], dest=dest, tag=tag)
    try:
        got = recv(comm, source, tag, purpose)
    except BaseException:
        _cancel(request)
        raise
    request.Wait()
    return got


def _cancel(request: Any) -> None:
    try:
        request.Cancel()
        request.Free()
    except Exception:  # noqa: BLE001 - a send to a dead process
        pass


def stamp(version: int, seqno: int) -> int:
    """One int64 naming a call (its version and number since the
    checkpoint), for the headers of Note [call stamps] in ``mpi.py``."""
    return (version << 32) | (seqno & 0xFFFFFFFF)


def stamp_parts(value: int) -> "tuple[int, int]":
    """(version, seqno) of a :func:`stamp`."""
    return value >> 32, value & 0xFFFFFFFF

