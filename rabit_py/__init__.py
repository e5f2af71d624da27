"""rabit_py: fault-tolerant collective communication on MPI, for BSP training.

``import rabit_py as rabit``; then ``rabit.init()``, collectives, checkpoints,
``rabit.finalize()``. Nothing runs at import: MPI starts in ``init()``.
"""

from ._version import __version__
from .api import (abort, allgather, allreduce, broadcast, checkpoint, engine_info, finalize,
                  get_processor_name, get_rank, get_world_size, init, is_distributed,
                  is_initialized,
                  lazy_checkpoint, load_checkpoint, select_device, server_comm, session,
                  tracker_print, version_number)
from .errors import (CheckpointError, CollectiveMismatchError, CollectiveTimeoutError,
                     KVStoreError, NotInitializedError, RabitError, RecoveryError,
                     TrainingError, UnsupportedCallError)
from .ops import BITAND, BITOR, BITXOR, MAX, MIN, PROD, SUM, CustomOp, Op

__all__ = [
    "__version__",
    "init", "finalize", "session",
    "get_rank", "get_world_size", "is_distributed", "is_initialized",
    "get_processor_name",
    "allreduce", "broadcast", "allgather", "Op", "CustomOp",
    "MAX", "MIN", "SUM", "PROD", "BITOR", "BITAND", "BITXOR",
    "checkpoint", "lazy_checkpoint", "load_checkpoint", "version_number",
    "tracker_print", "abort", "select_device", "engine_info", "server_comm",
    "RabitError", "NotInitializedError", "CollectiveMismatchError",
    "CollectiveTimeoutError", "RecoveryError", "CheckpointError", "KVStoreError",
    "TrainingError", "UnsupportedCallError",
]
