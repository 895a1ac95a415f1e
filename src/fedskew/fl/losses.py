"""Client-side losses shared by more than one method, and how they treat classes a client lacks."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

# How a method that calibrates logits by a client's label counts treats a class the client
# does not hold (n_c = 0). The options are those public implementations use:
#   mask   — the exact n → 0 limit: FedLC's margin n^(-1/4) and the prior's log p are
#            infinite, so the class drops out of the softmax (FL-bench, fluke). The literal
#            reading of every paper, and the default.
#   floor  — missing classes counted as n_c = 1 (a count floor): the class stays in the
#            softmax with the largest margin / smallest prior any held class could have.
#   global — every client calibrates by the federation's total counts Σ_k n_{k,c} instead
#            of its own (PFLlib's FedLC); only a class that no client holds is masked.
MISSING_CLASS_TREATMENTS = ("mask", "floor", "global")
IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: the label of a vectorised batch's padded row


def calibration_counts(local_counts: torch.Tensor, treatment: str,
                       global_counts: torch.Tensor | None = None) -> torch.Tensor:
    """The counts a calibrated loss uses; a zero entry means "mask this class"."""
    if treatment == "mask":
        return local_counts
    if treatment == "floor":
        return local_counts.clamp_min(1)
    if treatment == "global":
        if global_counts is None:
            raise ValueError("missing_classes: global needs every client's label counts (set_label_counts)")
        return global_counts.to(local_counts.device)
    raise ValueError(f"missing_classes must be one of {MISSING_CLASS_TREATMENTS}, got {treatment!r}")


class MissingClassTreatment:
    """Mixin for methods that calibrate by label counts: the `missing_classes` option.

    Used by FedLC (margins), FedLogit and FedED's L_cal (the prior of Eq. 15 / Eq. 2) and
    SCALA's P_k (Eq. 15 for G_k). `counts_for(local_counts)` gives the counts the loss uses.
    """

    hyperparameters: ClassVar[dict[str, Any]] = {"missing_classes": "mask"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.hp["missing_classes"] not in MISSING_CLASS_TREATMENTS:
            raise ValueError(f"{self.name}: missing_classes must be one of {MISSING_CLASS_TREATMENTS}, "
                             f"got {self.hp['missing_classes']!r}")
        self._global_counts: torch.Tensor | None = None

    def set_label_counts(self, label_counts: torch.Tensor) -> None:
        super().set_label_counts(label_counts)
        self._global_counts = torch.as_tensor(label_counts).sum(dim=0)

    def counts_for(self, local_counts: torch.Tensor) -> torch.Tensor:
        """The counts the calibrated loss of a client with `local_counts` uses."""
        return calibration_counts(local_counts, self.hp["missing_classes"], self._global_counts)


def logit_calibrated_cross_entropy(logits: torch.Tensor, y: torch.Tensor, label_counts: torch.Tensor,
                                   tau: float) -> torch.Tensor:
    """FedLC's calibrated loss (Zhang et al. 2022, Eq. 7).

    Every logit is shifted by its class margin, z'_c = z_c − τ·n_c^(-1/4), then ordinary
    cross entropy. As in every public implementation, the true class stays in the
    denominator (the paper's Σ_{i≠y} makes training collapse). A class the client does
    not hold (n_c = 0) has an infinite margin: its logit is masked exactly rather than
    approximated by a large finite margin, which keeps the loss finite and stable.
    """
    return F.cross_entropy(calibrated_logits(logits, label_counts, tau), y)


def calibrated_logits(logits: torch.Tensor, label_counts: torch.Tensor, tau: float) -> torch.Tensor:
    """FedLC's z'_c = z_c − τ·n_c^(-1/4), a missing class masked to −∞.

    `label_counts` broadcasts against `logits`: [K] for one client's [B, K] logits, or
    [C, 1, K] for the vectorised path's [C, B, K].
    """
    counts = label_counts.to(logits.dtype)
    margins = tau * counts.clamp_min(1.0).pow(-0.25)
    return (logits - margins).masked_fill(counts == 0, float("-inf"))


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
    return F.cross_entropy(prior_adjusted_logits(logits, label_counts), y)


def prior_adjusted_logits(logits: torch.Tensor, label_counts: torch.Tensor) -> torch.Tensor:
    """z'_c = z_c + log p(c), p(c) = n_c / Σ_j n_j, a missing class masked to −∞.

    `label_counts` broadcasts against `logits` ([K] or the vectorised path's [C, 1, K]);
    the prior normalises over the last dimension, the classes.
    """
    counts = label_counts.to(device=logits.device, dtype=logits.dtype)
    log_prior = torch.log(counts.clamp_min(1.0) / counts.sum(dim=-1, keepdim=True).clamp_min(1.0))
    return (logits + log_prior).masked_fill(counts == 0, float("-inf"))


def batched_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's cross entropy for a stack of clients: the vectorised path's `F.cross_entropy`.

    `logits` [C, B, K], labels `y` [C, B] with IGNORE_INDEX (-100) on padded rows, whose
    loss is 0; returns [C, B] (the engine averages each client's real rows).
    """
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # class dimension second


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
