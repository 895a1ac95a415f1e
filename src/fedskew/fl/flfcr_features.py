"""FL-FCR's feature statistics: what a client uploads of its features (Eq. 3–4) and how the server pools
them (Eq. 5–6), one client at a time. The method is fedskew.fl.flfcr.

Eq. 5–6 are exactly the mean and the unbiased covariance of the pooled raw features, which is why the
per-client covariance must be the unbiased one of Eq. 4. Covariances travel as their upper triangles,
which is all a symmetric matrix carries.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def symmetric_pack(matrices: torch.Tensor) -> torch.Tensor:
    """[..., d, d] symmetric -> [..., d(d+1)/2]: the upper triangle, row by row."""
    rows, cols = torch.triu_indices(matrices.shape[-1], matrices.shape[-1], device=matrices.device)
    return matrices[..., rows, cols]


def symmetric_unpack(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of `symmetric_pack`: [..., d(d+1)/2] -> [..., d, d]."""
    rows, cols = torch.triu_indices(dim, dim, device=packed.device)
    out = packed.new_zeros(*packed.shape[:-1], dim, dim)
    out[..., rows, cols] = packed
    out[..., cols, rows] = packed
    return out


def class_feature_statistics(features: torch.Tensor, y: torch.Tensor, num_classes: int
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One client's Eq. 3–4, in float64, in the uploaded layout.

    Returns counts N_{c,k} [C]; means μ_{c,k} [m1, d] of the classes with N ≥ 1 (ascending);
    unbiased covariances cov_{c,k} (divisor N − 1) of the classes with N ≥ 2, as packed upper
    triangles [m2, d(d+1)/2].
    """
    v = features.detach().to(torch.float64).reshape(features.shape[0], -1)
    y = y.to(v.device)
    counts = torch.bincount(y, minlength=num_classes)[:num_classes]
    means, covs = [], []
    for c in range(num_classes):
        n = int(counts[c])
        if n == 0:
            continue
        vc = v[y == c]
        mean = vc.mean(dim=0)
        means.append(mean)
        if n >= 2:
            centred = vc - mean
            covs.append(symmetric_pack(centred.T @ centred / (n - 1)))
    dim = v.shape[1]
    return (counts, torch.stack(means) if means else v.new_zeros(0, dim),
            torch.stack(covs) if covs else v.new_zeros(0, dim * (dim + 1) // 2))


def feature_statistics_message(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict[str, torch.Tensor]:
    """What a client uploads of its features: Eq. 3–4 in `class_feature_statistics`' layout, in the
    features' dtype (counts N_{c,k} of all classes; means of the classes with N ≥ 1; packed
    covariances of the classes with N ≥ 2)."""
    counts, means, covs = class_feature_statistics(features, y, num_classes)
    return {"counts": counts, "means": means.to(features.dtype), "covs": covs.to(features.dtype)}


def body_features(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`model.body(x)` in chunks of 1024 rows (a client's whole local set at once could exhaust memory)."""
    return torch.cat([model.body(x[i:i + 1024]) for i in range(0, x.shape[0], 1024)])


class ClassStatisticsPool:
    """Eq. 5–6, accumulated one client at a time from statistics in `class_feature_statistics`' layout.

    Pairwise form of Chan et al. (1979): with M2 = (N − 1)·cov, merging (n_a, μ_a, M2_a) with
    (n_b, μ_b, M2_b) gives n = n_a + n_b, μ = μ_a + δ·n_b/n and M2 = M2_a + M2_b + δδᵀ·n_a n_b/n,
    δ = μ_b − μ_a. Summed over clients this is Σ_k (N_{c,k}−1)cov_{c,k} + Σ_k N_{c,k}μ_{c,k}μ_{c,k}ᵀ
    − N_c μ_c μ_cᵀ, i.e. Eq. 6 times N_c − 1, without subtracting large nearly equal terms, and
    it never holds more than one client's statistics besides the running totals (float64, on
    the CPU). A client with N_{c,k} = 1 adds its mean and no covariance (its M2 is 0: "we
    exclude sample covariance estimates of clients with N_{c,k} < 2").
    """

    def __init__(self, num_classes: int, dim: int) -> None:
        self.total = torch.zeros(num_classes, dtype=torch.float64)
        self.mean = torch.zeros(num_classes, dim, dtype=torch.float64)
        self.m2 = torch.zeros(num_classes, dim * (dim + 1) // 2, dtype=torch.float64)
        self.rows, self.cols = torch.triu_indices(dim, dim)

    def add(self, counts: torch.Tensor, means: torch.Tensor, covs: torch.Tensor) -> None:
        """Merge one client's N_{c,k} [C], μ_{c,k} [m1, d] and packed cov_{c,k} [m2, d(d+1)/2]."""
        n_b = counts.cpu().to(torch.float64)
        present, with_cov = n_b >= 1, n_b >= 2
        mean_b = torch.zeros_like(self.mean)
        mean_b[present] = means.cpu().to(torch.float64)
        m2_b = torch.zeros_like(self.m2)
        m2_b[with_cov] = covs.cpu().to(torch.float64) * (n_b[with_cov] - 1).unsqueeze(1)
        n = self.total + n_b
        delta = mean_b - self.mean
        share = torch.where(present, n_b / n.clamp_min(1), torch.zeros_like(n_b))
        cross = torch.where(present, self.total * n_b / n.clamp_min(1), torch.zeros_like(n_b))
        self.mean = self.mean + delta * share.unsqueeze(1)
        self.m2 = self.m2 + m2_b + (delta[:, self.rows] * delta[:, self.cols]) * cross.unsqueeze(1)
        self.total = n

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """N_c [C], μ_c [C, d] and the packed cov_c [C, d(d+1)/2] (0 where N_c < 2, undefined)."""
        cov = self.m2 / (self.total - 1).clamp_min(1).unsqueeze(1)
        cov[self.total < 2] = 0
        return self.total.round().to(torch.int64), self.mean, cov


def pool_class_statistics(clients: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], num_classes: int,
                          dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 5–6 over clients given in `class_feature_statistics`' layout (`ClassStatisticsPool` in one call).

    Returns N_c [C], μ_c [C, d] and the packed cov_c [C, d(d+1)/2] (0 where N_c < 2, undefined).
    """
    pool = ClassStatisticsPool(num_classes, dim)
    for counts, means, covs in clients:
        pool.add(counts, means, covs)
    return pool.result()
