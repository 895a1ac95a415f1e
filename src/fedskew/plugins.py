"""Pieces from a researcher's own installed package, declared as entry points.

A package adds a method, dataset source, partition scheme or model to fedskew by declaring an entry point in
one of the GROUPS (in its pyproject.toml: `[project.entry-points."fedskew.methods"] fedfocal =
"fedfocal.method:FedFocal"`). The entry point's name is what params.yaml and experiments call the piece.
Listing the entry points reads the installed packages' metadata; loading one imports its module (and so, for
a method, torch), which happens only where an installed package declares one. Every problem with a plugin is
a PluginError (a ConfigError, so commands report it in one line) that names the entry point and the
distribution declaring it, and says what to do.

Whatever a plugin's module raises on import is such a problem, `SystemExit` included (an `exit()` at import, or
argparse reading fedskew's command line): a plugin can never end a command as if it had succeeded. Ctrl-C (and
fedskew's own stop on SIGTERM) still stops the command, its message naming the plugin that was importing. What the
module prints while it is imported goes to stderr, never into a command's output (`--json`). A `SystemExit` that a
plugin's code raises later, while a command runs, is traced back to its entry point by `exit_error`.

A plugin piece's code is part of the ids of the runs it computes (`record`, fedskew.plugin_code): editing it
retrains its runs, with no version to remember. Describing a method plugin imports torch: its class subclasses
fedskew's FedAvg (torch code), and validation reads its declarations from the class, so with a method plugin
installed the commands that validate params.yaml import torch; a scheme that imports none keeps them torch-free.

FEDSKEW_IGNORE_PLUGINS_IN names folders (os.pathsep-separated) whose installed distributions fedskew takes no
plugin from: set to the environment's site-packages, fedskew runs as shipped. fedskew's own tests set it to the
folders on their path as they start (tests/conftest.py), so that they see only the plugins they install.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

from fedskew import plugin_code
from fedskew.config_errors import ConfigError
from fedskew.declarations import Hyperparameter

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
        return _where(GROUPS[self.kind], self.name, self.value, self.distribution)

    def error(self, problem: str) -> PluginError:
        return PluginError(f"{self.where}: {problem}")


def _where(group: str, name: str, value: str, distribution: str) -> str:
    return f"entry point {name!r} = {value!r} in group {group} of distribution {distribution!r}"


def _distribution(entry: metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return dist.name if dist is not None else "(unknown)"


IGNORED_FOLDERS = "FEDSKEW_IGNORE_PLUGINS_IN"


def visible(dist: metadata.Distribution | None) -> bool:
    """Whether fedskew takes plugins from an installed distribution: yes, unless it is installed in a folder that
    FEDSKEW_IGNORE_PLUGINS_IN names (the folder its metadata is in, compared as a resolved path)."""
    ignored = _ignored(os.environ.get(IGNORED_FOLDERS, ""))
    if not ignored or dist is None:
        return True
    try:
        where = Path(dist.locate_file("")).resolve()
    except (NotImplementedError, OSError, TypeError):  # a distribution that is no folder's: never ignored
        return True
    return where not in ignored


@cache
def _ignored(folders: str) -> frozenset[Path]:
    return frozenset(Path(folder).resolve() for folder in folders.split(os.pathsep) if folder)


def entries(kind: str) -> list[metadata.EntryPoint]:
    """The entry points of kind `kind`'s group that fedskew takes (`visible`), by name and value; none imported."""
    found = metadata.entry_points(group=GROUPS[kind])
    return sorted((entry for entry in found if visible(getattr(entry, "dist", None))), key=lambda e: (e.name, e.value))


@cache
def loaded(kind: str) -> dict[str, Plugin]:
    """The pieces of kind `kind` ("method", "dataset", "partition", "model") that installed packages declare,
    by entry-point name, each imported. A name declared twice, or a module that fails to import, is an error."""
    found: dict[str, Plugin] = {}
    for entry in entries(kind):
        distribution = _distribution(entry)
        if entry.name in found:
            raise PluginError(f"two entry points of group {GROUPS[kind]} are named {entry.name!r}: "
                              f"{found[entry.name].value!r} of distribution {found[entry.name].distribution!r} and "
                              f"{entry.value!r} of distribution {distribution!r}; rename one, or uninstall one")
        obj = _load(entry, _where(GROUPS[kind], entry.name, entry.value, distribution), distribution)
        found[entry.name] = Plugin(kind, entry.name, entry.value, distribution, obj)
    return found


class _Printed(io.TextIOBase):
    """What a plugin's module prints while it is imported: its last _PRINTED_KEPT characters (whatever it prints,
    the memory held stays bounded), passed on to stderr, or, when the import fails, its last line quoted in the
    error."""

    def __init__(self) -> None:
        self._chunks: list[str] = []
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._chunks.append(text)
        self._size += len(text)
        if self._size > 2 * _PRINTED_KEPT:  # trimmed now and then, so that writing stays linear in what is written
            self._chunks = [self.text]
            self._size = len(self._chunks[0])
        return len(text)

    @property
    def text(self) -> str:
        return "".join(self._chunks)[-_PRINTED_KEPT:]


