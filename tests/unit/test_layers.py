"""The package's layers and its freedom from import cycles, as pyproject.toml's import-linter contracts state
them (docs/design.md shows the same layers): `lint-imports` keeps them on the real tree, and breaks them on a
copy that imports upwards or in a circle, so that a contract which checks nothing cannot pass here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, venv_bin


def lint_imports(src: Path) -> subprocess.CompletedProcess:
    """`lint-imports` with the project's contracts, on the package under `src`."""
    return subprocess.run([venv_bin("lint-imports"), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
                          cwd=REPO, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=300)


def test_the_package_keeps_its_layers_and_has_no_import_cycle() -> None:
    done = lint_imports(REPO / "src")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout, done.stdout


@pytest.fixture
def copied_src(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "src" / "fedskew", tmp_path / "fedskew", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_an_import_upwards_breaks_the_layers(copied_src: Path) -> None:
    _append(copied_src / "fedskew" / "runfiles.py", "import fedskew.job  # a run's files reaching up to the job")
    done = lint_imports(copied_src)
    assert done.returncode != 0
    assert "fedskew's layers, top down BROKEN" in done.stdout, done.stdout
    assert "fedskew.runfiles -> fedskew.job" in done.stdout, done.stdout


def test_an_import_cycle_inside_a_package_is_refused(copied_src: Path) -> None:
    # fedskew.data.registry imports fedskew.data.files; the other way round closes a circle within one layer
    _append(copied_src / "fedskew" / "data" / "files.py", "import fedskew.data.registry")
    done = lint_imports(copied_src)
    assert done.returncode != 0
    assert "no import cycles, at any depth BROKEN" in done.stdout, done.stdout


def test_a_new_top_level_module_must_be_given_a_layer(copied_src: Path) -> None:
    (copied_src / "fedskew" / "newcomer.py").write_text('"""A module nobody placed."""\n')
    done = lint_imports(copied_src)
    assert done.returncode != 0
    assert "fedskew.newcomer" in done.stdout, done.stdout


def test_the_numerics_import_nothing_above_them_and_keep_their_own_order(copied_src: Path) -> None:
    _append(copied_src / "fedskew" / "numerics" / "exact_math.py", "import fedskew.paths  # the bottom layer reaching up")
    _append(copied_src / "fedskew" / "numerics" / "cpu_pin.py", "import fedskew.numerics.sgd  # the pin reaching up")
    done = lint_imports(copied_src)
    assert done.returncode != 0
    assert "fedskew's layers, top down BROKEN" in done.stdout and "fedskew.numerics.exact_math -> fedskew.paths" \
        in done.stdout, done.stdout
    assert "the portable arithmetic, top down BROKEN" in done.stdout, done.stdout


def test_a_dataset_module_may_not_reach_up_to_the_registry(copied_src: Path) -> None:
    _append(copied_src / "fedskew" / "data" / "datasets" / "adult.py", "import fedskew.data.registry")
    done = lint_imports(copied_src)
    assert done.returncode != 0
    assert "the datasets above the mechanics that fetch and hold them BROKEN" in done.stdout, done.stdout

