"""PyTorch adapter: a module's gradients reduced by the GradientBucketer while
``backward()`` runs (optional: needs ``torch``, which rabit_py never requires).

    import rabit_py.torch as rt

    model = rt.DistributedModule(net)             # rank 0's weights on every rank
    opt = rt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    for x, y in my_batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()           # buckets reduce during backward
        opt.step()                                # waits, then steps on the average

Each parameter that requires a gradient gets a post-accumulate-grad hook that
hands its gradient (a NumPy view of the CPU tensor: no copy) to the
bucketer, which reduces full buckets on its communication thread while
autograd computes the rest (Note [buckets] in ``rabit_py/bucket.py``).
:meth:`DistributedModule.synchronize` waits for the last buckets and makes
each ``param.grad`` a view of its reduced bucket slot (no copy back). Through
the engine, the reduction keeps rabit_py's signature check and in-job
recovery. CUDA tensors need the GPU path (CuPy/NCCL), which is not built yet:
they are refused with a clear error.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List

import torch

from . import api
from .bucket import GradientBucketer

__all__ = ["DistributedModule", "DistributedOptimizer"]


class DistributedModule(torch.nn.Module):
    """Wrap ``module`` for data-parallel training on every rank.

    Args:
        module: the model (CPU parameters).
        bucket_cap_mb, first_bucket_mb: bucket sizes, as for GradientBucketer.
        average: divide the summed gradients by the world size (default).
        broadcast_parameters: start every rank from rank 0's parameters and
            buffers (one broadcast each; default on).

    Raises:
        TypeError: a parameter is not a dense CPU tensor.
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
            if p.device.type != "cpu" or p.layout != torch.strided:
                raise TypeError(f"parameter {i} is a {p.device.type} {p.layout} tensor; "
                                f"rabit_py.torch reduces dense CPU tensors (the CUDA path "
                                f"needs CuPy/NCCL, not built yet)")
        api.get_rank()                      # NotInitializedError before any hook is set
        if broadcast_parameters:
            with torch.no_grad():
                for tensor in list(module.parameters()) + list(module.buffers()):
                    if tensor.numel():
                        api.broadcast(tensor.detach().numpy(), 0)
        self.bucketer = GradientBucketer([p.detach().numpy() for p in self._params],
                                         bucket_cap_mb=bucket_cap_mb,
                                         first_bucket_mb=first_bucket_mb, average=average)
        self._accumulating = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(i))
                       for i, p in enumerate(self._params)]

    def _hook(self, index: int) -> Any:
        def ready(param: torch.Tensor) -> None:
            # Called once the gradient of this backward pass is accumulated.
            if not self._accumulating:
                self.bucketer.mark_ready(index, param.grad.detach().numpy())
        return ready

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
        grads = self.bucketer.wait()
        for p, g in zip(self._params, grads):
            p.grad = torch.from_numpy(g)

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

