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
comes from that same server loss (restricted to client k's samples). Each is a choice of
`SCALALoss` for the two losses.
"""

from __future__ import annotations

from enum import Enum

import torch
import torch.nn.functional as F

from fedskew.fl.base import ClientContext, RoundResult
from fedskew.fl.losses import MissingClassTreatment, logit_adjusted_cross_entropy
from fedskew.sfl.base import SplitAlgorithm, SplitRound
from fedskew.sfl.parts import PartCopy


class SCALALoss(Enum):
    """A loss of SCALA's round: cross entropy of the logits adjusted by the log of a label prior, or plain."""

    CLIENT_PRIOR = "Eq. 15: log P_k, the client's own label distribution (its `missing_classes` treatment)"
    SERVER_PRIOR = "Eq. 14: log P_s, the label distribution of the round's participants' data pooled"
    PLAIN_CROSS_ENTROPY = "no adjustment: plain cross entropy (Algorithm 1)"


class ConcatenatedActivationsRound(SplitAlgorithm):
    """The round of SCALA and its ablations (not a method: it has no `name`).

    The registered classes derive from this one, not from each other, so that only SCALA,
    the one that adjusts by P_k, declares `missing_classes`.
    """

    server_loss = SCALALoss.SERVER_PRIOR    # the server step's loss (Eq. 14 in Eq. 7)
    gradient_loss = SCALALoss.CLIENT_PRIOR  # the loss whose ∇_{A_k} is G_k (Eq. 15 in Eq. 8)
    vectorised_clients = True               # the client parts may train stacked (training.execution)

    def run_round(self, rnd: SplitRound) -> RoundResult:
        clients = rnd.clients
        server = self.server_part(rnd)
        parts = self.client_parts(rnd)
        batches = self.minibatches(rnd)
        server_counts = torch.stack([c.label_counts for c in clients]).sum(dim=0)
        loss_sums = rnd.loss_sums()
        for _ in range(self.hp["local_iterations"]):
            drawn = [stream.next() for stream in batches]
            activations = parts.forward([rnd.inputs(b, c) for b, c in zip(drawn, clients)])
            labels = [rnd.y[b] for b in drawn]
            received = [a.requires_grad_(True) for a in rnd.send_activations_up(activations, labels)]
            gradients, client_losses = self.server_iteration(server, received, labels, clients, server_counts)
            parts.backward(activations, rnd.send_gradients_down(gradients))
            parts.step()
            for loss_sum, loss in zip(loss_sums, client_losses):
                loss_sum += loss
        client_part = rnd.average(rnd.send_weights_up(parts.states()))
        return self.result(rnd, client_part, server.detached_state(), loss_sums)

    def server_iteration(self, server: PartCopy, received: list[torch.Tensor], labels: list[torch.Tensor],
                         clients: list[ClientContext], server_counts: torch.Tensor
                         ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Lines 14–16 of Algorithm 2: forward the concatenation, G_k with w_s^t, then the server step.

        Returns G_k for every client and each client's (detached) loss l(w_s^t; A_k, Y_k).
        """
        logits = server(torch.cat(received))
        step_loss = self.cross_entropy(self.server_loss, logits, torch.cat(labels), None, server_counts)
        # G_k (Eq. 8 with Eq. 15) with w_s^t: computed before the server steps (Eq. 7).
        sizes = [len(y) for y in labels]
        client_losses = [self.cross_entropy(self.gradient_loss, z, y, c, server_counts)
                         for z, y, c in zip(logits.split(sizes), labels, clients)]
        gradients = torch.autograd.grad(sum(client_losses), received, retain_graph=True)
        torch.autograd.backward(step_loss, inputs=server.parameters)
        server.step()
        return list(gradients), [loss.detach() for loss in client_losses]

    def cross_entropy(self, loss: SCALALoss, logits: torch.Tensor, y: torch.Tensor, client: ClientContext | None,
                      server_counts: torch.Tensor) -> torch.Tensor:
        """`loss` of `logits`: adjusted by `client`'s P_k, by P_s (from `server_counts`), or plain."""
        counts = self.prior_counts(loss, client, server_counts)
        return F.cross_entropy(logits, y) if counts is None else logit_adjusted_cross_entropy(logits, y, counts)

    def prior_counts(self, loss: SCALALoss, client: ClientContext | None,
                     server_counts: torch.Tensor) -> torch.Tensor | None:
        """The label counts of `loss`'s prior (a zero count masks its class), None for plain cross entropy."""
        if loss is SCALALoss.CLIENT_PRIOR:
            return self.counts_for(client.label_counts)
        return server_counts if loss is SCALALoss.SERVER_PRIOR else None


class SCALA(MissingClassTreatment, ConcatenatedActivationsRound):
    name = "scala"


class SCALAConcatOnly(ConcatenatedActivationsRound):
    """Ablation: Algorithm 1 — concatenated activations, no logit adjustment anywhere."""

    name = "scala_concat"
    server_loss = SCALALoss.PLAIN_CROSS_ENTROPY
    gradient_loss = SCALALoss.PLAIN_CROSS_ENTROPY


class SCALAServerOnly(ConcatenatedActivationsRound):
    """Ablation: logit adjustment by P_s on the server; G_k from the same (Eq. 14) loss."""

    name = "scala_server_la"
    gradient_loss = SCALALoss.SERVER_PRIOR
