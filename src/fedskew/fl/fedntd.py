"""FedNTD (Lee et al., NeurIPS 2022): not-true distillation from the round's global model.

Local training under label skew forgets what the global model knows about the classes
a client sees little of. FedNTD keeps that knowledge by distilling the global model's
predictions on the *not-true* classes only (the true class is left to cross entropy):

    L = CE(z, y) + β·τ²·KL( softmax(z̃_g/τ) ‖ softmax(z̃/τ) )

where z̃ and z̃_g are the local and global logits with the true-class column removed
(softmax over the C − 1 remaining classes), the KL is summed over classes and averaged
over the batch (KLDivLoss 'batchmean', as in the official code). τ = 1, β = 1 are the
official configuration's values.

The teacher is ONE frozen module (`inference_model`), re-loaded with the round's global
state at the start of every client (eval mode, no gradients) and put in the client's
scratch; nothing persists across rounds, so the method keeps no checkpoint state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Hyperparameter, Panel, StateDict, Switch


def drop_true_class(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits without each row's true-class column: shape [N, C − 1], order kept."""
    n, c = logits.shape
    keep = torch.ones_like(logits, dtype=torch.bool).scatter_(1, y.view(-1, 1), False)
    return logits[keep].view(n, c - 1)


def not_true_distillation(logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor,
                          tau: float) -> torch.Tensor:
    """τ²·KL(softmax(z̃_g/τ) ‖ softmax(z̃/τ)), summed over classes, mean over the batch."""
    if logits.shape[1] < 2:  # one class: nothing is "not true"
        return logits.sum() * 0.0
    student = F.log_softmax(drop_true_class(logits, y) / tau, dim=1)
    teacher = F.log_softmax(drop_true_class(teacher_logits.detach(), y) / tau, dim=1)
    # log_target: the teacher as log-probabilities, so a probability that underflows to 0 gives 0, not NaN
    return tau ** 2 * F.kl_div(student, teacher, reduction="batchmean", log_target=True)


class FedNTD(FederatedAlgorithm):
    name = "fedntd"
    # The official config (Lee et al.'s repository): τ = 1, β = 1.
    panel = Panel.DRIFT
    hyperparameters = {"tau": Hyperparameter(1.0, exclusive_minimum=0), "beta": Hyperparameter(1.0, minimum=0)}
    switches = (Switch("beta", "no distillation", ("tau",)),)

    def begin_local(self, model: nn.Module, global_state: StateDict, client: ClientContext) -> None:
        super().begin_local(model, global_state, client)
        client.scratch["ntd_teacher"] = self.inference_model("teacher", model, global_state)

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        teacher = client.scratch.get("ntd_teacher")
        if x is None or teacher is None:
            raise RuntimeError("fedntd: local_loss needs the batch input x and begin_local before it "
                               "(the global teacher runs on x)")
        with torch.no_grad():
            teacher_logits = teacher(x)
        loss = F.cross_entropy(logits, y)
        return loss + self.hp["beta"] * not_true_distillation(logits, teacher_logits, y, self.hp["tau"])
