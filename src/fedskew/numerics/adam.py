"""Adam for local training (`training.optimizer: adam`), without `torch.optim` (see fedskew.numerics.sgd for why).

The arithmetic is torch's single-tensor Adam (`torch.optim.adam._single_tensor_adam`, the path torch
takes on CPU) without amsgrad, maximize or decoupled weight decay: the same operations in the same
order, so results are bit-identical to `torch.optim.Adam(foreach=False)` (tested).

The optimiser is made anew for each client in each round, as SGD is, so its moments start at zero
every time a client trains: FL-FCR, whose protocol uses Adam, does not say whether a client keeps
them between rounds, and a client that kept them would carry state the server never sees.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fedskew.numerics import exact_math
from fedskew.numerics.sgd import LocalOptimizer

BETAS = (0.9, 0.999)  # torch's defaults; FL-FCR gives only the learning rates
EPS = 1e-8


class Adam(LocalOptimizer):
    """Adam with torch's arithmetic (see the module docstring)."""

    def __init__(self, params: Iterable[torch.Tensor], *, lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = BETAS, eps: float = EPS) -> None:
        super().__init__(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.steps = [0] * len(self.params)
        self.first_moments: list[torch.Tensor | None] = [None] * len(self.params)
        self.second_moments: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step in place; a parameter without a gradient is skipped (as torch skips it)."""
        beta1, beta2 = self.betas
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            if self.first_moments[i] is None:
                self.first_moments[i] = torch.zeros_like(param, memory_format=torch.preserve_format)
                self.second_moments[i] = torch.zeros_like(param, memory_format=torch.preserve_format)
            self.steps[i] += 1
            step = self.steps[i]
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            first, second = self.first_moments[i], self.second_moments[i]
            first.lerp_(grad, 1 - beta1)
            second.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_size = self.lr / (1 - beta1 ** step)
            denominator = (exact_math.sqrt(second) / (1 - beta2 ** step) ** 0.5).add_(self.eps)
            param.addcdiv_(first, denominator, value=-step_size)
