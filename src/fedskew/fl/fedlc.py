"""FedLC (Zhang et al., ICML 2022): logit calibration with per-class margins τ·n_c^(-1/4).

A class the client lacks has an infinite margin in Eq. 7 as printed (n_c = 0): the
default `missing_classes: mask` takes that literally; `floor` and `global` are the other
readings public code uses (see `fedskew.fl.losses.MISSING_CLASS_TREATMENTS`). With the
mask, a client holding a single class has a loss of exactly 0 and never learns.
"""

import torch

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Hyperparameter, Panel, batched
from fedskew.fl.losses import (
    LogitAdjustment,
    MissingClassTreatment,
    calibration_margins,
    logit_calibrated_cross_entropy,
)


class FedLC(MissingClassTreatment, FederatedAlgorithm):
    name = "fedlc"
    panel = Panel.CALIBRATION
    # Recorded with every table.
    hyperparameters = {"tau": Hyperparameter(1.0, minimum=0, status="paper silent; public implementations use "
                                                                     "0.1, 0.5 or 1.0")}

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        return logit_calibrated_cross_entropy(logits, y, self.counts_for(client.label_counts), self.hp["tau"])

    @batched("local_loss")
    def logit_adjustment(self, label_counts: torch.Tensor, dtype: torch.dtype) -> LogitAdjustment:
        counts = self.counts_for(label_counts).expand_as(label_counts).to(dtype)  # [C, K]
        return LogitAdjustment(shift=-calibration_margins(counts, self.hp["tau"]), masked=counts == 0)
