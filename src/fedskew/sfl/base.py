"""What every split-federated method shares: the round's shape, its network and its building blocks.

A round of split FL (SCALA §3.1.2, Algorithm 2, and the SplitFed family):

1. the server samples clients (the engine's schedule, the same as for FL methods) and
   sends each the client part w_c (`SplitRound.send_weights_down`);
2. for T = `local_iterations` iterations, each participating client k draws a minibatch
   of B_k samples (`minibatch_sizes`: SCALA Eq. 3 with B = `server_batch`; every SFL
   method here uses it, so that the methods differ only in what their papers change),
   computes activations A_k of its client part and sends them with their labels
   (`send_activations_up`); the server runs its part and, except in SFLLocalLoss,
   returns ∇_{A_k} (`send_gradients_down`); the client back-propagates and steps;
3. the clients send their client parts (`send_weights_up`) and the server aggregates.

A method implements one hook, `run_round(rnd) -> RoundResult`, from four helpers of
`SplitAlgorithm` (`client_parts`, `server_part`, `minibatches`, `result`) and the round's
own pieces (`SplitRound`: inputs, the four sends, `average`, `loss_sums`); docs/methods.md
shows each with an example. Each send counts what it sends in the round's `Traffic`, so a
method never counts bytes itself. The parts themselves (`PartCopy`, `ClientParts`,
`StackedClientParts`) are in fedskew.sfl.parts; vanilla split learning's steps, which the
SplitFed methods share, in fedskew.sfl.vanilla.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import torch

from fedskew.declarations import Hyperparameter
from fedskew.families import Family, Panel
from fedskew.fl.base import Algorithm, ClientContext, RoundResult, StateDict
from fedskew.fl.server_math import weighted_average
from fedskew.fl.traffic import Traffic
from fedskew.models.split import SplitView
from fedskew.sfl.parts import ClientParts, PartCopy, StackedClientParts

__all__ = ["BatchStream", "SplitAlgorithm", "SplitRound", "minibatch_sizes", "split_traffic"]

Activations = TypeVar("Activations", torch.Tensor, list[torch.Tensor])


def split_traffic() -> Traffic:
    """The kinds every split round reports, whether or not its method sends them (SplitFedV3 sends no weights,
    SFLLocalLoss no gradients)."""
    return Traffic(down=("weights", "gradients"), up=("activations", "labels", "weights"))


@dataclass
class SplitRound:
    """One round of a split method: what it starts from, and the network its tensors cross.

    The engine makes one per round. Each `send_*` returns what it was given (as the receiver
    gets it) and counts its bytes in `traffic`, the round's `RoundResult.traffic`.
    """

    round: int
    view: SplitView
    global_state: StateDict           # the full model's state (client part + server part)
    clients: list[ClientContext]      # the participants in ascending id, each with its own generator
    x: torch.Tensor                   # all training data; a client is its indices
    y: torch.Tensor
    generator: torch.Generator        # the server's randomness of this round (e.g. SplitFedV2's order)
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None  # training.augmentation
    vectorised: bool = False          # the participants' client parts train at once (StackedClientParts)
    traffic: Traffic = field(default_factory=split_traffic, init=False, repr=False)

    def inputs(self, batch: torch.Tensor, client: ClientContext) -> torch.Tensor:
        """A client's training inputs for `batch`, augmented with the client's own generator."""
        return self.x[batch] if self.augment is None else self.augment(self.x[batch], client.generator)

    def average(self, states: list[StateDict]) -> StateDict:
        """SCALA Eq. 10: the participants' states (one each, in client order) averaged weighted by |D_k|."""
        return weighted_average(states, [c.num_samples for c in self.clients])

    def loss_sums(self) -> list[torch.Tensor]:
        """One running loss per participant, on the data's device (one sync per round, not per step)."""
        return [torch.zeros((), device=self.x.device) for _ in self.clients]

    # ------------------------------------------------------------ what crosses the network
    def send_weights_down(self, state: StateDict) -> StateDict:
        """The server sends `state` (the client part, an auxiliary head) to every participant."""
        return self.traffic.send_down("weights", state, copies=len(self.clients))

    def send_activations_up(self, activations: Activations, labels: Activations) -> Activations:
        """Clients send activations (one tensor, or one per client) with their labels; the server receives them
        detached, so its graph starts at them (it marks them `requires_grad_` to take ∇_A)."""
        self.traffic.send_up("labels", labels)
        received = activations.detach() if isinstance(activations, torch.Tensor) \
            else [a.detach() for a in activations]
        return self.traffic.send_up("activations", received)

    def send_gradients_down(self, gradients: Activations) -> Activations:
        """The server returns ∇_A (one tensor, or one per client) to the clients that sent the activations."""
        return self.traffic.send_down("gradients", gradients)

    def send_weights_up(self, states: list[StateDict]) -> list[StateDict]:
        """Every participant sends its trained state (client part, auxiliary head) to the server."""
        return self.traffic.send_up("weights", states)


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


