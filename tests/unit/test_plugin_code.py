"""A plugin's code as its runs' ids see it (fedskew.plugin_code), and which installed plugins fedskew takes.

The identity of a plugin's package moves with what Python would run (a constant, an operator, a data file) and
not with its docstrings, comments, layout or where it is installed; each file's digest is kept under its
signature and reused only for that very file. A run of a plugin piece records the distribution, its version and
that identity, and its id folds in the identity alone; a run of built-in pieces records none, so its id is what it
was. `fedskew stale` says which plugin moved a run. fedskew takes no plugin from a folder FEDSKEW_IGNORE_PLUGINS_IN
names, and the validated configuration kept between commands (fedskew.params_cache) knows which it took.
"""

from __future__ import annotations

import copy
import importlib
import os
from pathlib import Path

import pytest

from fedskew import config, params_cache, plugin_code, plugins, stale
from fedskew.config import hash_identity, identity, load_params
from tests.helpers import TINY_PARAMS, single_setting

MODULE = '''"""Scaled: a module docstring."""

import math  # a comment

FACTOR = 0.5


class Scaled:
    """A class docstring."""

    size: int = 2
    """An attribute's docstring."""

    def loss(self, value):
        """A method docstring."""
        # why it is scaled
        return value * FACTOR + math.pi
'''

SAME = {  # what Python runs is MODULE's
    "docstrings reworded": MODULE.replace("A method docstring.", "Reworded.").replace("a module docstring", "other"),
    "attribute docstring dropped": MODULE.replace('    """An attribute\'s docstring."""\n', ""),
    "comments changed": MODULE.replace("# why it is scaled", "# another reason").replace("  # a comment", ""),
    "reformatted": MODULE.replace("return value * FACTOR + math.pi", "return (value\n                * FACTOR\n"
                                                                     "                + math.pi)"),
}
MOVED = {  # what Python runs is not MODULE's
    "a constant": MODULE.replace("FACTOR = 0.5", "FACTOR = 0.25"),
    "an int for a float": MODULE.replace("FACTOR = 0.5", "FACTOR = 1").replace("0.5", "1"),
    "an operator": MODULE.replace("value * FACTOR", "value / FACTOR"),
    "a default": MODULE.replace("size: int = 2", "size: int = 3"),
    "an import": MODULE.replace("import math", "import cmath as math"),
}


@pytest.mark.parametrize("case", sorted(SAME))
def test_a_module_s_digest_ignores_docstrings_comments_and_layout(case) -> None:
    assert plugin_code.module_digest(SAME[case].encode()) == plugin_code.module_digest(MODULE.encode())


@pytest.mark.parametrize("case", sorted(MOVED))
def test_a_module_s_digest_moves_with_what_python_runs(case) -> None:
    assert plugin_code.module_digest(MOVED[case].encode()) != plugin_code.module_digest(MODULE.encode())


def _package(site: Path, files: dict[str, str], distribution: str = "fedskew-scaled") -> Path:
    """`distribution` 0.1 as pip installs it into `site`: the package `scaled` with `files`, and its .dist-info
    declaring the method `scaled`."""
    for name, text in files.items():
        (site / "scaled" / name).parent.mkdir(parents=True, exist_ok=True)
        (site / "scaled" / name).write_text(text)
    info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedskew.methods]\nscaled = scaled.method:Scaled\n")
    return site


@pytest.fixture
def on_path(monkeypatch, tmp_path):
    """Put a folder on the path as an installed site, in a working folder of the test's own; the caches of what is
    installed are emptied before and after."""
    monkeypatch.chdir(tmp_path)

    def put(site: Path) -> Path:
        monkeypatch.syspath_prepend(str(site))
        importlib.invalidate_caches()
        _forget()
        return site

    yield put
    monkeypatch.undo()
    importlib.invalidate_caches()
    _forget()


def _forget() -> None:
    for cached in (plugin_code.identity, plugins.record, plugins.loaded):
        cached.cache_clear()


def _identity(site: Path) -> str:
    _forget()
    importlib.invalidate_caches()
    return plugin_code.identity("scaled.method:Scaled")


FILES = {"__init__.py": '"""A plugin."""\n', "method.py": MODULE, "weights.json": "[0.5, 0.25]\n"}


def test_a_package_s_identity_covers_what_can_hold_code_wherever_it_is_installed(on_path, tmp_path) -> None:
    site = on_path(_package(tmp_path / "site", FILES))
    first = _identity(site)
    # documentation, editors' backups and Python's caches beside the code are not code
    for name in ("README.md", "method.py~", ".method.py.swp", "#method.py#", "__pycache__/method.cpython-311.pyc"):
        (site / "scaled" / name).parent.mkdir(exist_ok=True)
        (site / "scaled" / name).write_text("anything")
    (site / "scaled" / "method.py").write_text(SAME["docstrings reworded"])
    assert _identity(site) == first
    # the same package installed elsewhere (found first on the path) is the same code
    other = on_path(_package(tmp_path / "elsewhere", FILES))
    assert plugin_code.package_files("scaled.method:Scaled")[0][1].is_relative_to(other)
    assert _identity(other) == first
    (other / "scaled" / "weights.json").write_text("[0.5, 0.125]\n")  # a data file its code may read
    assert _identity(other) != first
    (other / "scaled" / "weights.json").write_text(FILES["weights.json"])
    (other / "scaled" / "helpers.py").write_text("OFFSET = 1\n")  # a module more
    assert _identity(other) != first


