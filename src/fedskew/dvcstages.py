"""dvc.yaml and dvc.lock from what computes each phase, so that `dvc status` names the stages Snakemake would rerun.

dvc.yaml is written, never edited: `python -m fedskew dvc-stages` writes it from params.yaml and the imports of
src/fedskew, and a test fails while the committed one is not what it writes.

- One stage a phase: `download`, `partition`, and `train-<suite>`, `aggregate-<suite>` for each suite of
  `run.suites`, `compare-<suite>` for each that runs two methods or more, `claims-<name>` for each claims file of
  experiments/claims/ about suites of `run.suites` (a stage name takes letters, digits, `_` and `-`: a dot of a
  suite's name becomes `_`). Each calls
  one Snakemake target (Snakemake reruns the jobs whose inputs or run ids changed; the outputs are `persist`ed so
  DVC does not delete them first).
- Its `deps` are the files its code runs: the modules its entry points import (every `import` of fedskew's own
  modules, in functions too, followed to the end; PHASES), the files of the methods, dataset sources and partition
  schemes its suites use (the modules that find their package's members by importing every file of it,
  fedskew.discovery, contribute only those: DISCOVERING), the data a module reads beside it
  (`Path(__file__).parent / "<name>"`), its Snakemake rule file, and the outputs of the stages before it.
- Its `params` are the keys of params.yaml it reads, by name: a suite's train stage reads `suites.<suite>`,
  `training.<suite>`, and `methods.`, `datasets.`, `partitions.` of the names it uses (a method the suite names
  that `methods` does not define is an algorithm with its defaults: no key). DVC splits a key path at dots, so a
  dot in a name is written `?` (one character, any: the key `partitions.dir0?5` reads `partitions: {dir0.5: ...}`).

dvc.lock is recorded by fedskew.dvclock (`python -m fedskew dvc-lock`).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedskew.config import ConfigError, Params, load_params
from fedskew.runfiles import atomic_write_text

STAGES_COMMAND = "python -m fedskew dvc-stages"


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
                            "level: correct fedskew.dvcstages.PHASES")
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
            raise DvcFilesError(f"{name} has no file under {self.root / 'src'}: correct fedskew.dvcstages.PHASES")
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


# ---------------------------------------------------------------------------------------------------------------
# The keys of params.yaml a stage reads


@dataclass(frozen=True)
class Key:
    """A key path DVC reads, and the file it is in: None for params.yaml, else the experiment that defines it."""

    file: str | None
    path: str


def param_key(params: Params, section: str, name: str, *rest: str) -> Key:
    """DVC's key path for `section.name` (and deeper keys), in the file that defines the name: a dot in `name`
    written `?`, or, where `?` would also match another name of the section, as the one character a name may
    hold besides letters, digits, `_` and `-` (workflow/schemas/params.schema.yaml): a dot."""
    pattern = name
    if "." in name:
        pattern = name.replace(".", "?")
        if [other for other in map(str, params.raw[section]) if fnmatch.fnmatchcase(other, pattern)] != [name]:
            pattern = name.replace(".", "[!0-9A-Za-z_-]")
    return Key(params.origins.get((section, name)), ".".join([section, pattern, *rest]))


def dvc_params(keys: list[Key]) -> list:
    """A stage's `params` as dvc.yaml writes them: params.yaml's keys, then `{<experiment file>: [keys]}` each."""
    by_file: dict[str | None, list[str]] = {}
    for key in keys:
        by_file.setdefault(key.file, [])
        if key.path not in by_file[key.file]:
            by_file[key.file].append(key.path)
    plain = by_file.pop(None, [])
    return [*plain, *({file: paths} for file, paths in by_file.items())]


def suite_keys(params: Params, suite: str) -> list[Key]:
    """What a suite's runs and tables are made of: its grid, training (and the blocks it inherits), and the methods,
    datasets, partitions it names (a method that `methods` does not define is an algorithm with its defaults: no
    key)."""
    uses = Uses.of(params, [suite])
    raw = params.raw
    return [param_key(params, "suites", suite),
            *(param_key(params, "training", block) for block in params.training_blocks(suite)
              if block in raw.get("training", {})),
            *(param_key(params, "methods", m) for m in uses.methods if m in raw.get("methods", {})),
            *(param_key(params, "datasets", d) for d in uses.datasets),
            *(param_key(params, "partitions", p) for p in uses.partitions)]


# ---------------------------------------------------------------------------------------------------------------
# dvc.yaml


@dataclass(frozen=True)
class Stage:
    name: str
    phase: str
    suites: tuple[str, ...]  # the suites whose runs it trains or reads; (): it serves every suite of run.suites
    body: dict


def stage_name(phase: str, suite: str) -> str:
    return f"{phase}-{suite.replace('.', '_')}"


def stages(params: Params, root: Path) -> list[Stage]:
    """dvc.yaml's stages for params.yaml and the code under root/src."""
    suites = params.default_suites
    names = [stage_name("train", s) for s in suites]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise DvcFilesError(f"run.suites holds suites that differ only by `.` and `_` ({', '.join(clashes)}); "
                            "DVC's stage names cannot tell them apart: rename one in params.yaml")

    tree = SourceTree(root)

    def code(phase: str, suites_served: list[str]) -> list[str]:
        return tree.code_of(PHASES[phase], Uses.of(params, suites_served).members(params)) + [PHASES[phase].rule]

    every = Uses.of(params, suites)
    settings = [param_key(params, "suites", s, "settings") for s in suites]
    datasets = [param_key(params, "datasets", d) for d in every.datasets]
    found = [
        Stage("download", "download", (), {
            "cmd": "snakemake --cores all download_all",
            "deps": code("download", suites),
            "params": dvc_params([Key(None, "run.suites"), *settings, *datasets]),
            "outs": [{"data/raw": {"persist": True}}]}),
        Stage("partition", "partition", (), {
            "cmd": "snakemake --cores all partition_all",
            "deps": ["data/raw", *code("partition", suites)],
            "params": dvc_params([Key(None, "run.suites"), *settings,
                                  *(param_key(params, "suites", s, "seeds") for s in suites), *datasets,
                                  *(param_key(params, "partitions", p) for p in every.partitions)]),
            "outs": [{"data/partitions": {"persist": True}}]}),
    ]
    for suite in suites:
        found.append(Stage(stage_name("train", suite), "train", (suite,), {
            "cmd": f"snakemake --cores all results/runs/{suite}/TRAINED",
            "deps": ["data/raw", "data/partitions", *code("train", [suite])],
            "params": dvc_params(suite_keys(params, suite)),
            "outs": [{f"results/runs/{suite}": {"persist": True}},
                     {f"results/checkpoints/{suite}": {"persist": True}}]}))
    for suite in suites:
        found.append(Stage(stage_name("aggregate", suite), "aggregate", (suite,), {
            "cmd": f"snakemake --cores all results/tables/{suite}.md",
            "deps": [f"results/runs/{suite}", "data/partitions", *code("aggregate", [suite])],  # label counts
            "params": dvc_params(suite_keys(params, suite)),  # the tables print every spec and the protocol
            "outs": [*({f"results/tables/{suite}.{ext}": {"cache": False}} for ext in ("md", "csv", "tex")),
                     {f"results/tables/runs/{suite}.csv": {"cache": False}}],
            "metrics": [{f"results/tables/{suite}.json": {"cache": False}}],
            "plots": [{f"results/figures/{suite}": {"cache": False}}]}))
    for suite in filter(params.compared, suites):
        found.append(Stage(stage_name("compare", suite), "compare", (suite,), {
            "cmd": f"snakemake --cores all results/tables/compare/{suite}.md",
            "deps": [f"results/runs/{suite}", "data/partitions", *code("compare", [suite])],
            "params": dvc_params(suite_keys(params, suite)),
            "outs": [{f"results/tables/compare/{suite}.{ext}": {"cache": False}} for ext in ("md", "csv", "png")],
            "metrics": [{f"results/tables/compare/{suite}.json": {"cache": False}}]}))
    return found + _own_ledger_stages(params, root, code)


