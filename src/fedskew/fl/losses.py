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


def logit_adjusted_cross_entropy(logits: torch.Tensor, y: torch.Tensor, label_counts: torch.Tensor) -> torch.Tensor:
    """Logit-adjusted cross entropy with the client's label prior (Menon et al. 2021).

    SCALA's client loss (Yang & Liu, Eq. 15; FedLogit) and FedED's L_cal (Guo et al., Eq. 2):
    z'_c = z_c + log p(c) with p(c) = n_c / Σ_j n_j from the client's whole local label
    counts, then ordinary cross entropy (−log p(y)e^{z_y} / Σ_c p(c)e^{z_c}).

    A class the client does not hold has p(c) = 0 and log p(c) = −∞: its term p(c)·e^{z_c}
    in the denominator is exactly 0, which is what the equation says, so the class is
    masked rather than approximated by log(p + ε). The mask keeps the loss finite (the
    true class of every local sample has p > 0), gives the missing class's logit exactly
    zero gradient, and needs no ε whose size would decide how strongly missing classes
    are pushed down (log ε = −18 for ε = 1e-8 is already a mask up to e^−18 anyway).
    """
    counts = label_counts.to(device=logits.device, dtype=logits.dtype)
    log_prior = torch.log(counts.clamp_min(1.0) / counts.sum().clamp_min(1.0))
    adjusted = (logits + log_prior).masked_fill(counts == 0, float("-inf"))
    return F.cross_entropy(adjusted, y)


def true_class_margin_cross_entropy(logits: torch.Tensor, y: torch.Tensor, class_counts: torch.Tensor,
                                    scale: float) -> torch.Tensor:
    """FL-FCR's calibrated loss (Eq. 13), LDAM-style (Cao et al. 2019).

    Only the true-class logit is lowered by its margin Δ_y = H / N_y^(1/4); the other
    logits are untouched and the true class stays in the denominator:
    −log e^{z_y − Δ_y} / (e^{z_y − Δ_y} + Σ_{c≠y} e^{z_c}). `class_counts` are the N_c
    the caller chose (local or summed over clients); a sample's own class always has
    N_y ≥ 1, and a zero count is treated as 1 so a mismatched table cannot produce ∞.
    """
    counts = class_counts.to(device=logits.device, dtype=logits.dtype).clamp_min(1.0)
    margins = scale * counts.pow(-0.25)
    onehot = F.one_hot(y, logits.shape[1]).to(logits.dtype)
    return F.cross_entropy(logits - onehot * margins[y].unsqueeze(1), y)