def test_a_kept_digest_serves_only_its_own_file(on_path, tmp_path, monkeypatch) -> None:
    site = on_path(_package(tmp_path / "site", FILES))
    first = _identity(site)
    assert plugin_code.CACHE.is_file()

    def never(source: bytes) -> str:
        raise AssertionError("a file that did not change was parsed again")

    with monkeypatch.context() as patch:  # nothing changed: nothing parsed
        patch.setattr(plugin_code, "module_digest", never)
        assert _identity(site) == first
    (site / "scaled" / "method.py").write_text(MOVED["a constant"])
    moved = _identity(site)
    assert moved != first
    # a kept file that was altered is not trusted: its digests are computed again
    header, _, body = plugin_code.CACHE.read_bytes().partition(b"\n")
    plugin_code.CACHE.write_bytes(header + b"\n" + body.replace(b'"files"', b'"files" '))
    with monkeypatch.context() as patch:
        parsed = []
        patch.setattr(plugin_code, "module_digest", lambda source: parsed.append(source) or "recomputed")
        _identity(site)
        assert parsed


def test_a_run_records_its_plugin_pieces_and_its_id_follows_their_code_not_their_version(on_path, tmp_path) -> None:
    recorded = load_params(single_setting(copy.deepcopy(TINY_PARAMS))).runs(["tiny"])[0].to_dict()
    assert "plugins" not in recorded  # a built-in run's configuration, and so its id, are what they were
    site = on_path(_package(tmp_path / "site", FILES))
    pieces = config.run_plugins("scaled", "mlp", "digits", "dirichlet")
    assert pieces == {"method": {"distribution": "fedskew-scaled", "version": "0.1",
                                 "entry_point": "scaled.method:Scaled", "code": _identity(site)}}
    assert config.run_plugins("fedavg", "mlp", "digits", "dirichlet") == {}  # built-in pieces: nothing recorded
    with_plugin = {**recorded, "plugins": pieces}
    released = {**recorded, "plugins": {"method": {**pieces["method"], "version": "0.2"}}}
    edited = {**recorded, "plugins": {"method": {**pieces["method"], "code": "0" * 64}}}
    assert hash_identity(identity(released)) == hash_identity(identity(with_plugin))
    assert hash_identity(identity(edited)) != hash_identity(identity(with_plugin)) != hash_identity(identity(recorded))


def test_stale_names_the_plugin_whose_code_moved_a_run(monkeypatch) -> None:
    current = load_params(single_setting(copy.deepcopy(TINY_PARAMS))).runs(["tiny"])[0]
    record = {"distribution": "fedskew-fedavgm", "version": "0.1", "entry_point": "m:M", "code": "1" * 64}
    monkeypatch.setattr(config, "run_plugins", lambda *pieces: {"method": record})
    now = current.to_dict()
    edited = {**now, "plugins": {"method": {**record, "code": "2" * 64}}}
    assert stale.cause(edited, current) == "plugin fedskew-fedavgm changed (method fedavg: its code)"
    before = {k: v for k, v in now.items() if k != "plugins"}  # trained before its code was recorded
    assert stale.cause(before, current).startswith("plugin fedskew-fedavgm: its code was not recorded with the run")
    monkeypatch.setattr(config, "run_plugins", lambda *pieces: {})
    assert stale.cause(now, current) == "method fedavg: no longer of plugin fedskew-fedavgm"


def test_fedskew_takes_no_plugin_from_an_ignored_folder(on_path, tmp_path, monkeypatch) -> None:
    site = on_path(_package(tmp_path / "site", FILES))
    seen = params_cache.plugin_entries()  # the folders tests/conftest.py ignores are the environment's, not this
    assert [entry.name for entry in plugins.entries("method")] == ["scaled"]
    assert any(entry[3] == "fedskew-scaled" for entry in seen)

    ignored = os.environ[plugins.IGNORED_FOLDERS]
    monkeypatch.setenv(plugins.IGNORED_FOLDERS, os.pathsep.join([ignored, "/nowhere", str(site.parent / "." / "site")]))
    _forget()
    assert plugins.entries("method") == [] and plugins.loaded("method") == {}
    assert plugins.record("method", "scaled") is None
    # the validated configuration kept between commands is not the one validated with the plugin
    assert params_cache.plugin_entries() != seen
