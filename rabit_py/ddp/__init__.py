"""DDP-style gradient bucketing (tier T3 of DESIGN.md: a feature on the public
API): ``bucket`` groups gradients into buckets that are reduced while the
backward pass still runs, ``comm_hooks`` says how a bucket is reduced (PyTorch
DDP's communication hooks), ``commthread`` is the one thread that carries
them. The torch adapter (``rabit_py.torch``) and the KVStore build on it.

Rules (checked by ``tests/unit/test_layout.py``): this package uses only the
public API (``rabit_py.api``, ``ops``, ``errors``) and tier T0.
"""

from .bucket import GradientBucketer, plan_buckets
from .comm_hooks import CommHook, GradBucket, allreduce_hook, fp16_compress_hook
from .commthread import CommThread, comm_thread

__all__ = ["GradientBucketer", "plan_buckets", "CommHook", "GradBucket", "allreduce_hook",
           "fp16_compress_hook", "CommThread", "comm_thread"]