class SplitAlgorithm(Algorithm):
    """The base of split-federated methods: the engine calls `run_round` once per round."""

    family: ClassVar[Family] = Family.SPLIT
    panel: ClassVar[Panel] = Panel.SPLIT
    # Whether the round trains its client parts through `client_parts`, and so can stack them.
    vectorised_clients: ClassVar[bool] = False
    # SCALA §5.1: T = 5 local iterations per round, B = 320 samples per iteration at the server,
    # split over the participants by Eq. 3. They are method settings, not training.batch_size
    # (which stays the per-client batch of federated methods), so that FL and SFL methods can
    # share one training section and each keep its paper's protocol.
    hyperparameters = {"local_iterations": Hyperparameter(5, ref="epoch_count"),
                       "server_batch": Hyperparameter(320, ref="sample_count")}

    def run_round(self, rnd: SplitRound) -> RoundResult:
        """The method: one round from `rnd.global_state` to the round's result (`result`)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- helpers
    def client_parts(self, rnd: SplitRound, held: list[StateDict] | None = None) -> ClientParts | StackedClientParts:
        """The participants' client parts, ready to train: the global client part, sent down to every participant,
        or the parts they already hold (`held`, one per participant: SplitFedV3's personal parts, never sent).
        Stacked when the round is vectorised and the method declares `vectorised_clients`."""
        if held is None:
            held = [rnd.send_weights_down(rnd.view.client_state(rnd.global_state))] * len(rnd.clients)
        if rnd.vectorised and self.vectorised_clients:
            return StackedClientParts(rnd.view.client, held, self.settings)
        return ClientParts([PartCopy(rnd.view.client, state, self.settings) for state in held])

    def server_part(self, rnd: SplitRound) -> PartCopy:
        """A copy of the global server part, ready to train (SCALA and SplitFedV2 train one, V1/V3 one per client)."""
        return PartCopy(rnd.view.server, rnd.view.server_state(rnd.global_state), self.settings)

    def minibatches(self, rnd: SplitRound) -> list[BatchStream]:
        """Each participant's minibatches of the round, B_k samples each (Eq. 3 with B = `server_batch`)."""
        sizes = minibatch_sizes([c.num_samples for c in rnd.clients], int(self.hp["server_batch"]))
        return [BatchStream(c, b) for c, b in zip(rnd.clients, sizes)]

    def result(self, rnd: SplitRound, client_part: StateDict, server_part: StateDict,
               loss_sums: list[torch.Tensor]) -> RoundResult:
        """The round's result: the new global model from its two parts, each participant's mean loss over the
        T iterations (`loss_sums`, in client order), and the traffic the round's sends counted."""
        steps = max(int(self.hp["local_iterations"]), 1)
        return RoundResult(
            global_state=rnd.view.full_state(client_part, server_part),
            client_losses={c.client_id: float(s) / steps for c, s in zip(rnd.clients, loss_sums)},
            client_samples={c.client_id: c.num_samples for c in rnd.clients},
            traffic=rnd.traffic.counts(),
        )
