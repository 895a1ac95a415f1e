"""FedRS (Li & Zhan, KDD 2021): restricted softmax, logits of classes a client lacks are scaled down.

Under label skew a client's cross entropy pushes the classifier weights of classes it
does not hold away from every feature it sees ("proxy suppression"). FedRS multiplies
each logit by a class factor s_c ≤ 1 before the softmax, so the classes the client
lacks take part in the softmax with damped scores and their classifier rows receive
gradients scaled by s_c. Two registered versions:

- `fedrs`      (hard, the paper's Eq.): s_c = 1 if n_c > 0 else α
- `fedrs_soft` (the official code):     s_c = α + (1 − α)·n_c / max_j n_j

n_c counts class c in the client's whole local set (`client.label_counts`). Only the
training loss changes; the model and the evaluation are FedAvg's.

Deviation (bias): the paper and official code use a bias-free classifier,
z_c = s_c·(W_c·f). Our heads have a bias, and we scale the whole logit,
z'_c = s_c·(W_c·f + b_c). Reason: the method exists to restrict the updates of
missing-class parameters; scaling only W_c·f and adding b_c would leave the bias of a
missing class the full, unrestricted downward push (∂L/∂b_c = p_c instead of s_c·p_c),
which is exactly the bias under label skew FedRS targets. With b = 0 the two coincide,
and the FedDecorr authors' FedRS port also scales the full output of a biased head.
"""

import torch
import torch.nn.functional as F

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Hyperparameter, Panel, batched
from fedskew.fl.losses import LogitAdjustment


class FedRS(FederatedAlgorithm):
    """Hard restricted softmax: classes absent from the client get scale α, present ones 1."""

    name = "fedrs"
    panel = Panel.CALIBRATION
    # α ∈ {0.9, 0.5} in the paper; 0.5 is the official code's and FedDecorr's port default.
    hyperparameters = {"alpha": Hyperparameter(0.5, minimum=0, maximum=1)}

    def class_scales(self, label_counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """s_c per class: [K] for one client's counts [K], [C, K] for a stack of clients' [C, K]."""
        counts = label_counts.to(dtype)
        alpha = torch.full_like(counts, self.hp["alpha"])
        return torch.where(counts > 0, torch.ones_like(counts), alpha)

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        scales = self.class_scales(client.label_counts, logits.dtype).to(logits.device)
        return F.cross_entropy(logits * scales, y)

    @batched("local_loss")
    def logit_adjustment(self, label_counts: torch.Tensor, dtype: torch.dtype) -> LogitAdjustment:
        return LogitAdjustment(scale=self.class_scales(label_counts, dtype))


class FedRSSoft(FedRS):
    """Soft restricted softmax of the official code: s_c = α + (1 − α)·n_c / max_j n_j."""

    name = "fedrs_soft"
    hyperparameters = {"alpha": Hyperparameter(0.5, minimum=0, maximum=1)}

    def class_scales(self, label_counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        counts = label_counts.to(dtype)
        alpha = self.hp["alpha"]
        # clamp: a client without samples never trains, but keep the division defined
        return alpha + (1.0 - alpha) * counts / counts.amax(dim=-1, keepdim=True).clamp_min(1.0)