_PRINTED_KEPT = 64 * 1024


def _load(entry: metadata.EntryPoint, where: str, distribution: str) -> object:
    """The object an entry point names, its module imported with what it prints held back (then written to
    stderr); whatever the import raises is a PluginError naming `where`, but a stop (Ctrl-C, SIGTERM's)."""
    printed = _Printed()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            obj = entry.load()
    except BaseException as error:  # noqa: BLE001 - a plugin's SystemExit must not pass for success
        if _stops_the_command(error):
            raise type(error)(f"{str(error) or 'interrupted'} while importing {where}") from error
        said = next((line.strip() for line in reversed(printed.text.splitlines()) if line.strip()), "")
        raise PluginError(f"{where} failed to load: {_described(error)}"
                          f"{f' (it printed {said[:300]!r})' if said else ''}; fix the package, or uninstall it "
                          f"(pip uninstall {distribution})") from error
    sys.stderr.write(printed.text)
    return obj


def _stops_the_command(error: BaseException) -> bool:
    """Ctrl-C, or fedskew's own stop (fedskew.job.Terminated, raised on SIGTERM): they stop the command still."""
    return isinstance(error, KeyboardInterrupt) or (
        not isinstance(error, (Exception, SystemExit, GeneratorExit))
        and type(error).__module__.split(".")[0] == "fedskew")


def _described(error: BaseException) -> str:
    """An exception on one line: a SystemExit with its code, any other with its message's whitespace folded."""
    if isinstance(error, SystemExit):
        return (f"its module exited (SystemExit({error.code!r})) as it was imported, which would end fedskew's "
                "command as if it had succeeded: a plugin's module must neither exit nor read the command line")
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def exit_error(error: SystemExit) -> Exception:
    """What to report of a SystemExit that ended a command's work (argparse's own never gets there): a PluginError
    naming the entry point whose package's code raised it, with the file and line, or else a RuntimeError naming
    where it was raised. Either way the command failed: nothing it was to do can be taken as done."""
    frames = list(traceback.walk_tb(error.__traceback__))
    if not frames:
        return RuntimeError(f"SystemExit({error.code!r}) ended the command before it finished")
    packages = {}  # each plugin's top-level package -> an entry point it declares (fedskew's own frames are not one)
    for kind in GROUPS:
        for entry in entries(kind):
            if entry.module.split(".")[0] != "fedskew":
                packages.setdefault(entry.module.split(".")[0], entry)
    for frame, line in reversed(frames):  # the innermost frame in a plugin's package: its code, or what it called
        entry = packages.get(str(frame.f_globals.get("__name__", "")).split(".")[0])
        if entry is not None:
            distribution = _distribution(entry)
            return PluginError(f"{_where(entry.group, entry.name, entry.value, distribution)}: its code ended the "
                               f"command with SystemExit({error.code!r}) at {frame.f_code.co_filename}:{line}; a "
                               "plugin must raise an exception, never exit: fix the package, or uninstall it "
                               f"(pip uninstall {distribution})")
    frame, line = frames[-1]
    return RuntimeError(f"SystemExit({error.code!r}) raised at {frame.f_code.co_filename}:{line} ended the command "
                        "before it finished")


@cache
def record(kind: str, name: str) -> dict[str, str] | None:
    """What a run of the plugin piece `name` of kind `kind` records of it (fedskew.config.RunConfig.to_dict's
    `plugins`): its distribution and that distribution's version, its entry point, and the identity of its
    package's code (fedskew.plugin_code.identity), which its runs' ids fold in. None where no installed package
    declares that name (a built-in piece's). Read from the metadata and the files, without importing the plugin;
    once per process."""
    entry = next((entry for entry in entries(kind) if entry.name == name), None)
    if entry is None:
        return None
    dist = getattr(entry, "dist", None)
    return {"distribution": _distribution(entry), "version": dist.version if dist is not None else "(unknown)",
            "entry_point": entry.value, "code": plugin_code.identity(entry.value)}


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
    return (class_problem(plugin, METHOD_ATTRIBUTES, "method class: subclass fedskew.fl.fedavg.FedAvg (a federated "
                                                     "method) or fedskew.sfl.base.SplitAlgorithm (a split one)")
            or declarations_problem(plugin.obj.hyperparameters, "hyperparameter"))


def declarations_problem(declared: object, what: str) -> str | None:
    """Why a class's declared hyperparameters (`what`: "hyperparameter") or options ("option") cannot be used, or
    None. The class checked them when it was made (fedskew.declarations.declared_hyperparameters); they are checked
    again as the plugin is described, since a package may change them afterwards, and every run would record a
    default that params.yaml could not give (NaN, a value beyond its own bounds)."""
    if not isinstance(declared, dict):
        return f"its {what}s are a {type(declared).__name__}; declare a dict of name -> Hyperparameter"
    for key, value in declared.items():
        if not isinstance(value, Hyperparameter):
            return f"{what} {key!r} is declared as {value!r}; declare it as fedskew.declarations.Hyperparameter(...)"
        problem = value.problem()
        if problem:
            return f"{what} {key!r}: {problem}"
    return None


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
    return problem or declarations_problem(plugin.obj.options, "option")
