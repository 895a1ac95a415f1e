"""Fashion-MNIST from Debian's `dataset-fashion-mnist`, for real: prepared offline, verified by the published
md5s of the decompressed files, and decoded to the tensors torchvision gives for the same files.

Runs where the package is installed (`make test` installs it where apt-get works as root:
scripts/system-packages.sh); skipped elsewhere, saying how to install it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedskew.cli import main
from fedskew.data import sources
from tests.helpers import FASHION_PARAMS

PACKAGE = sources.OS_PACKAGES["fashionmnist"]  # read at collection, before tests/conftest.py hides it
# The official files' md5s (Zalando's fashion-mnist repository), independently of fedskew.data.datasets.torchvision_family.
PUBLISHED_MD5 = {
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}

# Skipped where the package is missing, except in CI, whose set-up installs it: there a missing package
# is a broken set-up and fails the test (CI must exercise the real files).
pytestmark = pytest.mark.skipif(
    not all((PACKAGE.folder / f"{stem}.gz").is_file() for stem in PUBLISHED_MD5) and os.environ.get("CI") != "true",
    reason=f"the OS package {PACKAGE.name} is not installed ({PACKAGE.folder} lacks its files): "
           f"sudo apt-get install {PACKAGE.name}")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A project whose fashionmnist was prepared by `python -m fedskew download fashionmnist` with the network
    closed: its only URL points at a loopback port nobody listens on."""
    import torchvision.datasets

    root = tmp_path_factory.mktemp("project")
    (root / "params.yaml").write_text(yaml.safe_dump(FASHION_PARAMS, sort_keys=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.delenv(sources.ENV_VAR, raising=False)
        patch.setattr(sources, "OS_PACKAGES", {"fashionmnist": PACKAGE})
        patch.setattr(torchvision.datasets.FashionMNIST, "mirrors", ["http://127.0.0.1:9/closed/"])
        assert main(["download", "fashionmnist"]) == 0
    return root


def test_downloads_offline_from_the_package_with_the_published_content(prepared):
    ready = json.loads((prepared / "data" / "raw" / "fashionmnist" / "READY.json").read_text())
    assert ready["shapes"] == {"x_train": [60000, 1, 28, 28], "y_train": [60000], "x_test": [10000, 1, 28, 28],
                               "y_test": [10000]}
    tensors = torch.load(prepared / ready["tensors"], weights_only=True)
    assert tensors["x_train"].dtype == torch.uint8 and tensors["y_train"].dtype == torch.int64
    assert torch.bincount(tensors["y_train"]).tolist() == [6000] * 10
    assert torch.bincount(tensors["y_test"]).tolist() == [1000] * 10
    marker = json.loads((prepared / "data" / "raw" / "fashionmnist" / "VERIFIED.json").read_text())["files"]
    for stem, md5 in PUBLISHED_MD5.items():
        entry, original = marker[f"{stem}.gz"], PACKAGE.folder / f"{stem}.gz"
        assert entry["verified_by"] == "payload-md5" and entry["payload_md5"] == md5
        assert entry["source"] == {"kind": "os-package", "path": str(original), "package": PACKAGE.name}
        assert (prepared / "data" / "raw" / "fashionmnist" / f"{stem}.gz").read_bytes() == original.read_bytes()


def test_decoded_tensors_are_torchvisions_for_the_same_files(prepared, tmp_path):
    """Decompressed, the package's files are the official ones (their md5s are the published ones), so
    torchvision's FashionMNIST reading them gives what it gives for the original archives."""
    import torchvision.datasets

    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for stem, md5 in PUBLISHED_MD5.items():
        content = gzip.decompress((PACKAGE.folder / f"{stem}.gz").read_bytes())
        assert hashlib.md5(content).hexdigest() == md5
        (raw / stem).write_bytes(content)
    ours = torch.load(prepared / "data" / "raw" / "fashionmnist" / "tensors.pt", weights_only=True)
    for split, train in (("train", True), ("test", False)):
        reference = torchvision.datasets.FashionMNIST(str(tmp_path), train=train, download=False)
        assert torch.equal(ours[f"x_{split}"], reference.data.unsqueeze(1))
        assert torch.equal(ours[f"y_{split}"], reference.targets.to(torch.int64))
    # The IDX layout read by hand agrees too: magic 2051, 60000 x 28 x 28, pixels row by row.
    images = (raw / "train-images-idx3-ubyte").read_bytes()
    assert np.frombuffer(images[:16], dtype=">u4").tolist() == [2051, 60000, 28, 28]
    assert np.array_equal(ours["x_train"][:, 0].numpy(), np.frombuffer(images[16:], np.uint8).reshape(60000, 28, 28))
