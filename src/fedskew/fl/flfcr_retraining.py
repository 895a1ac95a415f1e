"""FL-FCR's server-side calibration (Algorithm 1, lines 26–36): virtual features drawn from the pooled class
statistics, and the classifier head retrained on them. The method is fedskew.fl.flfcr; the statistics come
from fedskew.fl.flfcr_features.

Sampling: cov_c = V Λ Vᵀ (eigh, float64), negative rounding eigenvalues clipped to 0, v = μ_c + V Λ^½ ε,
ε ~ N(0, I): exact for singular covariances (N_c ≤ d, dead ReLUs). Classes with pooled N_c < 2 have no
covariance and are not sampled; retraining masks the logits of the classes without samples, so the head
is calibrated among the classes the server has statistics for and the rows of the others stay as they were.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedskew.fl.flfcr_features import symmetric_unpack
from fedskew.numerics import exact_math
from fedskew.numerics.sgd import SGD


def sample_class_features(mean: torch.Tensor, cov: torch.Tensor, num: int, generator: torch.Generator
                          ) -> torch.Tensor:
    """`num` draws from N(mean, cov) in float64; exact for singular (positive semi-definite) cov."""
    eigenvalues, eigenvectors = torch.linalg.eigh(cov.cpu().to(torch.float64))
    factor = eigenvectors * exact_math.sqrt(eigenvalues.clamp_min(0))
    noise = torch.randn(num, mean.numel(), generator=generator, dtype=torch.float64)
    return mean.cpu().to(torch.float64) + noise @ factor.T


def virtual_features(pooled_mean: torch.Tensor, pooled_cov: torch.Tensor, sizes: list[int], classes: list[int],
                     generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`sizes[c]` features of each class c of `classes` drawn from N(μ_c, cov_c) (packed cov_c), class after
    class, with their labels."""
    dim = pooled_mean.shape[1]
    features = torch.cat([sample_class_features(pooled_mean[c], symmetric_unpack(pooled_cov[c], dim), sizes[c],
                                                generator) for c in classes])
    labels = torch.tensor(classes, dtype=torch.int64).repeat_interleave(torch.tensor([sizes[c] for c in classes]))
    return features, labels


def retrain_head(weight: torch.Tensor, bias: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                 classes: torch.Tensor, epochs: int, lr: float, batch_size: int, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain SGD on CE(features Wᵀ + b, labels) over the `classes` mask (others' logits masked)."""
    w = weight.detach().clone().requires_grad_(True)
    b = bias.detach().clone().requires_grad_(True)
    features = features.to(device=weight.device, dtype=weight.dtype)
    labels = labels.to(weight.device)
    absent = ~classes.to(weight.device)
    optimizer = SGD([w, b], lr=lr)
    n = labels.numel()
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(weight.device)
        for start in range(0, n, batch_size):
            batch = order[start:start + batch_size]
            logits = F.linear(features[batch], w, b).masked_fill(absent, float("-inf"))
            loss = F.cross_entropy(logits, labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return w.detach(), b.detach()
