"""Synthetic(λ, μ) of FedProx and LEAF, as FedLC's Table 4 uses it: generated from a seed, no files.

Source: nothing is fetched; the generator below (numpy's PCG64 from `seed`, with fedskew's portable CPU
kernels, so the same spec gives the same bytes on any x86-64 CPU) writes the tensors, which the
manifest's sha256 then verifies as every source's. Each client's samples carry its id
(`natural_groups`), for the natural partition.
"""

from __future__ import annotations

import numpy as np
import torch

from fedskew.data.datasets.base import GeneratedSource
from fedskew.declarations import Hyperparameter


def generate_synthetic(lam: float, mu: float, clients: int = 100, dim: int = 60,
                       classes: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    """Synthetic(λ, μ) of FedProx/LEAF, as used in FedLC's Table 4.

    Client k: u_k ~ N(0, λ²), B_k ~ N(0, μ²) (the reference generator passes λ and μ as
    standard deviations), W_k ~ N(u_k, 1)^{d×C}, b_k ~ N(u_k, 1)^C, v_k ~ N(B_k, 1)^d,
    x ~ N(v_k, Σ) with Σ = diag((j+1)^-1.2), y = argmax(x W_k + b_k); n_k =
    int(lognormal(4, 2)) + 50 samples, split 90/10 into train/test per client.

    Label skew is therefore mixed, as FedLC describes: the client-specific models
    (λ) and input means (μ) skew each client's label distribution, and the power-law
    sizes skew quantities. The natural partition is "client k owns its own samples";
    the pooled 10 % test splits form the global test set.
    """
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, clients).astype(np.int64) + 50
    u = rng.normal(0.0, lam, clients)
    b_means = rng.normal(0.0, mu, clients)
    sigma_std = np.sqrt(np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2))
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("x_train", "y_train", "g_train", "x_test", "y_test")}
    for k in range(clients):
        w = rng.normal(u[k], 1.0, (dim, classes))
        b = rng.normal(u[k], 1.0, classes)
        v = rng.normal(b_means[k], 1.0, dim)
        x = v + rng.standard_normal((sizes[k], dim)) * sigma_std
        y = np.argmax(x @ w + b, axis=1)
        n_train = int(0.9 * sizes[k])
        parts["x_train"].append(x[:n_train])
        parts["y_train"].append(y[:n_train])
        parts["g_train"].append(np.full(n_train, k))
        parts["x_test"].append(x[n_train:])
        parts["y_test"].append(y[n_train:])
    cat = {key: np.concatenate(value) for key, value in parts.items()}
    return {
        "x_train": torch.from_numpy(cat["x_train"].astype(np.float32)),
        "y_train": torch.from_numpy(cat["y_train"].astype(np.int64)),
        "natural_groups": torch.from_numpy(cat["g_train"].astype(np.int64)),
        "x_test": torch.from_numpy(cat["x_test"].astype(np.float32)),
        "y_test": torch.from_numpy(cat["y_test"].astype(np.int64)),
    }


class Synthetic(GeneratedSource):
    name = "synthetic"
    tabular = True  # feature vectors, taken as they are
    # the defaults' shape and classes; a spec's `dim` and `classes` give its own (fedskew.catalog.dataset_info)
    input_shape = (60,)
    num_classes = 10
    natural_partition = True
    options = {
        "lam": Hyperparameter(1.0, minimum=0), "mu": Hyperparameter(1.0, minimum=0),
        "clients": Hyperparameter(100, ref="sample_count"),
        # FedLC's Synthetic has 60 features and 10 classes; the logistic regression on it has dim × classes
        # weights. Its generated size (samples × dim) is bounded in fedskew.config_checks.
        "dim": Hyperparameter(60, minimum=1, maximum=10000), "classes": Hyperparameter(10, minimum=2, maximum=1000),
        "seed": Hyperparameter(0, ref="seed"),
    }

    def generate(self, spec: dict) -> dict[str, torch.Tensor]:
        return generate_synthetic(spec["lam"], spec["mu"], spec["clients"], spec["dim"], spec["classes"], spec["seed"])
