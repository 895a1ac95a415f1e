"""Federated algorithms, one file each; `ALGORITHMS` maps the names used in params.yaml.

Every module of this package is imported and every FederatedAlgorithm subclass that
sets its own `name` is registered, so adding a method is adding a file (plus its
hyperparameters in workflow/schemas/params.schema.yaml, which a test keeps in sync).
"""

import importlib
import pkgutil

from fedskew.fl.base import FederatedAlgorithm

_NOT_METHODS = {"base", "losses"}


def _discover() -> dict[str, type[FederatedAlgorithm]]:
    found: dict[str, type[FederatedAlgorithm]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in _NOT_METHODS:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, FederatedAlgorithm) and obj.__module__ == module.__name__
                    and "name" in vars(obj)):
                if obj.name in found and found[obj.name] is not obj:
                    raise RuntimeError(f"two algorithms are named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    # FedAvg first (the baseline), then alphabetical.
    return dict(sorted(found.items(), key=lambda item: (item[0] != "fedavg", item[0])))


ALGORITHMS: dict[str, type[FederatedAlgorithm]] = _discover()
