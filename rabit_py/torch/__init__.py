"""PyTorch adapter: a module's gradients reduced by the GradientBucketer while
``backward()`` runs (optional: needs ``torch``, which rabit_py never requires)::

    import rabit_py.torch as rt

    model = rt.DistributedModule(net)             # rank 0's weights on every rank
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for x, y in my_batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()           # buckets reduce during backward
        opt.step()                                # waits, then steps on the average

Each parameter that requires a gradient gets a post-accumulate-grad hook that
hands its gradient to the bucketer without a copy: a NumPy view of a CPU
tensor, a CuPy view (DLPack) of a CUDA tensor. The bucketer reduces full
buckets on its communication thread while autograd computes the rest (Note
[buckets] in ``rabit_py/ddp/bucket.py``); CUDA buckets live on the parameters'
device and go through rabit_py's device path (NCCL where chosen, Note [device
arrays] in ``rabit_py/gpu``). :meth:`DistributedModule.synchronize` waits for
the last buckets and makes each ``param.grad`` a view of its reduced bucket
slot (no copy back; DLPack on CUDA). Through the engine, the reduction keeps
rabit_py's signature check and in-job recovery.

CUDA streams: a hook runs with CuPy's current stream set to torch's current
stream of the parameter's device, so that the copy of the gradient into its
bucket (and the event the reduction waits for) is queued after autograd's
kernels that produced it; :meth:`~DistributedModule.synchronize` does the
same for the averaging, so torch's optimizer step runs after it.

Tier T3 of DESIGN.md ("Tiers"): a feature on the public API, built on
``rabit_py.ddp``; it uses public names only (``tests/unit/test_layout.py``).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator, List, Optional

try:
    import torch
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"rabit_py.torch needs PyTorch, which cannot be imported ({_exc}); "
                      f"install it: pip install -e \".[torch]\" (or a CPU wheel of torch)"
                      ) from _exc

from .. import api
from ..ddp.bucket import GradientBucketer

__all__ = ["DistributedModule", "DistributedOptimizer"]


def _device_type(tensor: torch.Tensor) -> str:
    return tensor.device.type


def _import_cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415 - only for CUDA tensors
    except ImportError as exc:
        raise TypeError(f"rabit_py.torch reduces CUDA tensors through CuPy, which cannot be "
                        f"imported ({exc}); install it (pip install -e \".[gpu]\"), or move "
                        f"the model to the CPU") from exc
    return cupy


class _Arrays:
    """How tensors of one device type are seen as arrays, and back, without
    copies: NumPy views for CPU tensors, CuPy views through DLPack for CUDA
    tensors (with torch's current stream made CuPy's)."""

    def __init__(self, device_type: str, device_index: Optional[int]) -> None:
        self.cuda = device_type == "cuda"
        self.cupy = _import_cupy() if self.cuda else None
        self.device_index = device_index

    def array(self, tensor: torch.Tensor) -> Any:
        tensor = tensor.detach()
        return self.cupy.from_dlpack(tensor) if self.cuda else tensor.numpy()

    def tensor(self, array: Any) -> torch.Tensor:
        return torch.from_dlpack(array) if self.cuda else torch.from_numpy(array)

    def on_torch_stream(self) -> ContextManager[Any]:
        """CuPy's current stream made torch's current one (CUDA), for work
        that must be ordered with autograd's and the optimizer's kernels."""
        if not self.cuda:
            return contextlib.nullcontext()
        stream = torch.cuda.current_stream(self.device_index)
        device = -1 if self.device_index is None else self.device_index   # -1: unknown
        return self.cupy.cuda.ExternalStream(stream.cuda_stream, device)

    def on_device(self) -> ContextManager[Any]:
        """The parameters' device made CuPy's current one (CUDA): buckets are
        allocated there."""
        if not self.cuda:
            return contextlib.nullcontext()
        return self.cupy.cuda.Device(self.device_index)


class DistributedModule(torch.nn.Module):
    """Wrap ``module`` for data-parallel training on every rank.

    Args:
        module: the model: every parameter on the CPU, or every one on the
            same CUDA device (one GPU per rank, e.g. ``cuda:local_rank``).
        bucket_cap_mb, first_bucket_mb: bucket sizes, as for GradientBucketer.
        average: divide the summed gradients by the world size (default).
        broadcast_parameters: start every rank from rank 0's parameters and
            buffers (one broadcast each; default on).

    Raises:
        TypeError: a parameter is not a dense CPU or CUDA tensor, the
            parameters are on several devices, or CUDA tensors without CuPy.
        NotInitializedError: ``rabit_py.init()`` was not called.
    """

    def __init__(self, module: torch.nn.Module, bucket_cap_mb: float = 25.0,
                 first_bucket_mb: float = 1.0, average: bool = True,
                 broadcast_parameters: bool = True) -> None:
        super().__init__()
        self.module = module
        self._params: List[torch.nn.Parameter] = [p for p in module.parameters()
                                                  if p.requires_grad]
        for i, p in enumerate(self._params):
            if _device_type(p) not in ("cpu", "cuda") or p.layout != torch.strided:
                raise TypeError(f"parameter {i} is a {_device_type(p)} {p.layout} tensor; "
                                f"rabit_py.torch reduces dense CPU or CUDA tensors")
        devices = sorted({(_device_type(p), p.device.index) for p in self._params},
                         key=str)
        if len(devices) > 1:
            names = ", ".join(t if i is None else f"{t}:{i}" for t, i in devices)
            raise TypeError(f"the parameters are on several devices ({names}); rabit_py.torch "
                            f"needs them all on the CPU or all on one GPU (model.to(device) first)")
        device_type, device_index = devices[0] if devices else ("cpu", None)
        self._arrays = _Arrays(device_type, device_index)
        api.get_rank()                      # NotInitializedError before any hook is set
        if broadcast_parameters:
            with torch.no_grad(), self._arrays.on_torch_stream():
                for tensor in list(module.parameters()) + list(module.buffers()):
                    if tensor.numel():
                        api.broadcast(self._arrays.array(tensor), 0)
        with self._arrays.on_device():
            self.bucketer = GradientBucketer([self._arrays.array(p) for p in self._params],
                                             bucket_cap_mb=bucket_cap_mb,
                                             first_bucket_mb=first_bucket_mb, average=average)
        self._accumulating = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i))
                       for i, p in enumerate(self._params)]

    def _hook(self, index: int) -> Any:
        def ready(param: torch.Tensor) -> None:
            # Called once the gradient of this backward pass is accumulated.
            if not self._accumulating:
                with self._arrays.on_torch_stream():
                    self.bucketer.mark_ready(index, self._arrays.array(param.grad))
        return ready

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        """Reduce each gradient bucket with ``hook(state, bucket)`` (as DDP's
        ``register_comm_hook``; the hook sees the bucket as a CuPy or NumPy
        array, see :mod:`rabit_py.ddp.comm_hooks`, e.g. ``fp16_compress_hook``).

        Raises:
            RuntimeError: a hook is registered already, or a step has started.
        """
        self.bucketer.register_comm_hook(state, hook)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module."""
        return self.module(*args, **kwargs)

    def synchronize(self) -> None:
        """Wait for every bucket; afterwards each ``param.grad`` is the
        (averaged) reduced gradient, a view of the bucket (parameters that got
        no gradient this step get zeros). Under :meth:`no_sync` it does
        nothing: ``param.grad`` holds the local sums.

        Raises:
            RabitError and subclasses: the reduction failed.
        """
        if self._accumulating:
            return
        with self._arrays.on_torch_stream():
            grads = self.bucketer.wait()
            for p, g in zip(self._params, grads):
                p.grad = self._arrays.tensor(g)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no communication) in the block; the
        first synchronized step after it reduces the sums (gradient
        accumulation). Torch itself accumulates into ``param.grad`` across
        backward passes, so the hooks just stand aside."""
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def close(self) -> None:
        """Remove the hooks and stop the bucketer's thread."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.bucketer.close()


class DistributedOptimizer:
    """Wrap a torch optimizer so that ``step()`` first waits for the
    gradients of ``model`` (a :class:`DistributedModule`), as Horovod's
    ``DistributedOptimizer`` does. Other attributes are the optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: DistributedModule) -> None:
        if not isinstance(model, DistributedModule):
            raise TypeError(f"model must be a rabit_py.torch.DistributedModule, got "
                            f"{type(model).__name__}")
        self.optimizer = optimizer
        self.model = model

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """``model.synchronize()``, then the optimizer's step."""
        self.model.synchronize()
        return self.optimizer.step(*args, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As the optimizer's ``zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

