"""A NumPy-backed stand-in for the parts of CuPy and ``cupy.cuda.nccl`` that
rabit_py's NCCL backend uses, for machines without a GPU (the real thing is
tested by tests/gpu through scripts/gpu_check.sh where a device is lent).

Arrays live in host memory and pass their address as ``data.ptr``, as CuPy
passes device pointers; the stand-in NCCL communicator reads and writes that
memory and runs each operation as a nonblocking MPI collective on a
duplicate of ``MPI.COMM_WORLD``, queued on the stream it is given, so that a
stream is "done" when its requests complete, as a CUDA stream is. Ranks in
``nccl.HANG_RANKS`` never start their operations (a peer that is gone)."""

import ctypes
import sys
import types
from typing import Dict, List

import numpy as np
from mpi4py import MPI


class _Memory:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class Device:
    current = 0                             # the device made current by use()

    def __init__(self, id: int = 0) -> None:  # noqa: A002 - CuPy's name
        self.id = id

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def use(self) -> None:
        Device.current = self.id


class runtime:  # noqa: N801 - cupy.cuda.runtime
    device_count = 1

    @staticmethod
    def getDeviceCount() -> int:  # noqa: N802 - CuPy's name
        return runtime.device_count


class ndarray(np.ndarray):  # noqa: N801 - CuPy's name
    """A "device" array: host memory with CuPy's attributes (a NumPy
    subclass, so slicing, views and arithmetic behave as CuPy's do)."""

    __module__ = "cupy"                     # how rabit_py recognizes device arrays
    device_of_rank = staticmethod(lambda rank: rank)    # one GPU per rank by default

    def __new__(cls, host: np.ndarray) -> "ndarray":
        return np.array(host).view(cls)

    @property
    def data(self) -> _Memory:              # CuPy: the device pointer
        return _Memory(self.ctypes.data)

    @property
    def device(self) -> Device:
        return Device(ndarray.device_of_rank(MPI.COMM_WORLD.Get_rank()))

    def get(self, out: np.ndarray = None) -> np.ndarray:
        if out is None:
            return np.array(self.view(np.ndarray))
        assert out.shape == self.shape and out.dtype == self.dtype and type(out) is np.ndarray
        out[...] = self.view(np.ndarray)
        return out

    def set(self, host: np.ndarray) -> None:
        assert host.shape == self.shape and host.dtype == self.dtype
        self.view(np.ndarray)[...] = host


def asarray(host: np.ndarray) -> ndarray:
    return host if isinstance(host, ndarray) else ndarray(np.asarray(host))


def zeros(shape: object, dtype: object = float) -> ndarray:
    return ndarray(np.zeros(shape, dtype))


def array(host: np.ndarray) -> ndarray:
    return ndarray(np.array(host))


def empty(shape: object, dtype: object = float) -> ndarray:
    return ndarray(np.empty(shape, dtype))


def ascontiguousarray(data: np.ndarray) -> ndarray:
    return data if data.flags.c_contiguous else ndarray(np.ascontiguousarray(data))


class Event:
    def record(self, stream: "Stream" = None) -> None:
        pass


def from_dlpack(tensor: object) -> ndarray:
    """A "device" view of ``tensor``'s memory (DLPack: no copy)."""
    return np.from_dlpack(tensor).view(ndarray)


class ExternalStream:
    """A stream made elsewhere (torch's); entered as the current stream."""

    entered = 0

    def __init__(self, ptr: int, device_id: int = None) -> None:
        self.ptr = ptr

    def __enter__(self) -> "ExternalStream":
        ExternalStream.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Stream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.ptr = id(self)
        self.requests: List[MPI.Request] = []
        self.stuck = False
        _STREAMS[self.ptr] = self

    @property
    def done(self) -> bool:
        if self.stuck:
            return False
        try:
            self.requests = [r for r in self.requests if not r.Test()]
        except MPI.Exception:
            self.stuck = True           # a peer died: NCCL would wait for good
            return False
        return not self.requests

    def wait_event(self, event: Event) -> None:
        pass

    def synchronize(self) -> None:
        MPI.Request.Waitall(self.requests)
        self.requests = []


_STREAMS: Dict[int, Stream] = {}
_DEFAULT = Stream()


def get_current_stream() -> Stream:
    return _DEFAULT


# ---------------------------------------------------------------- nccl
_NP_TYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
             6: np.float16, 7: np.float32, 8: np.float64}
_MPI_OPS = {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN}


class NcclError(RuntimeError):
    pass


