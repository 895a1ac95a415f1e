"""fedskew's tests are independent of what a user installs: with the example plugin (examples/fedfocal) installed in
the environment the tests run in, they collect exactly the tests they collect without it, and those that enumerate
the pieces (the catalog's, the torch-free commands') pass, seeing the pieces fedskew ships.

tests/conftest.py makes fedskew take no plugin from the folders on the path as the tests start
(FEDSKEW_IGNORE_PLUGINS_IN, fedskew.plugins.visible), for the test process and every command it runs; a test that
installs a plugin into a folder of its own still sees it. The environment here is a scratch one: a virtual
environment whose site-packages holds the plugin, installed by pip, and reads the project's environment beside it
(a .pth file), so that every Python process the tests start sees the plugin, as it would in the project's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from fedskew import plugins
from tests.helpers import REPO

pytestmark = pytest.mark.slow  # a virtual environment, an install, two collections of the suite and two modules

EXAMPLE = REPO / "examples" / "fedfocal"
# The shipped tests that enumerate the pieces, which a user's plugin broke: the versions run ids read, and the
# commands that must import no torch.
ENUMERATING = ("tests/unit/test_catalog.py", "tests/unit/test_cli_listing.py")


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> Path:
    """The python of a scratch virtual environment with examples/fedfocal installed (pip, offline) and the packages
    of the environment running these tests beside it."""
    scratch = tmp_path_factory.mktemp("installed")
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(scratch / "env")], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    python = scratch / "env" / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, timeout=60, check=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (site / "project-environment.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    shutil.copytree(EXAMPLE, scratch / "fedfocal", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", str(site),
                           str(scratch / "fedfocal")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def _environ() -> dict[str, str]:
    """This process's environment without what tests/conftest.py set in it: a test run sets that itself."""
    return {k: v for k, v in os.environ.items() if k != plugins.IGNORED_FOLDERS}


def _pytest(python: Path, *args: str, basetemp: Path) -> subprocess.Popen:
    return subprocess.Popen([str(python), "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                             f"--basetemp={basetemp}", *args], cwd=REPO, env=_environ(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _collected(process: subprocess.Popen) -> list[str]:
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out[-3000:]
    return [line for line in out.splitlines() if "::" in line]


def test_the_plugin_is_installed_where_every_command_sees_it(environment) -> None:
    code = "from fedskew.algorithms import ALGORITHMS; print('fedfocal' in ALGORITHMS)"
    seen = subprocess.run([str(environment), "-c", code], cwd=REPO, env=_environ(), capture_output=True, text=True,
                          timeout=300)
    assert seen.returncode == 0 and seen.stdout.strip() == "True", seen.stderr[-3000:]


def test_the_suite_collects_the_same_tests_and_those_that_enumerate_pieces_pass(environment, tmp_path) -> None:
    installed = _pytest(environment, "--collect-only", "tests", basetemp=tmp_path / "installed")
    plain = _pytest(Path(sys.executable), "--collect-only", "tests", basetemp=tmp_path / "plain")
    assert _collected(installed) == _collected(plain)

    enumerating = _pytest(environment, *ENUMERATING, basetemp=tmp_path / "enumerating")
    out, _ = enumerating.communicate(timeout=600)
    assert enumerating.returncode == 0 and " passed" in out, out[-4000:]
