"""Pieces from a researcher's own installed package, declared as entry points.

A package adds a method, dataset source, partition scheme or model to fedskew by declaring an entry point in
one of the GROUPS (in its pyproject.toml: `[project.entry-points."fedskew.methods"] fedfocal =
"fedfocal.method:FedFocal"`). The entry point's name is what params.yaml and experiments call the piece.
Listing the entry points reads the installed packages' metadata; loading one imports its module (and so, for
a method, torch), which happens only where an installed package declares one. Every problem with a plugin is
a PluginError (a ConfigError, so commands report it in one line) that names the entry point and the
distribution declaring it, and says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import metadata

from fedskew.config_errors import ConfigError

# The kind of piece -> the entry-point group that declares it.
GROUPS = {"method": "fedskew.methods", "dataset": "fedskew.datasets", "partition": "fedskew.partitions",
          "model": "fedskew.models"}


class PluginError(ConfigError):
    """An installed package declares a piece that fedskew cannot use; the message names the entry point."""


@dataclass(frozen=True)
class Plugin:
    """One loaded entry point: the piece (`obj`) and where it comes from."""

    kind: str
    name: str           # the entry point's name: what params.yaml calls the piece
    value: str          # "module:attribute"
    distribution: str   # the installed distribution that declares it
    obj: object

    @property
    def where(self) -> str:
        return (f"entry point {self.name!r} = {self.value!r} in group {GROUPS[self.kind]} of distribution "
                f"{self.distribution!r}")

    def error(self, problem: str) -> PluginError:
        return PluginError(f"{self.where}: {problem}")


def _distribution(entry: metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return dist.name if dist is not None else "(unknown)"


@cache
def loaded(kind: str) -> dict[str, Plugin]:
    """The pieces of kind `kind` ("method", "dataset", "partition", "model") that installed packages declare,
    by entry-point name, each imported. A name declared twice, or a module that fails to import, is an error."""
    found: dict[str, Plugin] = {}
    for entry in sorted(metadata.entry_points(group=GROUPS[kind]), key=lambda e: (e.name, e.value)):
        distribution = _distribution(entry)
        if entry.name in found:
            raise PluginError(f"two entry points of group {GROUPS[kind]} are named {entry.name!r}: "
                              f"{found[entry.name].value!r} of distribution {found[entry.name].distribution!r} and "
                              f"{entry.value!r} of distribution {distribution!r}; rename one, or uninstall one")
        try:
            obj = entry.load()
        except Exception as error:  # whatever the package raises on import, reported with where it comes from
            raise PluginError(f"entry point {entry.name!r} = {entry.value!r} in group {GROUPS[kind]} of "
                              f"distribution {distribution!r} failed to load: {type(error).__name__}: {error}; "
                              f"fix the package, or uninstall it (pip uninstall {distribution})") from error
        found[entry.name] = Plugin(kind, entry.name, entry.value, distribution, obj)
    return found


def class_problem(plugin: Plugin, attributes: tuple[str, ...], what: str) -> str | None:
    """Why a loaded entry point is not a class with `attributes`, named as its entry point is (`what` says what
    to subclass), or None."""
    cls = plugin.obj
    if not isinstance(cls, type) or any(not hasattr(cls, attribute) for attribute in attributes):
        return f"is not a {what}"
    if vars(cls).get("name") != plugin.name:
        return (f"the class sets name = {vars(cls).get('name')!r}, but params.yaml calls it by the entry point's "
                f"name; write name = {plugin.name!r} in the class")
    return None


# What a method class must have to be described (fedskew.declarations.describe_method); every subclass of
# fedskew.fl.fedavg.FedAvg (federated) or fedskew.sfl.base.SplitAlgorithm (split) has them.
METHOD_ATTRIBUTES = ("name", "family", "panel", "hyperparameters", "sgd_only", "switches", "version")


def method_problem(plugin: Plugin) -> str | None:
    """Why a loaded `fedskew.methods` entry point is not a method fedskew can run, or None."""
    return class_problem(plugin, METHOD_ATTRIBUTES, "method class: subclass fedskew.fl.fedavg.FedAvg (a federated "
                                                    "method) or fedskew.sfl.base.SplitAlgorithm (a split one)")


# What a dataset source class must have to be described (fedskew.declarations.describe_source); every subclass
# of fedskew.data.datasets.base.DatasetSource that declares its input shape and classes has them.
SOURCE_ATTRIBUTES = ("name", "input_shape", "num_classes", "natural_partition", "arrives", "options",
                     "source_files", "materialise", "version")


def source_problem(plugin: Plugin) -> str | None:
    """Why a loaded `fedskew.datasets` entry point is not a dataset source fedskew can use, or None."""
    problem = class_problem(plugin, SOURCE_ATTRIBUTES, "dataset source class: subclass "
                            "fedskew.data.datasets.base.GeneratedSource (made from its spec) or DatasetSource, and "
                            "set input_shape and num_classes")
    if problem is None and plugin.obj.arrives not in ("embedded", "download", "by hand"):
        return f"arrives = {plugin.obj.arrives!r}; it must be 'embedded', 'download' or 'by hand'"
    return problem