class NcclCommunicator:
    created: List["NcclCommunicator"] = []

    def __init__(self, ndev: int, uid: tuple, rank: int) -> None:
        base = BASE_COMM()
        assert ndev == base.Get_size() and rank == base.Get_rank(), (ndev, rank)
        assert len(uid) == 128
        self._comm = base.Dup()
        self._comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.calls = self.broadcasts = self.allgathers = 0
        self.aborted = self.destroyed = False
        NcclCommunicator.created.append(self)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:
        assert not (self.aborted or self.destroyed)
        self.calls += 1
        dtype = np.dtype(_NP_TYPES[datatype])
        buf = np.ctypeslib.as_array((ctypes.c_byte * (count * dtype.itemsize))
                                    .from_address(recvbuf)).view(dtype)
        queue = _STREAMS[stream]
        if BASE_COMM().Get_rank() in HANG_RANKS:
            queue.stuck = True
            return
        send = MPI.IN_PLACE if sendbuf == recvbuf else np.ctypeslib.as_array(
            (ctypes.c_byte * (count * dtype.itemsize)).from_address(sendbuf)).view(dtype)
        queue.requests.append(self._comm.Iallreduce(send, buf, op=_MPI_OPS[op]))

    def broadcast(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int,
                  stream: int) -> None:
        assert not (self.aborted or self.destroyed) and sendbuf == recvbuf
        self.calls += 1
        self.broadcasts += 1
        nbytes = count * np.dtype(_NP_TYPES[datatype]).itemsize
        buf = np.ctypeslib.as_array((ctypes.c_byte * nbytes).from_address(recvbuf))
        queue = _STREAMS[stream]
        if BASE_COMM().Get_rank() in HANG_RANKS:
            queue.stuck = True
            return
        queue.requests.append(self._comm.Ibcast(buf, root=root))

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,  # noqa: N802
                  stream: int) -> None:
        assert not (self.aborted or self.destroyed)
        self.calls += 1
        self.allgathers += 1
        nbytes = count * np.dtype(_NP_TYPES[datatype]).itemsize
        send = np.ctypeslib.as_array((ctypes.c_byte * nbytes).from_address(sendbuf))
        recv = np.ctypeslib.as_array(
            (ctypes.c_byte * (nbytes * self._comm.Get_size())).from_address(recvbuf))
        queue = _STREAMS[stream]
        if BASE_COMM().Get_rank() in HANG_RANKS:
            queue.stuck = True
            return
        queue.requests.append(self._comm.Iallgather(send, recv))

    def check_async_error(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True

    def destroy(self) -> None:
        self.destroyed = True
        self._comm.Free()


HANG_RANKS: set = set()
# The MPI communicator that the stand-in NCCL communicators are made over:
# the job's ranks. A program that recovers sets it to its engine's.
def BASE_COMM() -> MPI.Comm:  # noqa: N802 - a setting a program may replace
    return MPI.COMM_WORLD


def get_unique_id() -> tuple:
    return tuple(int(b) for b in np.random.default_rng().integers(-128, 128, 128))


def install(modules: Dict[str, types.ModuleType] = None) -> types.ModuleType:
    """Put ``cupy``, ``cupy.cuda`` and ``cupy.cuda.nccl`` stand-ins in
    ``modules`` (default ``sys.modules``); returns the ``cupy`` module."""
    modules = sys.modules if modules is None else modules
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    nccl = types.ModuleType("cupy.cuda.nccl")
    cupy.ndarray, cupy.asarray, cupy.zeros, cupy.cuda = ndarray, asarray, zeros, cuda
    cupy.array, cupy.empty, cupy.ascontiguousarray = array, empty, ascontiguousarray
    cupy.from_dlpack = from_dlpack
    # Anything else (exp, log, maximum, arange...): NumPy's; ufuncs keep the
    # "device" array type.
    cupy.__getattr__ = lambda name: getattr(np, name)
    cuda.Device, cuda.Stream, cuda.Event = Device, Stream, Event
    cuda.ExternalStream, cuda.runtime = ExternalStream, runtime
    cuda.get_current_stream, cuda.nccl = get_current_stream, nccl
    nccl.available, nccl.NcclError = True, NcclError
    nccl.NcclCommunicator, nccl.get_unique_id = NcclCommunicator, get_unique_id
    for code, name in enumerate(["INT8", "UINT8", "INT32", "UINT32", "INT64", "UINT64",
                                 "FLOAT16", "FLOAT32", "FLOAT64"]):
        setattr(nccl, "NCCL_" + name, code)
    for code, name in enumerate(["SUM", "PROD", "MAX", "MIN"]):
        setattr(nccl, "NCCL_" + name, code)
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = empty_pinned
    modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl, "cupyx": cupyx})
    return cupy


PINNED_MADE: List[tuple] = []


def empty_pinned(shape: tuple, dtype: object = float) -> np.ndarray:
    """``cupyx.empty_pinned``: host memory (page-locked on a real GPU)."""
    PINNED_MADE.append((tuple(shape), np.dtype(dtype).str))
    return np.empty(shape, dtype)
