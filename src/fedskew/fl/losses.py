"""Client-side losses shared by more than one method, and how they treat classes a client lacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from fedskew.declarations import Hyperparameter

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

    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {
        "missing_classes": Hyperparameter("mask", ref="missing_classes")}

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

    `label_counts` broadcasts against `logits` ([K] for one client's [B, K] logits). The
    vectorised path applies the same operations through FedLC's `LogitAdjustment`.
    """
    counts = label_counts.to(logits.dtype)
    return (logits - calibration_margins(counts, tau)).masked_fill(counts == 0, float("-inf"))


def calibration_margins(counts: torch.Tensor, tau: float) -> torch.Tensor:
    """FedLC's margins τ·n_c^(-1/4) (a missing class's is that of n_c = 1; the caller masks it)."""
    return tau * counts.clamp_min(1.0).pow(-0.25)


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

    `label_counts` broadcasts against `logits` ([K] for one client's [B, K] logits); the
    prior normalises over the last dimension, the classes. The vectorised path applies the
    same operations through FedLogit's `LogitAdjustment`.
    """
    counts = label_counts.to(device=logits.device, dtype=logits.dtype)
    return (logits + log_prior(counts)).masked_fill(counts == 0, float("-inf"))


def log_prior(counts: torch.Tensor) -> torch.Tensor:
    """log p(c), p(c) = n_c / Σ_j n_j over the last dimension (a missing class's is that of n_c = 1; the caller masks it)."""
    return torch.log(counts.clamp_min(1.0) / counts.sum(dim=-1, keepdim=True).clamp_min(1.0))


@dataclass(frozen=True)
class LogitAdjustment:
    """The logits a cross entropy sees, per client and class: z'_c = s_c·z_c + t_c, a masked class −∞.

    The form every logit-adjusting loss here takes for a stack of clients: FedLC's margins
    (t = −τ·n_c^(-1/4)), the label prior of FedLogit (t = log p(c)), FedRS's scales (s);
    FedAvg's plain cross entropy is the adjustment with nothing set. Each tensor is
    [C, K] (clients, classes); None means s = 1, t = 0, nothing masked. Knowing the loss
    in this form lets the vectorised path compute its gradient in closed form
    (fedskew.engine.closed_form): ∂ℓ/∂z = s ⊙ (softmax(z') − onehot(y)).
    """

    scale: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    masked: torch.Tensor | None = None

    def apply(self, logits: torch.Tensor, classes_last: bool = True) -> torch.Tensor:
        """z' for `logits` [C, B, K] (`classes_last`) or [C, K, B]: the same operations as the
        per-client losses (`calibrated_logits`, `prior_adjusted_logits`), so the same values."""
        def spread(per_class: torch.Tensor) -> torch.Tensor:
            return per_class.unsqueeze(1) if classes_last else per_class.unsqueeze(2)

        if self.scale is not None:
            logits = logits * spread(self.scale)
        if self.shift is not None:
            logits = logits + spread(self.shift)
        if self.masked is not None:
            logits = logits.masked_fill(spread(self.masked), float("-inf"))
        return logits

    def head(self, clients: int) -> LogitAdjustment:
        """The adjustment of the first `clients` clients."""
        return LogitAdjustment(*(None if t is None else t[:clients] for t in (self.scale, self.shift, self.masked)))

    def to(self, device: torch.device) -> LogitAdjustment:
        return LogitAdjustment(*(None if t is None else t.to(device) for t in (self.scale, self.shift, self.masked)))


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
