"""A plugin's code, as the ids of the runs it computes see it: its package read as Python runs it.

A built-in piece moves its runs' ids when its `version` is raised, and its committed fingerprint (a digest of what
it computes on a tiny fixed problem, tests/fingerprints/) fails until it is: forgetting is caught before a commit.
A researcher's own method, scheme, source or model is the code that changes most, and no fingerprint of fedskew's
guards it. So the id of every run a plugin piece computes folds in the identity of its package's code
(`identity`): whatever changes what the package would run changes its runs' ids, with no version to raise.

What the identity is: the sha256 of every file of the top-level package that the entry point's module is in,
found without importing it (`package_files`): each Python module as its syntax tree, with its docstrings and every
other bare string statement, its comments, its formatting and the lines and columns left out (`module_digest`);
every other file (data, compiled extensions) by its bytes. Changing a sum, a constant, a default or an import
changes it; rewording a docstring or a comment, or reformatting, does not. Why this and not the alternatives:

- a fingerprint of what the piece computes on small fixed inputs (the built-in pieces' recipe) covers only the
  branches its tiny problem takes (a change under another hyperparameter value, the split family or a GPU path
  would keep it), holds only under the portable x86-64 CPU kernels and one torch, and needs torch: a run id must
  be the same on every machine, and validation and Snakemake's plan compute ids without torch;
- a hash of the files' bytes would retrain every run of the plugin for a reworded docstring.

The price: a refactor that keeps the numbers (a renamed variable, a function moved) retrains the plugin's runs,
since reading code cannot tell that it computes the same bits; so does a Python release whose parser gives the
same code another tree (fields it adds empty are left out, `_canonical`). Code outside the package (another
distribution it imports) is not covered: its version is its own; nor is a package imported from a zip archive.
The identity is part of a run's configuration
(fedskew.config.RunConfig.to_dict's `plugins`: the distribution, its version and this identity per plugin piece),
so config.yaml and MLflow's params record it, and `fedskew stale` names the plugin whose code changed.

Each file's digest is kept in `.fedskew/plugin-code.json` of the working folder (the project: git-ignored) under
the file's size, modification time, change time and inode: a command, a Snakemake job, pays a `stat` a file when
nothing changed. Any write to a file changes its change time (which no tool can set back), so a kept digest is
never that of other bytes; a kept file that is altered or truncated is never trusted (its first line carries the
sha256 of the rest), and a project that cannot be written to computes the digests each time.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import secrets
from functools import cache
from importlib import util
from pathlib import Path

from fedskew.config_errors import ConfigError

# The version of this recipe: it is part of every identity, so a change to how code is read gives every plugin's
# runs new ids once, on purpose, instead of moving some of them silently.
RECIPE = 1
CACHE = Path(".fedskew") / "plugin-code.json"
HEADER = "fedskew plugin code digests v1"
# Files that hold no code a run executes: documentation, and what Python or an editor writes beside the sources.
SKIPPED_SUFFIXES = (".pyc", ".pyo", ".md", ".rst")
log = logging.getLogger(__name__)


def package_files(value: str) -> list[tuple[str, Path]]:
    """(name, path) of every file of the top-level package of an entry point's module (`value`:
    "module.sub:attribute"), found without importing it, each named from the folder that holds the package, so
    that the name is the same wherever it is installed; a single-module plugin's file alone. Left out:
    `__pycache__`, hidden files and folders, editors' backups (`x.py~`, `#x.py#`), documentation
    (SKIPPED_SUFFIXES). Empty where the package cannot be found (its entry point then fails to load, naming
    itself)."""
    top = value.split(":")[0].strip().split(".")[0]
    try:
        spec = util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    folders = [Path(folder) for folder in spec.submodule_search_locations or []]
    if not folders:
        origin = Path(spec.origin) if spec.origin else None
        return [(origin.name, origin.absolute())] if origin is not None and origin.is_file() else []
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            relative = path.relative_to(folder)
            if _kept(relative) and path.is_file():
                found.append(((top / relative).as_posix(), path.absolute()))
    return sorted(found)


def _kept(relative: Path) -> bool:
    """Whether a file of a package (its path in the package) can hold what a run executes."""
    return relative.suffix not in SKIPPED_SUFFIXES and not any(
        part == "__pycache__" or part.startswith((".", "#")) or part.endswith("~") for part in relative.parts)


@cache
def identity(value: str) -> str:
    """The identity of the code of the package an entry point's module is in (module docstring): the sha256 of
    RECIPE and each file's name with its digest. Once per process."""
    files = package_files(value)
    digests = _digests([path for _, path in files])
    return hashlib.sha256(json.dumps([RECIPE, [[name, digests[path]] for name, path in files]]).encode()).hexdigest()


