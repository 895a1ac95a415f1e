"""Client-side losses shared by more than one method."""

import torch
import torch.nn.functional as F


def logit_calibrated_cross_entropy(logits: torch.Tensor, y: torch.Tensor, label_counts: torch.Tensor,
                                   tau: float) -> torch.Tensor:
    """FedLC's calibrated loss (Zhang et al. 2022, Eq. 7).

    Every logit is shifted by its class margin, z'_c = z_c − τ·n_c^(-1/4), then ordinary
    cross entropy. As in every public implementation, the true class stays in the
    denominator (the paper's Σ_{i≠y} makes training collapse). A class the client does
    not hold (n_c = 0) has an infinite margin: its logit is masked exactly rather than
    approximated by a large finite margin, which keeps the loss finite and stable.
    """
    counts = label_counts.to(logits.dtype)
    margins = tau * counts.clamp_min(1.0).pow(-0.25)
    adjusted = (logits - margins).masked_fill(counts == 0, float("-inf"))
    return F.cross_entropy(adjusted, y)
