"""FedProx (Li et al., 2020): local objective + (μ/2)·‖w − w_t‖² towards the round's global model."""

import torch
from torch import nn

from fedskew.fl.base import ClientContext, FederatedAlgorithm, StateDict


class FedProx(FederatedAlgorithm):
    name = "fedprox"
    # μ from the FedProx grid {0.001, 0.01, 0.1, 1}; FedLC does not state its choice.
    hyperparameters = {"mu": 0.01}
    vectorised_hooks = ("after_backward",)

    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        self._anchor = [p.detach().clone() for p in model.parameters()]

    def after_backward(self, model: nn.Module, client: ClientContext) -> None:
        # ∇ (μ/2)‖w − w_t‖² = μ (w − w_t), added to the data gradient.
        super().after_backward(model, client)
        mu = self.hp["mu"]
        with torch.no_grad():
            for param, anchor in zip(model.parameters(), self._anchor):
                if param.grad is not None:
                    param.grad.add_(param - anchor, alpha=mu)

    def vectorised_after_backward(self, params: list[torch.Tensor], grads: list[torch.Tensor | None],
                                  start: list[torch.Tensor]) -> None:
        super().vectorised_after_backward(params, grads, start)
        mu = self.hp["mu"]
        with torch.no_grad():
            for param, grad, anchor in zip(params, grads, start):
                if grad is not None:
                    grad.add_(param - anchor, alpha=mu)
