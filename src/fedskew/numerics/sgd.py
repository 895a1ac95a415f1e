"""Plain SGD (momentum, weight decay) for local training, without `torch.optim`.

Why not `torch.optim.SGD`: building any `torch.optim` optimiser imports `torch._dynamo`
(`Optimizer.add_param_group` is wrapped by `torch._disable_dynamo`, which imports it on
first call). That import costs about 1.5 CPU-s per process, a third of the fixed cost of a
300-round Synthetic run, for a compiler fedskew never uses.

The arithmetic is torch's single-tensor SGD (`torch.optim.sgd._single_tensor_sgd`, the
path torch takes on CPU) with dampening 0 and no Nesterov: the same operations in the
same order, so results are bit-identical to `torch.optim.SGD` on CPU (tested). On CUDA
torch would take its multi-tensor path, which computes the same update with batched
kernels. `sgd_update` is shared with the vectorised path (fedskew.engine.vectorised),
where every tensor carries a leading client dimension.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def sgd_update(params: list[torch.Tensor], grads: list[torch.Tensor | None],
               momentum_buffers: list[torch.Tensor | None], *, lr: float, momentum: float,
               weight_decay: float) -> None:
    """One SGD step in place: g += wd·w; b = g (first step) or b = μ·b + g; w −= lr·b.

    A parameter whose gradient is None is skipped (as torch skips it). `momentum_buffers`
    is updated in place (its None entries are filled at the first step).
    """
    with torch.no_grad():
        for i, (param, grad) in enumerate(zip(params, grads)):
            if grad is None:
                continue
            if weight_decay != 0:
                grad = grad.add(param, alpha=weight_decay)
            if momentum != 0:
                buffer = momentum_buffers[i]
                if buffer is None:
                    buffer = momentum_buffers[i] = grad.detach().clone()
                else:
                    buffer.mul_(momentum).add_(grad)
                grad = buffer
            param.add_(grad, alpha=-lr)


class LocalOptimizer:
    """The optimiser interface local training uses: the parameters, `zero_grad` and `step`."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got no parameters to optimise")

    def step(self) -> None:
        raise NotImplementedError

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_()
                param.grad.zero_()


class SGD(LocalOptimizer):
    """SGD over `sgd_update`."""

    def __init__(self, params: Iterable[torch.Tensor], *, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.momentum_buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def step(self) -> None:
        sgd_update(self.params, [p.grad for p in self.params], self.momentum_buffers,
                   lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
