"""What every split-federated method shares: the round's shape and its building blocks.

A round of split FL (SCALA §3.1.2, Algorithm 2, and the SplitFed family):

1. the server samples clients (the engine's schedule, the same as for FL methods) and
   sends each the client part w_c (counted as `down_weights`);
2. for T = `local_iterations` iterations, each participating client k draws a minibatch
   of B_k samples (`minibatch_sizes`: SCALA Eq. 3 with B = `server_batch`; every SFL
   method here uses it, so that the methods differ only in what their papers change),
   computes activations A_k of its client part and sends them with their labels
   (`up_activations`, `up_labels`); the server runs its part and, except in
   SFLLocalLoss, returns ∇_{A_k} (`down_gradients`); the client back-propagates and steps;
3. the clients send their client parts (`up_weights`) and the server aggregates.

A method implements `run_round`. Every client part and every per-client server copy
is a `PartCopy`: a dict of tensors run through the shared module with
`torch.func.functional_call`, so a round holds one copy per *participant* (never one
per registered client) and the model object itself is never mutated.

With `training.execution` vectorised (or auto on a GPU), a method that declares
`vectorised_clients` runs its participants' client parts at once (`StackedClientParts`):
their parameters stacked along a leading client dimension, one forward under `vmap` over
the minibatches padded to the largest B_k, one backward, one SGD update of the stack.
The server side is unchanged. The minibatches are the same, so the two paths agree to
float round-off. `ClientParts` and `StackedClientParts` share one interface (forward a
list of per-client inputs, backward their activations' gradients, step, states).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedskew.fl.base import (
    Algorithm,
    ClientContext,
    RoundResult,
    StateDict,
    TrainingSettings,
    local_optimizer,
    weighted_average,
)
from fedskew.fl.losses import logit_adjusted_cross_entropy
from fedskew.models.split import SplitView
from fedskew.numerics.sgd import sgd_update


@dataclass
class SplitRound:
    """Everything a split method needs for one round."""

    round: int
    view: SplitView
    global_state: StateDict           # the full model's state (client part + server part)
    clients: list[ClientContext]      # the participants in ascending id, each with its own generator
    x: torch.Tensor                   # all training data; a client is its indices
    y: torch.Tensor
    generator: torch.Generator        # the server's randomness of this round (e.g. SplitFedV2's order)
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None  # training.augmentation
    vectorised: bool = False          # the participants' client parts train at once (StackedClientParts)

    def inputs(self, batch: torch.Tensor, client: ClientContext) -> torch.Tensor:
        """A client's training inputs for `batch`, augmented with the client's own generator."""
        return self.x[batch] if self.augment is None else self.augment(self.x[batch], client.generator)


def minibatch_sizes(client_sizes: list[int], batch_size: int) -> list[int]:
    """SCALA Eq. 3: B_k = |D_k|·B / Σ_j |D_j| over the participants.

    Rounded half up, at least 1 (every participant takes part in every iteration) and at
    most |D_k| (a client cannot send more distinct samples than it holds). Rounding makes
    Σ B_k differ from B by at most one sample per client; the exact sizes are logged with
    the traffic they cause.
    """
    total = sum(client_sizes)
    return [min(size, max(1, math.floor(size * batch_size / total + 0.5))) for size in client_sizes]


class BatchStream:
    """A client's minibatches for one round: a reshuffled pass over its data, `size` at a time.

    A batch never straddles two passes: when fewer than `size` samples are left, a new
    permutation is drawn from the client's own generator (order-free across clients).
    """

    def __init__(self, client: ClientContext, size: int):
        self.client, self.size = client, size
        self._order = torch.empty(0, dtype=torch.long)

    def next(self) -> torch.Tensor:
        if self._order.numel() < self.size:
            self._order = self.client.indices[torch.randperm(self.client.num_samples,
                                                             generator=self.client.generator)]
        batch, self._order = self._order[:self.size], self._order[self.size:]
        return batch


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
    """The participants' client parts, one `PartCopy` each, trained one after another."""

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


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def state_bytes(state: StateDict) -> int:
    return sum(tensor_bytes(v) for v in state.values())


