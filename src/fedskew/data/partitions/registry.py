"""The partition schemes by name: every module of this package but the shared ones holds one scheme.

Importing a scheme module defines its `Scheme` subclass, which registers itself (fedskew.data.partitions.base).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedskew.data.partitions.base import REGISTERED, Scheme

# The modules of shared code; every other module holds a scheme. (build imports this module, so it
# must not be imported from here.)
_SHARED = {"base", "build", "heatmap", "registry", "store"}

for _module in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if _module.name not in _SHARED:
        importlib.import_module(f"fedskew.data.partitions.{_module.name}")

SchemeFn = Callable[..., list[np.ndarray]]

SCHEME_CLASSES: dict[str, type[Scheme]] = dict(sorted(REGISTERED.items()))
"""Scheme name -> its class (parameters, feasibility rules, draw)."""

SCHEMES: dict[str, SchemeFn] = {name: cls.sample for name, cls in SCHEME_CLASSES.items()}
"""Scheme name -> fn(labels, num_classes, params, rng, natural_groups, dataset) -> client index arrays."""

SCHEME_PARAMS: dict[str, dict[str, type]] = {name: cls.parameters for name, cls in SCHEME_CLASSES.items()}
"""Parameter names and types per scheme; names absent from SCHEME_DEFAULTS are required."""

SCHEME_DEFAULTS: dict[str, dict[str, Any]] = {name: cls.defaults for name, cls in SCHEME_CLASSES.items()}
"""Defaults of the optional parameters per scheme."""
