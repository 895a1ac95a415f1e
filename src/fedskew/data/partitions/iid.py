"""``iid`` (clients): uniformly random split into ``m`` equal-as-possible parts."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedskew.data.partitions.base import Scheme
from fedskew.data.partitions.parameters import Parameter


class Iid(Scheme):
    name = "iid"
    parameters = {"clients": Parameter(int, ref="sample_count")}

    @staticmethod
    def sample(labels: np.ndarray, num_classes: int, params: dict[str, Any], rng: np.random.Generator,
               natural_groups: np.ndarray | None = None, dataset: str = "") -> list[np.ndarray]:
        """Random permutation cut into ``clients`` parts whose sizes differ by at most one."""
        perm = rng.permutation(len(labels)).astype(np.int64)
        return list(np.array_split(perm, params["clients"]))
