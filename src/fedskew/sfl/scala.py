"""SCALA (Yang & Liu, "Split Federated Learning with Concatenated Activations and Logit Adjustments").

Algorithm 2, per round: participants get B_k = |D_k|·B/Σ_j|D_j| (Eq. 3); for T local
iterations every client sends activations A_k = h(w_c,k; X_k) (Eq. 4) and labels; the
server concatenates them into one batch of ≈B and

- updates its part with the loss adjusted by log P_s (Eq. 14, step Eq. 7), where P_s is
  the label distribution of the participating clients' data;
- returns to each client G_k = ∇_{A_k} of the loss adjusted by the client's own log P_k
  (Eq. 15 in Eq. 8), computed with the server weights w_s^t *before* the step;

clients back-propagate G_k (Eq. 9); after T iterations the client parts are averaged
weighted by |D_k| (Eq. 10).

Choices where the paper is silent (all recorded in docs/split-learning.md):

- l(w_s; A_k, Y_k) in Eq. 8 is the mean over client k's B_k samples (the loss *of
  client k*), the server loss the mean over the concatenated batch. G_k therefore does
  not shrink when more clients take part.
- P_s and P_k come from whole local label counts (not from the minibatches): P_s(y) =
  Σ_{k∈C} n_{k,y} / Σ_{k∈C} |D_k| over the round's participants, P_k(y) = n_{k,y}/|D_k|.
  A class with P = 0 is masked exactly (log 0 = −∞), as in FedLogit. `missing_classes`
  (floor, global) changes the counts behind P_k only; P_s is the participants' real
  distribution, and the ablations without P_k (`scala_concat`, `scala_server_la`) do not have the option.
- With a batch-coupled server part (BatchNorm) G_k is the gradient through the
  concatenated forward pass the server actually ran; the models here have none.

Ablations (SCALA §3 and Table 5's components), selectable by name:
`scala_concat` is Algorithm 1 (concatenated activations, plain cross entropy for the
server step and for G_k); `scala_server_la` adjusts by P_s on the server only, and G_k
comes from that same server loss (restricted to client k's samples).
"""

from __future__ import annotations

import torch

from fedskew.fl.base import ClientContext, RoundResult
from fedskew.fl.losses import MissingClassTreatment
from fedskew.sfl.base import (
    PartCopy,
    SplitAlgorithm,
    SplitRound,
    adjusted_cross_entropy,
    new_traffic,
    state_bytes,
    tensor_bytes,
)


class ConcatenatedActivationsRound(SplitAlgorithm):
    """The round of SCALA and its ablations (not a method: it has no `name`).

    The registered classes derive from this one, not from each other, so that only SCALA,
    the one that adjusts by P_k, declares `missing_classes`.
    """

    server_adjusted = True      # Eq. 14 for the server step
    client_prior = "client"     # G_k from Eq. 15 ("client"), Eq. 14 ("server") or plain CE ("none")
    vectorised_clients = True   # the client parts may train stacked (training.execution)

    def run_round(self, rnd: SplitRound) -> RoundResult:
        view, clients = rnd.view, rnd.clients
        server = self.server_copy(rnd)
        workers = self.client_parts(rnd)
        streams, _ = self.streams(rnd)
        server_counts = torch.stack([c.label_counts for c in clients]).sum(dim=0)
        loss_sums = self.loss_sums(rnd)
        traffic = new_traffic()
        traffic["down_weights"] = len(clients) * state_bytes(view.client_state(rnd.global_state))
        for _ in range(self.hp["local_iterations"]):
            batches = [stream.next() for stream in streams]
            activations = workers.forward([rnd.inputs(b, c) for b, c in zip(batches, clients)])
            # What crosses the network: detached copies; the server's graph starts at them.
            received = [a.detach().requires_grad_(True) for a in activations]
            labels = [rnd.y[b] for b in batches]
            gradients, client_losses = self.server_iteration(server, received, labels, clients, server_counts)
            workers.backward(activations, gradients)
            workers.step()
            for loss_sum, loss in zip(loss_sums, client_losses):
                loss_sum += loss.detach()
            traffic["up_activations"] += tensor_bytes(*received)
            traffic["up_labels"] += tensor_bytes(*labels)
            traffic["down_gradients"] += tensor_bytes(*gradients)
        client_states = workers.states()
        traffic["up_weights"] = sum(state_bytes(s) for s in client_states)
        global_state = view.full_state(self.average(client_states, clients), server.detached_state())
        return self.result(rnd, global_state, loss_sums, self.hp["local_iterations"], traffic)

    def server_iteration(self, server: PartCopy, received: list[torch.Tensor], labels: list[torch.Tensor],
                         clients: list[ClientContext], server_counts: torch.Tensor
                         ) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
        """Lines 14–16 of Algorithm 2: forward the concatenation, G_k with w_s^t, then the server step.

        Returns G_k for every client and each client's loss l(w_s^t; A_k, Y_k).
        """
        logits = server(torch.cat(received))
        server_loss = adjusted_cross_entropy(logits, torch.cat(labels),
                                             server_counts if self.server_adjusted else None)
        # G_k (Eq. 8 with Eq. 15) with w_s^t: computed before the server steps (Eq. 7).
        sizes = [len(y) for y in labels]
        client_losses = [adjusted_cross_entropy(z, y, self._client_counts(c, server_counts))
                         for z, y, c in zip(logits.split(sizes), labels, clients)]
        gradients = torch.autograd.grad(sum(client_losses), received, retain_graph=True)
        torch.autograd.backward(server_loss, inputs=server.parameters)
        server.step()
        return gradients, [loss.detach() for loss in client_losses]

    def _client_counts(self, client: ClientContext, server_counts: torch.Tensor) -> torch.Tensor | None:
        if self.client_prior == "client":
            return self.counts_for(client.label_counts)
        return {"server": server_counts, "none": None}[self.client_prior]


class SCALA(MissingClassTreatment, ConcatenatedActivationsRound):
    name = "scala"


class SCALAConcatOnly(ConcatenatedActivationsRound):
    """Ablation: Algorithm 1 — concatenated activations, no logit adjustment anywhere."""

    name = "scala_concat"
    server_adjusted = False
    client_prior = "none"


class SCALAServerOnly(ConcatenatedActivationsRound):
    """Ablation: logit adjustment by P_s on the server; G_k from the same (Eq. 14) loss."""

    name = "scala_server_la"
    client_prior = "server"