def module_digest(source: bytes) -> str:
    """The sha256 of a Python module as it runs: its syntax tree without docstrings (any bare string statement),
    comments, formatting or positions. A file Python cannot parse is taken by its bytes."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return file_digest(source)
    return hashlib.sha256(json.dumps(["python", _canonical(tree)], separators=(",", ":")).encode()).hexdigest()


def file_digest(data: bytes) -> str:
    return hashlib.sha256(b"bytes\0" + data).hexdigest()


def _canonical(node: object) -> object:
    """A syntax tree as plain lists: each node's type and the fields that hold something. A field that is None or
    empty is left out, so that a Python release adding a field (as 3.12 added `type_params`) reads old code the
    same; the positions (lineno, col_offset), which are attributes and no fields, never enter."""
    if isinstance(node, ast.AST):
        fields = [[name, _canonical(value)] for name, value in ast.iter_fields(node)
                  if value is not None and value != []]
        return [type(node).__name__, fields]
    if isinstance(node, list):
        return [_canonical(item) for item in node if not _bare_string(item)]
    if isinstance(node, (str, bytes, int, float, complex, bool, type(...))) or node is None:
        return [type(node).__name__, repr(node)]  # repr: 1 and 1.0 and True differ, and every bit of a float counts
    raise TypeError(f"unexpected value {node!r} in a syntax tree")


def _bare_string(node: object) -> bool:
    """A statement that is a string alone: a docstring, or an attribute's, which Python evaluates to nothing."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _digests(files: list[Path]) -> dict[Path, str]:
    """Each file's digest: kept (CACHE) where the file's signature is the one kept, else computed (and kept)."""
    kept = _read_cache()
    out, computed = {}, {}
    for path in files:
        signature = _signature(path)
        entry = kept.get(str(path))
        if signature is not None and entry is not None and entry[:-1] == signature:
            out[path] = entry[-1]
            continue
        try:
            data = path.read_bytes()
        except OSError as error:
            raise ConfigError(f"{path}: cannot be read ({error.strerror or error}); the ids of a plugin's runs "
                              "cover every file of its package: make it readable, or move it out of the "
                              "package") from None
        out[path] = module_digest(data) if path.suffix == ".py" else file_digest(data)
        if signature is not None:
            computed[str(path)] = [*signature, out[path]]
    if computed:
        _write_cache({**{name: entry for name, entry in kept.items() if os.path.exists(name)}, **computed})
    return out


def _signature(path: Path) -> list[int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def _read_cache() -> dict[str, list]:
    """The digests kept, by file; none where the file is missing, altered, truncated or not what `_write_cache`
    writes."""
    try:
        header, _, body = CACHE.read_bytes().partition(b"\n")
    except OSError:
        return {}
    if header != f"{HEADER} {hashlib.sha256(body).hexdigest()}".encode():
        return {}
    try:
        kept = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(kept, dict) or kept.get("recipe") != RECIPE or not isinstance(kept.get("files"), dict):
        return {}
    return {name: entry for name, entry in kept["files"].items() if isinstance(entry, list) and len(entry) == 5}


def _write_cache(files: dict[str, list]) -> None:
    """Keep the digests, atomically (a temporary file renamed over the old one); nothing where the working folder
    cannot be written to."""
    body = json.dumps({"recipe": RECIPE, "files": files}, sort_keys=True, allow_nan=False).encode()
    temporary = None
    try:
        CACHE.parent.mkdir(exist_ok=True)
        temporary = CACHE.parent / f".plugin-code-{os.getpid()}-{secrets.token_hex(4)}.tmp"
        with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            handle.write(f"{HEADER} {hashlib.sha256(body).hexdigest()}\n".encode() + body)
        os.replace(temporary, CACHE)
    except OSError as error:
        log.debug("the plugins' code digests are not kept (%s): %s", CACHE, error)
        if temporary is not None:
            temporary.unlink(missing_ok=True)
