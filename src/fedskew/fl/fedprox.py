"""FedProx (Li et al., 2020): local objective + (μ/2)·‖w − w_t‖² towards the round's global model."""

import torch
from torch import nn

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Hyperparameter, StateDict, batched


def add_proximal_gradient(params: list[torch.Tensor], grads: list[torch.Tensor | None], anchors: list[torch.Tensor],
                          mu: float) -> None:
    """grad += ∇ (μ/2)‖w − w_t‖² = μ (w − w_t), in place, for every parameter that has a gradient."""
    with torch.no_grad():
        for param, grad, anchor in zip(params, grads, anchors):
            if grad is not None:
                grad.add_(param - anchor, alpha=mu)


class FedProx(FederatedAlgorithm):
    name = "fedprox"
    hyperparameters = {"mu": Hyperparameter(0.01, minimum=0, status="FedLC does not state its choice; 0.01 is "
                                                                    "from FedProx's grid {0.001, 0.01, 0.1, 1}")}

    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        client.scratch["prox_anchor"] = [p.detach().clone() for p in model.parameters()]  # w_t

    def after_backward(self, model: nn.Module, client: ClientContext) -> None:
        super().after_backward(model, client)
        params = list(model.parameters())
        add_proximal_gradient(params, [p.grad for p in params], client.scratch["prox_anchor"], self.hp["mu"])

    @batched("after_backward")
    def batched_after_backward(self, params: list[torch.Tensor], grads: list[torch.Tensor | None],
                               start: list[torch.Tensor]) -> None:
        add_proximal_gradient(params, grads, start, self.hp["mu"])