def adjusted_cross_entropy(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
    """Cross entropy with logits adjusted by log P(y) from `counts` (SCALA Eq. 14/15); plain CE for None."""
    return F.cross_entropy(logits, y) if counts is None else logit_adjusted_cross_entropy(logits, y, counts)


class SplitAlgorithm(Algorithm):
    """The base of split-federated methods: the engine calls `run_round` once per round."""

    family: ClassVar[str] = "split"
    # Whether the round trains its client parts through `client_parts`, and so can stack them.
    vectorised_clients: ClassVar[bool] = False
    # SCALA §5.1: T = 5 local iterations per round, B = 320 samples per iteration at the server,
    # split over the participants by Eq. 3. They are method settings, not training.batch_size
    # (which stays the per-client batch of federated methods), so that FL and SFL methods can
    # share one training section and each keep its paper's protocol.
    hyperparameters = {"local_iterations": 5, "server_batch": 320}

    def run_round(self, rnd: SplitRound) -> RoundResult:
        raise NotImplementedError

    # ----------------------------------------------------------------- helpers
    def client_copies(self, rnd: SplitRound, state: StateDict | None = None) -> list[PartCopy]:
        """One copy of the client part per participant, from `state` (default: the global client part)."""
        state = rnd.view.client_state(rnd.global_state) if state is None else state
        return [PartCopy(rnd.view.client, state, self.settings) for _ in rnd.clients]

    def client_parts(self, rnd: SplitRound, states: list[StateDict] | None = None) -> ClientParts | StackedClientParts:
        """The participants' client parts, from `states` (one per participant; default: the global client part
        for each), stacked when the round is vectorised."""
        if states is None:
            states = [rnd.view.client_state(rnd.global_state)] * len(rnd.clients)
        if rnd.vectorised:
            return StackedClientParts(rnd.view.client, states, self.settings)
        return ClientParts([PartCopy(rnd.view.client, state, self.settings) for state in states])

    def server_copy(self, rnd: SplitRound) -> PartCopy:
        """A copy of the global server part (SCALA and SplitFedV2 train one, V1/V3 one per client)."""
        return PartCopy(rnd.view.server, rnd.view.server_state(rnd.global_state), self.settings)

    @staticmethod
    def loss_sums(rnd: SplitRound) -> list[torch.Tensor]:
        """One running loss per participant, on the data's device (one sync per round, not per step)."""
        return [torch.zeros((), device=rnd.x.device) for _ in rnd.clients]

    def streams(self, rnd: SplitRound) -> tuple[list[BatchStream], list[int]]:
        sizes = minibatch_sizes([c.num_samples for c in rnd.clients], int(self.hp["server_batch"]))
        return [BatchStream(c, b) for c, b in zip(rnd.clients, sizes)], sizes

    def train_with_server_copies(self, rnd: SplitRound, workers: ClientParts | StackedClientParts,
                                 servers: list[PartCopy], traffic: dict[str, int]) -> list[torch.Tensor]:
        """T iterations in which client k trains with its own server copy k (SplitFedV1, V3).

        The pairs are independent, so the order they step in does not matter: every client part
        forwards, then each server copy takes its step (in client order, so a server part's dropout
        draws from the round's generator in the same order whether the client parts are stacked or
        not), then every client part back-propagates the gradient its server copy returned.
        """
        streams, _ = self.streams(rnd)
        loss_sums = self.loss_sums(rnd)
        for _ in range(self.hp["local_iterations"]):
            batches = [stream.next() for stream in streams]
            activations = workers.forward([rnd.inputs(b, s.client) for b, s in zip(batches, streams)])
            gradients = []
            for server, activation, batch, loss_sum in zip(servers, activations, batches, loss_sums):
                loss, gradient = server_step(server, activation, rnd.y[batch], traffic)
                loss_sum += loss
                gradients.append(gradient)
            workers.backward(activations, gradients)
            workers.step()
        return loss_sums

    @staticmethod
    def average(states: list[StateDict], clients: list[ClientContext]) -> StateDict:
        """Eq. 10: average weighted by |D_k| over the participants."""
        return weighted_average(states, [c.num_samples for c in clients])

    @staticmethod
    def result(rnd: SplitRound, global_state: StateDict, loss_sums: list[torch.Tensor], steps: int,
               traffic: dict[str, int]) -> RoundResult:
        return RoundResult(
            global_state=global_state,
            client_losses={c.client_id: float(s) / max(steps, 1) for c, s in zip(rnd.clients, loss_sums)},
            client_samples={c.client_id: c.num_samples for c in rnd.clients},
            traffic=traffic,
        )


def split_step(worker: PartCopy, server: PartCopy, x: torch.Tensor, y: torch.Tensor,
               traffic: dict[str, int]) -> torch.Tensor:
    """One step of vanilla split learning for one client: activations up, ∇_A down, both parts step.

    Returns the (detached) cross-entropy loss.
    """
    activations = worker(x)
    loss, gradient = server_step(server, activations, y, traffic)
    activations.backward(gradient)
    worker.step()
    return loss


def server_step(server: PartCopy, activation: torch.Tensor, y: torch.Tensor,
                traffic: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The server side of vanilla split learning for one client: its activations in, cross entropy, a step.

    Returns the (detached) loss and ∇_A, the gradient sent back, taken with the server
    weights before the step (as in SCALA Eq. 8).
    """
    received = activation.detach().requires_grad_(True)
    loss = F.cross_entropy(server(received), y)
    loss.backward()  # gradients of the server part and of the received activations, with w_s^t
    server.step()
    traffic["up_activations"] += tensor_bytes(received)
    traffic["up_labels"] += tensor_bytes(y)
    traffic["down_gradients"] += tensor_bytes(received.grad)
    return loss.detach(), received.grad


def new_traffic() -> dict[str, int]:
    return {"down_weights": 0, "up_activations": 0, "up_labels": 0, "down_gradients": 0, "up_weights": 0}
