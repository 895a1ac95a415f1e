"""FedLogit (Yang & Liu, SCALA, baseline of Tables 1–8): FedAvg whose clients train with logit adjustment, Eq. 15.

SCALA: "use (15) for local training of FL, which we refer to this method as FedLogit".
Each client minimises CE(z + log p_k, y) with p_k its label distribution over the whole
local training set (`client.label_counts`, computed once, not per batch). Classes the
client does not hold (p_k(c) = 0) are masked exactly by default: log 0 = −∞ is what Eq. 15
says, and it needs no ε (see `logit_adjusted_cross_entropy`); `missing_classes` selects
the other readings (a count floor, or the federation's total counts). The server side is FedAvg's.

The same loss with FedED's notation is FedED's L_cal (Eq. 2); FedED's Table 5 labels this
objective alone "FedLC" (the logit-adjusted form, not FedLC's τ·n^(-1/4) margins).
"""

import torch

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Panel, batched
from fedskew.fl.losses import (
    LogitAdjustment,
    MissingClassTreatment,
    log_prior,
    logit_adjusted_cross_entropy,
)


class FedLogit(MissingClassTreatment, FederatedAlgorithm):
    name = "fedlogit"
    panel = Panel.CALIBRATION
    # Eq. 15 has no hyperparameter of its own (Menon et al.'s τ is fixed to 1 in SCALA);
    # `missing_classes` (from the mixin) says how p_k(c) = 0 is treated, mask by default.

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        return logit_adjusted_cross_entropy(logits, y, self.counts_for(client.label_counts))

    @batched("local_loss")
    def logit_adjustment(self, label_counts: torch.Tensor, dtype: torch.dtype) -> LogitAdjustment:
        counts = self.counts_for(label_counts).expand_as(label_counts).to(dtype)  # [C, K]
        return LogitAdjustment(shift=log_prior(counts), masked=counts == 0)
