"""Copies of a model part, and the participants' client parts trained one after another or stacked.

Every client part and every per-client server copy of a round is a `PartCopy`: a dict of tensors
run through the shared module with `torch.func.functional_call`, so a round holds one copy per
*participant* (never one per registered client) and the model object itself is never mutated.

`ClientParts` (one `PartCopy` per participant) and `StackedClientParts` (every participant's
parameters stacked along a leading client dimension, one forward under `vmap`, one backward, one SGD
update of the stack) share one interface: forward a list of per-client inputs, backward their
activations' gradients, step, states. The minibatches are the same, so the two agree to float
round-off; the engine picks the stack with `training.execution` (fedskew.engine.vectorised).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, vmap

from fedskew.fl.base import StateDict, TrainingSettings, local_optimizer
from fedskew.numerics.sgd import sgd_update


class PartCopy:
    """One copy of a model part (a client's client part, a per-client server copy) with its optimiser."""

    def __init__(self, module: nn.Module, state: StateDict, settings: TrainingSettings):
        self.module = module
        names = [name for name, _ in module.named_parameters()]
        self.state = {key: value.detach().clone() for key, value in state.items()}
        self.parameters = [self.state[name].requires_grad_(True) for name in names]
        self.optimizer = local_optimizer(self.parameters, settings)

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(self.module, self.state, (inputs,))

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def detached_state(self) -> StateDict:
        return {key: value.detach().clone() for key, value in self.state.items()}


class ClientParts:
    """The participants' client parts, one `PartCopy` each (`copies`, in the round's client order)."""

    def __init__(self, copies: list[PartCopy]) -> None:
        self.copies = copies

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [copy(x) for copy, x in zip(self.copies, inputs)]

    def backward(self, activations: list[torch.Tensor], gradients: list[torch.Tensor]) -> None:
        for activation, gradient in zip(activations, gradients):
            activation.backward(gradient)

    def step(self) -> None:
        for copy in self.copies:
            copy.step()

    def states(self) -> list[StateDict]:
        return [copy.detached_state() for copy in self.copies]


class StackedClientParts:
    """The participants' client parts trained at once: each parameter stacked along a leading client
    dimension, the shared module run per client under `vmap`, one SGD update of the stack.

    A forward pads the clients' minibatches (B_k rows each) to the largest with zero rows and
    returns each client's activations as a view of its real rows; padded rows receive no
    gradient, so they change nothing. Buffers are shared (the client part must not update
    them: no batch normalisation, see `stacked_blocker`).
    """

    def __init__(self, module: nn.Module, states: list[StateDict], settings: TrainingSettings) -> None:
        self.names = [name for name, _ in module.named_parameters()]
        self.keys = list(states[0])
        self.buffers = {key: value for key, value in states[0].items() if key not in self.names}
        self.parameters = [torch.stack([state[name].detach() for state in states]).requires_grad_(True)
                           for name in self.names]
        self.momentum: list[torch.Tensor | None] = [None] * len(self.parameters)
        self.settings = settings

        def forward_one(params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return functional_call(module, ({**dict(zip(self.names, params)), **self.buffers}), (x,))

        self._forward = vmap(forward_one)

    def forward(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        rows = max(len(x) for x in inputs)
        padded = torch.stack([x if len(x) == rows else torch.cat([x, x.new_zeros((rows - len(x), *x.shape[1:]))])
                              for x in inputs])
        out = self._forward(self.parameters, padded)
        return [out[k, :len(x)] for k, x in enumerate(inputs)]

    def backward(self, activations: list[torch.Tensor], gradients: list[torch.Tensor]) -> None:
        torch.autograd.backward(activations, gradients)  # one backward pass through the stacked graph

    def step(self) -> None:
        s = self.settings
        sgd_update(self.parameters, [p.grad for p in self.parameters], self.momentum,
                   lr=s.lr, momentum=s.momentum, weight_decay=s.weight_decay)
        for p in self.parameters:
            p.grad = None

    def states(self) -> list[StateDict]:
        stacked = dict(zip(self.names, self.parameters))
        return [{key: stacked[key][k].detach().clone() if key in stacked else self.buffers[key].clone()
                 for key in self.keys} for k in range(len(self.parameters[0]) if self.parameters else 0)]


def stacked_blocker(module: nn.Module) -> str | None:
    """Why a client part cannot train stacked, or None if it can."""
    for layer in module.modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            return "its client part has batch normalisation, whose batch statistics would include padded rows"
        if isinstance(layer, nn.modules.dropout._DropoutNd):
            return "its client part has dropout, which a split client part draws from torch's global generator"
    return None
