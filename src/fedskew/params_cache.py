"""The validated configuration, kept between commands: a job does not validate params.yaml again after its build.

Validating params.yaml with its experiments takes about 0.4 s (the schema's validator, the catalog, the plugins),
and every Snakemake job runs a command that needs the configuration after the build has validated it. So the
result of a validation that passed (the merged configuration, the experiment file that defines each name, the
block each training block inherits) is kept in `.fedskew/validated-<params file>.json` beside the params file
(git-ignored), under a key made of everything validation reads:

- the sha256 of the bytes of the params file and of each experiment file, by name: the very bytes parsed when the
  key is not found, read once (fedskew.user_files.read);
- fedskew's own code: the sha256 of every .py, .json and .yaml file of the package, and of the schema
  (workflow/schemas/params.schema.yaml);
- the installed plugins: every entry point of fedskew's groups (name, value, distribution, version) that fedskew
  takes (fedskew.plugins.visible), with the size and modification time of each file of its package
  (fedskew.plugin_code.package_files: a plugin edited in place changes the key);
- Python's version and those of the libraries validation relies on (PyYAML, jsonschema, numpy).

The file is written atomically (a temporary file renamed over it) and its first line carries the sha256 of the
rest: a file that is stale (another key), truncated, altered or unreadable is never trusted; validation runs
again and replaces it. Only a validation that passed is kept, so an invalid file or a plugin that fails to load
is reported on every call. A project that cannot be written to is validated on every call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from fedskew import plugin_code, plugins, user_files
from fedskew.config_errors import ConfigError
from fedskew.config_schema import SCHEMA_PATH

FOLDER = ".fedskew"
HEADER = "fedskew validated configuration v1"
MAX_CACHE_BYTES = 64 * 1024 * 1024   # the merged configuration of files of at most user_files.MAX_BYTES each
SOURCE_SUFFIXES = (".py", ".json", ".yaml")
LIBRARIES = ("jsonschema", "numpy")  # besides PyYAML (imported here) and Python
log = logging.getLogger(__name__)


def cache_file(params_file: Path) -> Path:
    """Where the validated configuration of a params file is kept: .fedskew/ beside it."""
    return Path(params_file).parent / FOLDER / f"validated-{Path(params_file).name}.json"


def _tree_digest(folder: Path, suffixes: tuple[str, ...]) -> str:
    """sha256 over the relative name and the content of every file of `folder` with one of `suffixes`."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.suffix in suffixes and "__pycache__" not in p.parts):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@cache
def code_digest() -> str:
    """fedskew's own code as validation runs it: its package's source files and the schema (once per process)."""
    schema = hashlib.sha256(SCHEMA_PATH.read_bytes()).hexdigest() if SCHEMA_PATH.is_file() else "no schema"
    libraries = {name: _version(name) for name in LIBRARIES}
    return json.dumps([_tree_digest(Path(__file__).parent, SOURCE_SUFFIXES), schema, sys.version, yaml.__version__,
                       libraries])


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _package_files(value: str) -> list[tuple[str, int, int]]:
    """(file, size, modification time) of each file of the package an entry point's module is in, those that
    make its runs' ids (fedskew.plugin_code.package_files), found without importing it (nothing when it cannot
    be found: the key then rests on the distribution's version)."""
    signatures = []
    for _, file in plugin_code.package_files(value):
        try:
            info = file.stat()
        except OSError:  # gone since it was listed: its absence is part of the key
            signatures.append((str(file), -1, -1))
            continue
        signatures.append((str(file), info.st_size, info.st_mtime_ns))
    return signatures


def plugin_entries() -> list[list]:
    """Every entry point of fedskew's groups that is installed: group, name, value, distribution, version, and
    its package's files (`_package_files`). One scan of the installed distributions' entry points."""
    groups = set(plugins.GROUPS.values())
    found = []
    for dist in metadata.distributions():
        declared = [entry for entry in dist.entry_points if entry.group in groups]
        if not declared or not plugins.visible(dist):  # none, or none fedskew takes (FEDSKEW_IGNORE_PLUGINS_IN)
            continue
        found += [[entry.group, entry.name, entry.value, dist.name, dist.version, _package_files(entry.value)]
                  for entry in declared]
    return sorted(found, key=lambda e: json.dumps(e))


def key(params: tuple[str, bytes], sources: list[tuple[str, bytes]]) -> str:
    """The key of a validated configuration: the sha256 of everything its validation read (module docstring), the
    files by their names (an experiment's is part of what validation gives: the file that defines each name)."""
    files = [[name, hashlib.sha256(data).hexdigest()] for name, data in (params, *sources)]
    content = [files, code_digest(), plugin_entries()]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()


def read(params_file: Path, wanted: str) -> tuple[dict, dict, dict] | None:
    """(raw, origins, inherits) of the configuration kept for key `wanted`, or None: none kept, another key, or a
    file that is truncated, altered or not what this module writes (never trusted: validated again)."""
    path = cache_file(params_file)
    try:
        data = user_files.read(path, Path(params_file).parent, str(path), limit=MAX_CACHE_BYTES)
    except ConfigError:
        return None
    header, _, body = data.partition(b"\n")
    expected = f"{HEADER} {hashlib.sha256(body).hexdigest()}".encode()
    if header != expected:
        if header.startswith(HEADER.encode()):
            log.warning("%s does not match its checksum (truncated or altered): validating again", path)
        return None
    try:
        kept = json.loads(body)
        if kept["key"] != wanted:
            return None
        origins = {(section, name): origin for section, name, origin in kept["origins"]}
        raw, inherits = kept["raw"], kept["inherits"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(raw, dict) or not isinstance(inherits, dict):
        return None
    return raw, origins, inherits


def write(params_file: Path, wanted: str, raw: dict, origins: dict, inherits: dict) -> None:
    """Keep a configuration that passed validation under key `wanted`, atomically; nothing where JSON would not
    give it back exactly (a key that is not a string) or where the project cannot be written to."""
    kept = {"key": wanted, "raw": raw, "inherits": inherits,
            "origins": [[section, name, origin] for (section, name), origin in origins.items()]}
    try:
        body = json.dumps(kept, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return
    if not _exact(json.loads(body)["raw"], raw):
        return
    path = cache_file(params_file)
    temporary = None
    try:
        path.parent.mkdir(exist_ok=True)
        temporary = path.parent / f".validated-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        # created as any file of the project is (the umask decides who may read it), never over another one
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            handle.write(f"{HEADER} {hashlib.sha256(body).hexdigest()}\n".encode() + body)
        os.replace(temporary, path)  # readers see the old file or the new one, never a part
    except OSError as error:
        log.debug("the validated configuration is not kept (%s): %s", path, error)
        if temporary is not None:
            temporary.unlink(missing_ok=True)


def _exact(back: Any, kept: Any) -> bool:
    """Whether JSON gave `kept` back as it was: the same types (1 is not 1.0, "1" is not 1), keys in order."""
    if type(back) is not type(kept):
        return False
    if isinstance(kept, dict):
        return list(back) == list(kept) and all(_exact(back[k], kept[k]) for k in kept)
    if isinstance(kept, list):
        return len(back) == len(kept) and all(map(_exact, back, kept))
    return back == kept
