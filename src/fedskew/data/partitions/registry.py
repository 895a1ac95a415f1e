"""The partition schemes by name: every module of this package but the shared ones holds one scheme.

Each is imported, and its `Scheme` subclass that sets ``name`` registered (fedskew.discovery, as for methods).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedskew.data.partitions.base import Scheme
from fedskew.discovery import discover

# The modules of shared code; every other module holds a scheme. (build imports this module, so it
# must not be imported from here.)
_SHARED = {"base", "build", "heatmap", "registry", "store"}

SchemeFn = Callable[..., list[np.ndarray]]

SCHEME_CLASSES: dict[str, type[Scheme]] = dict(sorted(
    discover(__package__, [str(Path(__file__).parent)], Scheme, _SHARED).items()))
"""Scheme name -> its class (parameters, feasibility rules, draw)."""

SCHEMES: dict[str, SchemeFn] = {name: cls.sample for name, cls in SCHEME_CLASSES.items()}
"""Scheme name -> fn(labels, num_classes, params, rng, natural_groups, dataset) -> client index arrays."""

SCHEME_PARAMS: dict[str, dict[str, type]] = {name: cls.parameters for name, cls in SCHEME_CLASSES.items()}
"""Parameter names and types per scheme; names absent from SCHEME_DEFAULTS are required."""

SCHEME_DEFAULTS: dict[str, dict[str, Any]] = {name: cls.defaults for name, cls in SCHEME_CLASSES.items()}
"""Defaults of the optional parameters per scheme."""
