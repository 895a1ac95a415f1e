"""Federated algorithms, one file each; `ALGORITHMS` maps the names used in params.yaml.

Every module of this package is imported and every FederatedAlgorithm subclass that
sets its own `name` is registered, so adding a method is adding a file (plus its
hyperparameters in workflow/schemas/params.schema.yaml, which a test keeps in sync).
"""

import importlib
import pkgutil

from fedskew.fl.base import FederatedAlgorithm

_NOT_METHODS = {"base", "losses"}


def discover(package: str, path: list[str], base: type, skip: set[str]) -> dict[str, type]:
    """Every subclass of `base` that sets its own `name` in the modules of `package`, by name."""
    found: dict[str, type] = {}
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if info.name in skip:
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, base) and obj.__module__ == module.__name__
                    and "name" in vars(obj)):
                if obj.name in found and found[obj.name] is not obj:
                    raise RuntimeError(f"two algorithms are named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    return found


# FedAvg first (the baseline), then alphabetical.
ALGORITHMS: dict[str, type[FederatedAlgorithm]] = dict(sorted(
    discover(__name__, __path__, FederatedAlgorithm, _NOT_METHODS).items(),
    key=lambda item: (item[0] != "fedavg", item[0])))
