"""The files of fedskew's own code that a phase of the workflow runs: what DVC's stages depend on (fedskew.dvcstages).

A phase's Snakemake jobs run `python -m fedskew <command>`; its code is the modules its entry points import (every
`import` of fedskew's own modules, in functions too, followed to the end: PHASES), the files of the methods, dataset
sources and partition schemes its suites use (the modules that find their package's members by importing every
file of it, fedskew.discovery, contribute only those: DISCOVERING), and the data a module reads beside it
(`Path(__file__).parent / "<name>"`). The source is read, never imported.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from fedskew.config import ConfigError, Params


class DvcFilesError(ConfigError):
    """dvc.yaml or dvc.lock cannot be written as asked (reported in one line, as a params.yaml error is)."""


@dataclass(frozen=True)
class Phase:
    """What a phase's Snakemake jobs run: `python -m fedskew <command>`, whose work is in `entry_points`."""

    command: str
    entry_points: tuple[str, ...]  # modules, or `module:function` for one function and the module's top level
    rule: str


# fedskew.config reads and checks params.yaml in every command; cli.cmd_<command> calls the rest.
PHASES = {
    "download": Phase("download", ("fedskew.config", "fedskew.data.registry"), "workflow/rules/download.smk"),
    "partition": Phase("partition", ("fedskew.config", "fedskew.job:prepare_partition"),
                       "workflow/rules/partition.smk"),
    "train": Phase("train", ("fedskew.config", "fedskew.job"), "workflow/rules/train.smk"),
    "aggregate": Phase("aggregate", ("fedskew.config", "fedskew.report.tables", "fedskew.report.figures",
                                     "fedskew.report.local_drift"), "workflow/rules/aggregate.smk"),
    "compare": Phase("compare", ("fedskew.config", "fedskew.report.compare"), "workflow/rules/aggregate.smk"),
    # a ledger of one's own: the command's file, and the own ledger it writes with --file (not the papers')
    "claims": Phase("claims", ("fedskew.config", "fedskew.reproduce.commands:add_parser", "fedskew.reproduce.own_ledger"),
                    "workflow/rules/reproduce.smk"),
}

# The modules that import every file of their package to find its members (fedskew.discovery), with the kind of
# member: a stage depends on the members its suites use, not on the others.
DISCOVERING = {"fedskew.fl": "algorithm", "fedskew.sfl": "algorithm", "fedskew.data.datasets": "source",
               "fedskew.data.partitions.registry": "scheme"}

_DATA_BESIDE = re.compile(r'Path\(__file__\)\.parent / "([\w.-]+)"')


# ---------------------------------------------------------------------------------------------------------------
# The code a phase runs


