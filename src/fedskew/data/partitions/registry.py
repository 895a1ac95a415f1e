"""The partition schemes by name: the built-in ones, one a module of this package, and the installed plugins'.

Every module of this package but the shared ones holds one scheme: each is imported, and its `Scheme` subclass
that sets ``name`` registered (fedskew.discovery, as for methods). A plugin's scheme is an entry point of group
``fedskew.partitions`` (fedskew.plugins) naming a `Scheme` subclass, registered under the entry point's name,
which its class's ``name`` must equal. Both are checked the same way (`scheme_problem`); a plugin's problem,
or a plugin that takes a built-in name, is a PluginError that names its distribution and entry point.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedskew import plugins
from fedskew.data.partitions.base import Scheme
from fedskew.data.partitions.parameters import Parameter
from fedskew.discovery import discover

# The modules of shared code; every other module holds a scheme. (build imports this module, so it
# must not be imported from here.)
_SHARED = {"base", "build", "heatmap", "parameters", "registry", "store"}

SchemeFn = Callable[..., list[np.ndarray]]


def scheme_problem(cls: object, name: str) -> str | None:
    """Why `cls` is not a scheme fedskew can draw with under `name`, or None."""
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        return "is not a partition scheme: subclass fedskew.data.partitions.Scheme"
    if vars(cls).get("name") != name:
        return (f"the class sets name = {vars(cls).get('name')!r}, but params.yaml calls the scheme by the entry "
                f"point's name; write name = {name!r} in the class")
    if cls.sample is Scheme.sample:
        return "does not implement sample(labels, num_classes, params, rng, natural_groups=None, dataset=''), the draw"
    if not isinstance(cls.parameters, dict):
        return f"parameters is a {type(cls.parameters).__name__}; declare a dict of name -> Parameter"
    for key, declared in cls.parameters.items():
        if not isinstance(declared, Parameter):
            return (f"parameter {key!r} is declared as {declared!r}; declare it as "
                    "fedskew.data.partitions.Parameter(int or float, default, bounds or a ref)")
        if key == "scheme":
            return "a parameter is named 'scheme', the key that names the scheme itself; call it something else"
        problem = declared.problem()
        if problem:
            return f"parameter {key!r}: {problem}"
    if isinstance(cls.version, bool) or not isinstance(cls.version, int) or cls.version < 1:
        return f"version = {cls.version!r}; the numerics version is an integer >= 1"
    return None


def _built_in() -> dict[str, type[Scheme]]:
    found = dict(sorted(discover(__package__, [str(Path(__file__).parent)], Scheme, _SHARED).items()))
    for name, cls in found.items():
        problem = scheme_problem(cls, name)
        if problem:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} {problem}")
    return found


def _plugins(built_in: dict[str, type[Scheme]]) -> dict[str, plugins.Plugin]:
    """The installed plugins' schemes by name, sorted, each checked."""
    out = {}
    for name, plugin in sorted(plugins.loaded("partition").items()):
        if name in built_in:
            raise plugin.error(f"{name!r} is the name of a built-in partition scheme; give the entry point and "
                               "its class's `name` another name")
        problem = scheme_problem(plugin.obj, name)
        if problem:
            raise plugin.error(problem)
        out[name] = plugin
    return out


BUILT_IN: dict[str, type[Scheme]] = _built_in()
"""The built-in schemes by name, sorted."""

# Read as module attributes (the plugins' schemes included), made the first time one is read, not when this module
# is imported: a plugin's module imports fedskew.data.partitions, which must be whole by then.
PLUGINS: dict[str, plugins.Plugin]
"""The installed plugins' schemes by name (each Plugin's `obj` is the class, `distribution` its package)."""
SCHEME_CLASSES: dict[str, type[Scheme]]
"""Scheme name -> its class (parameters, feasibility rules, draw): the built-in ones, then the plugins'."""
SCHEMES: dict[str, SchemeFn]
"""Scheme name -> fn(labels, num_classes, params, rng, natural_groups, dataset) -> client index arrays."""
SCHEME_PARAMS: dict[str, dict[str, type]]
"""Parameter names and types per scheme; names absent from SCHEME_DEFAULTS are required."""
SCHEME_DEFAULTS: dict[str, dict[str, Any]]
"""Defaults of the optional parameters per scheme."""

REGISTRIES = ("PLUGINS", "SCHEME_CLASSES", "SCHEMES", "SCHEME_PARAMS", "SCHEME_DEFAULTS")


def _registries() -> dict[str, dict]:
    found = _plugins(BUILT_IN)
    classes = {**BUILT_IN, **{name: plugin.obj for name, plugin in found.items()}}
    return {"PLUGINS": found, "SCHEME_CLASSES": classes,
            "SCHEMES": {name: cls.sample for name, cls in classes.items()},
            "SCHEME_PARAMS": {name: {key: declared.type for key, declared in cls.parameters.items()}
                              for name, cls in classes.items()},
            "SCHEME_DEFAULTS": {name: cls.defaults for name, cls in classes.items()}}


def __getattr__(name: str) -> dict:
    """One of the REGISTRIES, all made at the first read (a broken plugin raises its PluginError at every read)."""
    if name not in REGISTRIES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals().update(_registries())
    return globals()[name]
