"""One file, one thing: the classes a package's modules define, found by importing every module.

Methods (fedskew.fl, fedskew.sfl) and partition schemes (fedskew.data.partitions) are registered this
way, so adding one is adding a file. Imports nothing heavy itself: what it imports is the package's.
Their numerics versions are read from the same files without importing them (`declared_versions`), for the
run ids that validation and the workflow compute without torch.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from functools import cache
from pathlib import Path


def discover(package: str, path: list[str], base: type, skip: set[str]) -> dict[str, type]:
    """Every subclass of `base` that sets its own `name` in the modules of `package` (but those in `skip`),
    by name."""
    found: dict[str, type] = {}
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if info.name in skip:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, base) and obj.__module__ == module.__name__
                    and "name" in vars(obj)):
                if obj.name in found and found[obj.name] is not obj:
                    raise RuntimeError(f"two classes of {package} are named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    return found


# --- numerics versions, read from the source -----------------------------------------------------

_ROOT = Path(__file__).resolve().parent
# The packages whose classes carry a numerics version, by the kind of piece a run id names them by.
VERSIONED_PACKAGES = {"method": ("fl", "sfl"), "source": ("data/datasets",), "scheme": ("data/partitions",)}


@cache
def declared_versions(kind: str) -> dict[str, int]:
    """name -> numerics version of every class of kind `kind` ("method", "source", "scheme") that sets its own
    `name`, read from the source files without importing them (run ids are computed where torch is not imported):
    the `version` the class sets in its own body, else 1. The classes themselves take the same value
    (fl.base.Algorithm, data.datasets.base.DatasetSource, data.partitions.base.Scheme), which
    tests/unit/test_catalog.py checks for every registered piece."""
    found: dict[str, int] = {}
    for folder in VERSIONED_PACKAGES[kind]:
        for path in sorted((_ROOT / folder).glob("*.py")):
            module = ast.parse(path.read_text(), str(path)).body
            constants = _literal_assignments(module)  # `name = NAME` names a module constant
            for node in module:
                if isinstance(node, ast.ClassDef):
                    own = _literal_assignments(node.body, constants)
                    if isinstance(own.get("name"), str):
                        found[own["name"]] = own.get("version", 1)
    return found


@cache
def module_constant(module: str, constant: str):
    """The literal value a module assigns to `constant` at its top level (fedskew.engine's VERSION,
    fedskew.models' VERSIONS), read from its source without importing it."""
    path = _ROOT.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return _literal_assignments(ast.parse(path.read_text(), str(path)).body)[constant]


def _literal_assignments(body: list[ast.stmt], constants: dict[str, object] | None = None) -> dict[str, object]:
    """name -> value of the assignments of literals in a block (`x = 1`, `x: int = 1`, `x = {"a": 1}`), and of
    names of `constants` (`name = NAME`)."""
    out = {}
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            and node.value is not None else []
        for target in (t for t in targets if isinstance(t, ast.Name)):
            if isinstance(node.value, ast.Name) and constants and node.value.id in constants:
                out[target.id] = constants[node.value.id]
                continue
            try:
                out[target.id] = ast.literal_eval(node.value)
            except ValueError:  # not a literal: a computed value
                pass
    return out
