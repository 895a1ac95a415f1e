"""scikit-learn's 8x8 handwritten digits (UCI's Optical Recognition of Handwritten Digits test set).

Source: the 1,797 images that ship inside scikit-learn (`sklearn.datasets.load_digits`), so nothing is
downloaded and nothing can be missing; their bytes are those of the installed scikit-learn, pinned by
requirements.lock, and the prepared tensors are verified by the manifest's sha256 as every source's are.
Split once, stratified, into train and test by `test_fraction` and `seed`. The default suite's dataset.
"""

from __future__ import annotations

import numpy as np
import torch

from fedskew.data.datasets.base import GeneratedSource
from fedskew.declarations import Hyperparameter


def load_digits_split(test_fraction: float = 0.2, seed: int = 0) -> dict[str, torch.Tensor]:
    """The 8×8 digits that ship with scikit-learn, split once into a stratified train/test set.

    Pixels stay as integers 0..16 (uint8, shape [N, 1, 8, 8]); normalisation happens at load.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.uint8)[:, None, :, :]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=test_fraction, stratify=digits.target, random_state=seed
    )
    return {
        "x_train": torch.from_numpy(np.ascontiguousarray(x_train)),
        "y_train": torch.from_numpy(y_train.astype(np.int64)),
        "x_test": torch.from_numpy(np.ascontiguousarray(x_test)),
        "y_test": torch.from_numpy(y_test.astype(np.int64)),
    }


class Digits(GeneratedSource):
    name = "digits"
    pixel_max = 16.0  # the digits' pixels are integers 0..16
    input_shape = (1, 8, 8)
    num_classes = 10
    # scikit-learn's stratified split of its 1797 images (fedskew.data.sizes computes the split's counts)
    options = {"test_fraction": Hyperparameter(0.2, exclusive_minimum=0, exclusive_maximum=1),
               "seed": Hyperparameter(0, ref="seed")}

    def generate(self, spec: dict) -> dict[str, torch.Tensor]:
        return load_digits_split(spec["test_fraction"], spec["seed"])
