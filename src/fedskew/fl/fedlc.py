"""FedLC (Zhang et al., ICML 2022): logit calibration with per-class margins τ·n_c^(-1/4)."""

import torch

from fedskew.fl.base import ClientContext, FederatedAlgorithm
from fedskew.fl.losses import logit_calibrated_cross_entropy


class FedLC(FederatedAlgorithm):
    name = "fedlc"
    # The paper gives no τ; public implementations use 0.1, 0.5 or 1.0. Recorded with every table.
    hyperparameters = {"tau": 1.0}

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        return logit_calibrated_cross_entropy(logits, y, client.label_counts, self.hp["tau"])
