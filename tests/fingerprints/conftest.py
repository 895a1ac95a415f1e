"""The tiny fixed problem every method's fingerprint is taken on, prepared once a session (a pytest-xdist worker)."""

from __future__ import annotations

import argparse

import pytest
import yaml

from tests.fingerprints.digests import PARAMS


@pytest.fixture(scope="session")
def project(tmp_path_factory):
    """A project with the tiny problem's params.yaml, the digits prepared and the partition drawn."""
    from fedskew.cli import cmd_partition
    from fedskew.config import load_params
    from fedskew.data.registry import prepare

    root = tmp_path_factory.mktemp("fingerprints")
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("FEDSKEW_TRACKING", "0")
        params = load_params(root / "params.yaml")
        prepare("digits", params.dataset_spec("digits"))
        cmd_partition(params, argparse.Namespace(dataset="digits", partition="dir0.5", seed=0))
    return root
