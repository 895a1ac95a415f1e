"""One file, one thing: the classes a package's modules define, found by importing every module.

Methods (fedskew.fl, fedskew.sfl) and partition schemes (fedskew.data.partitions) are registered this
way, so adding one is adding a file. Imports nothing heavy itself: what it imports is the package's.
"""

from __future__ import annotations

import importlib
import pkgutil


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
