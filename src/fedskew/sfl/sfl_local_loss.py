"""SFLLocalLoss (Han et al., "Accelerating Federated Learning with Split Learning on Locally
Generated Losses", ICML-W 2021).

Each client trains its client part with a local loss: an auxiliary classifier on its
activations (here a linear layer on the flattened activations — the smallest head that
gives a local loss; Han et al. use a small network) and plain cross entropy. It sends
its activations, *detached*, and labels; no gradient comes back. The server trains its
single server part on the activations it receives, one client after the other in a
seeded order per round (drawn from the round's server generator). After T iterations
the client parts and the auxiliary heads are averaged (|D_k|-weighted); the aux heads
are this method's state (checkpointed) and cross the network with the client parts.

Evaluation uses client part + server part (the aux head only trains the client part).
The activations the server trains on are those the client computed before its own step.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.fl.base import RoundResult, StateDict
from fedskew.sfl.base import SplitAlgorithm, SplitRound
from fedskew.sfl.parts import ClientParts, PartCopy


class SFLLocalLoss(SplitAlgorithm):
    name = "sfl_local_loss"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._aux_state: StateDict | None = None  # the global auxiliary head, averaged every round

    def run_round(self, rnd: SplitRound) -> RoundResult:
        parts = self.client_parts(rnd)
        server = self.server_part(rnd)
        heads = self.aux_heads(rnd, parts)
        batches = self.minibatches(rnd)
        loss_sums = rnd.loss_sums()
        order = torch.randperm(len(rnd.clients), generator=rnd.generator).tolist()
        for _ in range(self.hp["local_iterations"]):
            sent = []
            for client, head, stream, loss_sum in zip(parts.copies, heads.copies, batches, loss_sums):
                batch = stream.next()
                labels = rnd.y[batch]
                activations = client(rnd.inputs(batch, stream.client))
                loss = F.cross_entropy(head(activations), labels)
                loss.backward()
                client.step()
                head.step()
                loss_sum += loss.detach()
                sent.append((rnd.send_activations_up(activations, labels), labels))  # no gradient comes back
            for i in order:  # the server trains on what arrived, one client after the other
                activations, labels = sent[i]
                F.cross_entropy(server(activations), labels).backward()
                server.step()
        client_part = rnd.average(rnd.send_weights_up(parts.states()))
        self._aux_state = rnd.average(rnd.send_weights_up(heads.states()))
        return self.result(rnd, client_part, server.detached_state(), loss_sums)

    def aux_heads(self, rnd: SplitRound, parts: ClientParts) -> ClientParts:
        """The participants' auxiliary heads: the global one, sent down with the client part (created in the
        first round, its width read from one sample's activations)."""
        if self._aux_state is None:
            with torch.no_grad():
                dim = parts.copies[0](rnd.x[rnd.clients[0].indices[:1]]).flatten(1).shape[1]
            self._aux_state = self._initial_aux(dim, rnd.generator, rnd.x.device)
        module = self._aux_module(self._aux_state["1.weight"].shape[1])
        state = rnd.send_weights_down(self._aux_state)
        return ClientParts([PartCopy(module, state, self.settings) for _ in rnd.clients])

    def _aux_module(self, dim: int) -> nn.Module:
        # Structure only (meta device): its tensors come from the states passed to functional_call.
        with torch.device("meta"):
            return nn.Sequential(nn.Flatten(), nn.Linear(dim, self.num_classes))

    def _initial_aux(self, dim: int, generator: torch.Generator, device: torch.device) -> StateDict:
        # nn.Linear's default range U(−1/√d, 1/√d), drawn from the round's server generator so that
        # creating the head does not shift the global RNG (dropout) of a resumed run.
        bound = 1.0 / math.sqrt(dim)
        weight = (torch.rand(self.num_classes, dim, generator=generator) * 2 - 1) * bound
        bias = (torch.rand(self.num_classes, generator=generator) * 2 - 1) * bound
        return {"1.weight": weight.to(device), "1.bias": bias.to(device)}

    def state_dict(self) -> dict[str, Any]:
        return {} if self._aux_state is None else {"aux_head": self._aux_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._aux_state = state.get("aux_head")
