"""The tiny fixed problem every method's fingerprint is taken on, prepared once a session (a pytest-xdist worker)."""

from __future__ import annotations

import argparse
import copy

import pytest
import yaml

from tests.conftest import TINY_PARAMS, single_setting

# The offline digits, Dirichlet(0.5) over 4 clients, seed 0 (the tiny suite of tests/conftest.py, one setting).
PARAMS = single_setting(copy.deepcopy(TINY_PARAMS))


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