def _with_parents(name: str) -> list[str]:
    """`a.b.c` -> a, a.b, a.b.c: importing a module runs its packages' __init__ first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


_IMPORTS = (ast.Import, ast.ImportFrom)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _import_nodes(tree: ast.Module, function: str | None) -> list[ast.AST]:
    """Every import statement of the module; with `function`, those that run when the module is imported (outside
    any function) and those of that one top-level function."""
    every = [node for node in ast.walk(tree) if isinstance(node, _IMPORTS)]
    if function is None:
        return every
    chosen = [node for node in tree.body if isinstance(node, _FUNCTIONS) and node.name == function]
    if not chosen:
        raise DvcFilesError(f"an entry point names {function}(), which its module does not define at its top "
                            "level: correct fedskew.phase_code.PHASES")
    in_functions = {id(node) for f in ast.walk(tree) if isinstance(f, _FUNCTIONS)
                    for node in ast.walk(f) if isinstance(node, _IMPORTS)}
    return [n for n in every if id(n) not in in_functions] + [n for n in ast.walk(chosen[0]) if isinstance(n, _IMPORTS)]


class SourceTree:
    """fedskew's modules under root/src and what each imports (each file read once)."""

    def __init__(self, root: Path):
        self.root = root
        self._imports: dict[str, set[str]] = {}

    def file(self, module: str) -> Path | None:
        """The file of `module` (a package's __init__.py), or None if there is none."""
        base = self.root / "src" / Path(*module.split("."))
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return candidate
        return None

    def package_of(self, module: str) -> str:
        path = self.file(module)
        return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]

    def imports(self, entry: str) -> set[str]:
        """The fedskew modules that `entry` (`module` or `module:function`) imports, with their packages."""
        if entry not in self._imports:
            self._imports[entry] = self._read_imports(entry)
        return self._imports[entry]

    def _read_imports(self, entry: str) -> set[str]:
        name, _, function = entry.partition(":")
        path = self.file(name)
        if path is None:
            raise DvcFilesError(f"{name} has no file under {self.root / 'src'}: correct fedskew.phase_code.PHASES")
        package = self.package_of(name)
        found: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text(), str(path)), function or None):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: `.` is the module's package, each further dot one package up
                    parts = package.split(".")
                    base = ".".join([*parts[:len(parts) - node.level + 1], *([base] if base else [])])
                # `from a import b` imports a, and b too where b is a module of a
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names
                                   if self.file(f"{base}.{alias.name}"))]
            for target in targets:
                if target == "fedskew" or target.startswith("fedskew."):
                    found.update(m for m in _with_parents(target) if self.file(m))
        return found

    def data_beside(self, module: str) -> list[Path]:
        """The files or folders a module names beside itself (`Path(__file__).parent / "<name>"`): data it reads."""
        path = self.file(module)
        assert path is not None
        return [path.parent / name for name in _DATA_BESIDE.findall(path.read_text())]

    def code_of(self, phase: Phase, members: dict[str, set[str]]) -> list[str]:
        """The files, relative to root, of every module `phase` runs and of the data they read beside them:
        its entry points' imports followed to the end, and the members its suites use of each DISCOVERING module
        among them (`members`: kind -> modules)."""
        modules: set[str] = set()
        walked: set[str] = set()
        pending = [*phase.entry_points]
        while pending:
            entry = pending.pop()
            if entry in walked:
                continue
            walked.add(entry)
            name = entry.partition(":")[0]
            found = self.imports(entry) | set(_with_parents(name))
            modules |= found
            pending += sorted(found - {name})  # each module it imports, whole
            for discovering in found & DISCOVERING.keys():
                package = self.package_of(discovering)
                pending += sorted(m for m in members[DISCOVERING[discovering]] if m.startswith(package + "."))
        files = {self.file(m) for m in modules} | {p for m in modules for p in self.data_beside(m)}
        return sorted(str(f.relative_to(self.root)) for f in files)


@dataclass(frozen=True)
class Uses:
    """The names of params.yaml that some suites train on, in order of first use."""

    datasets: tuple[str, ...]
    partitions: tuple[str, ...]
    methods: tuple[str, ...]

    @classmethod
    def of(cls, params: Params, suites: list[str]) -> Uses:
        bodies = [params.raw["suites"][s] for s in suites]
        settings = [setting for body in bodies for setting in body["settings"]]
        return cls(tuple(dict.fromkeys(s["dataset"] for s in settings)),
                   tuple(dict.fromkeys(p for s in settings for p in s["partitions"])),
                   tuple(dict.fromkeys(m for body in bodies for m in body["methods"])))

    def members(self, params: Params) -> dict[str, set[str]]:
        """Kind of member (DISCOVERING) -> the modules that define the members these suites use."""
        from fedskew.algorithms import ALGORITHMS
        from fedskew.data.datasets import dataset_sources
        from fedskew.data.partitions.registry import SCHEME_CLASSES

        classes = {"algorithm": [ALGORITHMS[params.method_spec(m)["algorithm"]] for m in self.methods],
                   "source": [dataset_sources()[params.dataset_spec(d)["source"]] for d in self.datasets],
                   "scheme": [SCHEME_CLASSES[params.partition_spec(p)["scheme"]] for p in self.partitions]}
        # A plugin's method, source or scheme is not fedskew's code: its runs change with its class's `version`
        # (their ids), so only fedskew's own modules are a stage's dependencies.
        return {kind: {cls.__module__ for cls in found if cls.__module__.startswith("fedskew.")}
                for kind, found in classes.items()}
