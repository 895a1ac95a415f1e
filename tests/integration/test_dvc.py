"""DVC on top of Snakemake: a parameter change re-runs exactly the phases and runs it affects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import venv_bin
from tests.integration.test_workflow import make_copy, run

pytestmark = pytest.mark.slow


def stale_stages(root: Path) -> set[str]:
    result = run([venv_bin("dvc"), "status", "--json"], root)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout or "{}"))


def metrics_mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.glob("results/runs/**/metrics.json")}


def test_dvc_repro_reruns_only_what_a_training_change_affects(tmp_path, tiny_params):
    # Two datasets so that a change to one dataset's training settings has something to spare.
    tiny_params["suites"]["tiny"]["settings"] = [{"dataset": "digits", "partitions": ["dir0.5"]},
                                                 {"dataset": "synth", "partitions": ["natural"]}]
    tiny_params["suites"]["tiny"]["methods"] = ["fedavg"]
    tiny_params["training"]["tiny"]["overrides"] = {"synth": {"model": "logreg"}}
    root = make_copy(tmp_path, tiny_params)
    for cmd in (["git", "init", "-q"], [venv_bin("dvc"), "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        assert run(cmd, root).returncode == 0

    first = run([venv_bin("dvc"), "repro"], root, FEDSKEW_TRACKING="0")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert stale_stages(root) == set()
    before = metrics_mtimes(root)
    assert len(before) == 2 * 2  # (dir0.5, natural) x 2 seeds

    # Change the learning rate of the synthetic dataset only.
    tiny_params["training"]["tiny"]["overrides"]["synth"]["lr"] = 0.02
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params, sort_keys=False))
    assert stale_stages(root) == {"train@tiny", "aggregate@tiny"}

    second = run([venv_bin("dvc"), "repro"], root, FEDSKEW_TRACKING="0")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    after = metrics_mtimes(root)
    retrained = {path for path in before if after[path] != before[path]}
    assert retrained == {p for p in before if "/synth/" in p}, retrained
    config = yaml.safe_load((root / "results/runs/tiny/synth/natural/fedavg/seed0/config.yaml").read_text())
    assert config["training"]["lr"] == 0.02

    third = run([venv_bin("dvc"), "repro"], root, FEDSKEW_TRACKING="0")
    assert third.returncode == 0
    assert "Running stage" not in third.stdout and metrics_mtimes(root) == after
    assert stale_stages(root) == set()
