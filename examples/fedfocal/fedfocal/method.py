"""FedFocal: FedAvg whose clients train with the focal loss (Lin et al., "Focal Loss for Dense Object
Detection", ICCV 2017), FL(p_t) = −(1 − p_t)^γ log p_t, the mean over the batch.

The factor (1 − p_t)^γ down-weights the samples a client already classifies well, so that its rare
classes weigh more in its local objective; γ = 0 is exactly cross entropy, i.e. FedAvg.
"""

import torch
import torch.nn.functional as F

from fedskew.fl.base import ClientContext, Hyperparameter, Panel
from fedskew.fl.fedavg import FedAvg


def focal_loss(logits: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    """−(1 − p_t)^γ log p_t averaged over the batch; `logits` [B, K], `y` [B] class indices."""
    log_probs = F.log_softmax(logits, dim=1)
    # 1 − p as −expm1(log p) keeps its digits where p is close to 1. The floor above 0 keeps the gradient of
    # (1 − p)^γ finite for 0 < γ < 1 where p rounds to 1 (the loss's own gradient is 0 there).
    miss = (-torch.expm1(log_probs)).clamp(min=torch.finfo(log_probs.dtype).tiny)
    # nll_loss of the modulated log-probabilities: at γ = 0 the factor is exactly 1, so this is F.cross_entropy's
    # own computation (log_softmax, then nll_loss) and trains bit for bit as FedAvg.
    return F.nll_loss(miss.pow(gamma) * log_probs, y)


class FedFocal(FedAvg):
    # No docstring of its own: `python -m fedskew methods` prints the module's first paragraph, the citation.
    name = "fedfocal"  # the entry point's name in pyproject.toml: what params.yaml and experiments call it
    panel = Panel.CALIBRATION  # drawn beside the other losses for label skew
    hyperparameters = {"gamma": Hyperparameter(2.0, minimum=0, status="the focal-loss paper's default; no FL "
                                                                      "paper of fedskew uses it")}

    # Only the loss differs from FedAvg. Under `training.execution: vectorised` its clients train one after
    # another, since no batched form is marked (docs/methods.md, "Batched forms").
    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        return focal_loss(logits, y, self.hp["gamma"])
