"""FedDecorr (Shi et al., ICLR 2023): decorrelate the penultimate features to avoid dimensional collapse.

Under heterogeneous data, local training collapses the representation onto a few
directions (the features' covariance has few large eigenvalues). FedDecorr adds a
penalty on the correlations between feature dimensions within a minibatch:

    L = CE(z, y) + β·L_decorr(F),   F = model.body(x) (the head's input), shape [N, d]
    Ẑ = (F − mean) / sqrt(var + 1e-8)     per dimension over the batch, unbiased var
    L_decorr = mean_{i≠j} ((ẐᵀẐ)_ij)² / N

Normalisation: the paper writes (1/d²)·‖K‖_F² with K the correlation matrix; the
official code (`FedDecorrLoss`) computes the formula above: the off-diagonal entries of
ẐᵀẐ (not divided by N − 1, so ≈ (N − 1)·K_ij), squared, averaged over the d(d − 1)
off-diagonal entries, then divided by N. Up to the diagonal (constant d, no gradient)
that is the paper's term times (N − 1)²/N · d/(d − 1). We follow the code, since β = 0.1
(CIFAR10) and 0.05 (CIFAR100) were tuned with it; note the effective weight thus grows
with the batch size. A batch of one has no correlation: the penalty is 0 (as in the code).
"""

import torch
import torch.nn.functional as F

from fedskew.fl.base import ClientContext, FederatedAlgorithm, Hyperparameter, Panel
from fedskew.numerics import exact_math

EPS = 1e-8  # inside the square root, as in the official code


def decorrelation_penalty(features: torch.Tensor) -> torch.Tensor:
    """mean over i ≠ j of ((ẐᵀẐ)_ij)², divided by the batch size N; 0 for N = 1."""
    features = features.flatten(1)
    n, d = features.shape
    if n < 2 or d < 2:  # no batch statistics, or no pair of dimensions
        return features.sum() * 0.0
    centred = features - features.mean(dim=0, keepdim=True)
    z = centred / exact_math.sqrt(EPS + centred.var(dim=0, keepdim=True))  # unbiased var (N − 1), as the code
    gram = z.t() @ z
    off_diagonal = gram[~torch.eye(d, dtype=torch.bool, device=gram.device)]
    return off_diagonal.pow(2).mean() / n


class FedDecorr(FederatedAlgorithm):
    name = "feddecorr"
    # β = 0.1: the official run scripts for CIFAR10 and TinyImageNet (CIFAR100 uses 0.05).
    panel = Panel.DRIFT
    hyperparameters = {"beta": Hyperparameter(0.1, minimum=0)}

    def local_loss(self, logits: torch.Tensor, features: torch.Tensor, y: torch.Tensor,
                   client: ClientContext, x: torch.Tensor | None = None) -> torch.Tensor:
        return F.cross_entropy(logits, y) + self.hp["beta"] * decorrelation_penalty(features)