def _own_ledger_stages(params: Params, root: Path, code) -> list[Stage]:
    """`claims-<name>` for each claims file of experiments/claims/ whose suites are all of `run.suites` (the others'
    runs are outside DVC's stages, as their tables are)."""
    from fedskew.reproduce.own_claims import CLAIMS_FOLDER, LEDGER, claims_files, load_own_claims

    found = []
    for path in claims_files(root / CLAIMS_FOLDER):
        own = load_own_claims(path, params)
        if not set(own.suites) <= set(params.default_suites):
            continue
        found.append(Stage(stage_name("claims", own.name), "claims", tuple(own.suites), {
            "cmd": f"snakemake --cores all {LEDGER.format(name=own.name, ext='md')}",
            "deps": [(CLAIMS_FOLDER / path.name).as_posix(), *(f"results/runs/{s}" for s in own.suites),
                     *code("claims", own.suites)],
            "params": dvc_params([k for s in own.suites for k in suite_keys(params, s)]),
            "outs": [{LEDGER.format(name=own.name, ext="md"): {"cache": False}}],
            "metrics": [{LEDGER.format(name=own.name, ext="json"): {"cache": False}}]}))
    return found


HEADER = f"""\
# Written by `{STAGES_COMMAND}` from params.yaml and the imports of src/fedskew: do not edit it, run that
# again (after a change of run.suites, of a suite's names, of experiments/claims/ or of the modules a phase
# imports; fedskew.dvcstages says what each phase runs). tests/unit/test_dvc_lock.py fails while this file is not
# what it writes.
#
# DVC versions what the Snakemake workflow produces; it keeps no second DAG. Each stage calls one Snakemake target,
# which reruns only the jobs whose inputs or run ids changed (outputs are `persist`ed so DVC does not delete them
# first). `deps` are the modules the phase runs and the earlier stages' outputs; `params` are the keys of
# params.yaml it reads, by name, so `dvc status` names exactly the stages a change affects. Train, aggregate and
# compare are one stage per suite of run.suites, an own ledger one per claims file about them. A dot in a key's
# name is written `?`: DVC splits key paths at dots.
"""


def dvc_yaml_text(params: Params, root: Path) -> str:
    """What `dvc-stages` writes into root/dvc.yaml for `params`."""
    return HEADER + yaml.safe_dump({"stages": {s.name: s.body for s in stages(params, root)}}, sort_keys=False,
                                   width=120)


def write_stages(root: Path = Path(".")) -> str:
    """Write root/dvc.yaml for root/params.yaml (the file DVC reads); a line saying what changed."""
    params = load_params(root / "params.yaml")
    text = dvc_yaml_text(params, root)
    path = root / "dvc.yaml"
    if path.exists() and path.read_text() == text:
        return "dvc.yaml is up to date"
    atomic_write_text(path, text)
    return f"dvc.yaml written: stages {', '.join(yaml.safe_load(text)['stages'])}"
