"""scripts/system-packages.sh: installs the OS package fedskew reads Fashion-MNIST from, or says what to run.

The paths that cannot install are run for real in a private mount namespace where the package's folder
is hidden (root and unshare needed: skipped elsewhere). The install itself is left to `make test` on a
fresh machine, which runs the script through `make system-packages`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from fedskew import catalog
from fedskew.data import sources
from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "system-packages.sh"
PACKAGE = sources.OS_PACKAGES["fashionmnist"]  # read at collection, before tests/conftest.py hides it


def test_the_script_names_fedskew_s_package_and_folder_and_only_the_tests_targets_run_it():
    script = SCRIPT.read_text()
    assert re.search(r"^package=(\S+)$", script, re.M).group(1) == PACKAGE.name
    assert re.search(r"^folder=(\S+)$", script, re.M).group(1) == str(PACKAGE.folder)
    # `make system-packages` runs it, and `make test` / `make test-fast` through that target; scripts/env.sh,
    # which `make run` runs, never does: the default suite reads no Fashion-MNIST.
    env_sh = (REPO / "scripts" / "env.sh").read_text()
    assert not re.search(r"^[^#]*system-packages", env_sh, re.M)
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^system-packages:\n\t@bash scripts/system-packages\.sh$", makefile, re.M)
    for target in ("test", "test-fast"):
        assert "system-packages" in re.search(rf"^{target}:(.*)$", makefile, re.M).group(1).split()
    assert "system-packages" not in re.search(r"^run:(.*)$", makefile, re.M).group(1).split()


def _hidden_folder_run(command: str) -> subprocess.CompletedProcess:
    """`command` in a mount namespace where the package's folder's parent is an empty tmpfs."""
    hide = f"mount -t tmpfs none {PACKAGE.folder.parent} && {command}"
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", hide],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


needs_namespace = pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
    reason="hiding the package's folder needs root, unshare and setpriv")


@needs_namespace
@pytest.mark.parametrize("how, why", [
    ("env PATH=/nonexistent /bin/bash scripts/system-packages.sh", "no apt-get here"),
    ("setpriv --reuid=65534 --regid=65534 --clear-groups bash scripts/system-packages.sh", "not root here"),
], ids=["no-apt-get", "not-root"])
def test_where_it_cannot_install_it_says_what_to_run_and_succeeds(how, why):
    done = _hidden_folder_run(how)
    if "mount" in done.stderr and done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0], done.stderr
    assert f"'sudo apt-get install {PACKAGE.name}'" in lines[0] and "FEDSKEW_DATA_DIRS" in lines[0]


def test_where_the_package_is_installed_it_does_nothing():
    if not all((PACKAGE.folder / name).is_file() for name in catalog.sources()["fashionmnist"].raw_files):
        pytest.skip(f"{PACKAGE.name} is not installed")
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": "/nonexistent"}, executable=shutil.which("bash"))
    assert done.returncode == 0 and done.stdout == done.stderr == ""
