"""A researcher's own experiments: files under experiments/, merged over params.yaml.

Each `experiments/<name>.yaml` may define `datasets`, `partitions`, `methods`, `suites` and `training`, in the
shapes params.yaml gives them. Every entry point reads them the same way (fedskew.config.load_params: the CLI,
the Snakefile, dvc.yaml's stages), so the shipped params.yaml and its tests stay untouched. The rules:

- An experiment adds names; it never replaces one. A name that params.yaml or another experiment already
  defines is an error naming both files, so a shipped suite cannot change under its table.
- `run` and `reproduce` stay params.yaml's: each suite an experiment defines is built by `snakemake --cores all`
  besides run.suites (`Params.default_suites`), by DVC through its stages in experiments/dvc.yaml
  (fedskew.dvcstages), and by `fedskew run --suite NAME`; `make run` builds run.suites alone.
- experiments/dvc.yaml is not an experiment: it is those stages, written by `fedskew dvc-stages`.
- A training block may write `inherit: <block>`: the settings of that block (of params.yaml or of any
  experiment), with its own written over them, and `overrides` merged per dataset (the inherited ones of the
  datasets its suite trains on). A run records the resolved
  settings, so how a block is written never changes a run id. Every suite needs a training block
  (fedskew.config_checks): there are no silent defaults.
- A problem in a name an experiment defines is reported with the experiment's file (`origin_of`).
- Each file is read as params.yaml is (fedskew.user_files): a regular UTF-8 file of the project, no key written
  twice, aliases bounded; editors' lock and backup files (`.#x.yaml`, `x.yaml~`) are not experiments.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

from fedskew import user_files
from fedskew.config_errors import ConfigError, suggestion

SECTIONS = ("datasets", "partitions", "methods", "suites", "training")
INHERIT = "inherit"


@dataclass(frozen=True)
class Merged:
    """params.yaml with the experiments merged in, and which file defines each name an experiment adds."""

    raw: dict
    origins: dict[tuple[str, str], str] = field(default_factory=dict)  # (section, name) -> experiment file
    inherits: dict[str, str] = field(default_factory=dict)             # training block -> the block it inherits
    lines: dict[str | None, dict[str, int]] = field(default_factory=dict)  # file (None: the params file) ->
                                                                           # key path -> the line it is written on

    def line_of(self, origin: str | None, where: str) -> int | None:
        """The line of the file `origin` (None: the params file) where a problem's key path is written, or the
        nearest enclosing key that is (a missing key is reported at its mapping); None where nothing is known."""
        written = self.lines.get(origin, {})
        while where:
            if where in written:
                return written[where]
            where = where[:max(where.rfind("."), where.rfind("["), 0)]
        return None

    def origin_of(self, where: str) -> str | None:
        """The experiment file that defines the name a problem's key path (`suites.focal.methods[1]`) is in."""
        for (section, name), origin in self.origins.items():
            prefix = f"{section}.{name}"
            if where == prefix or where.startswith((prefix + ".", prefix + "[")):
                return origin
        return None


NOT_EXPERIMENTS = ("dvc.yaml",)  # DVC's stages of the experiments' suites (fedskew.dvcstages), beside them


def experiment_files(folder: Path) -> list[Path]:
    """The experiment files of a folder, by name (none if it does not exist): its `*.yaml` and `*.yml`, without
    hidden files, editors' lock and backup files (fedskew.user_files.yaml_files) and NOT_EXPERIMENTS."""
    return [path for path in user_files.yaml_files(folder) if path.name not in NOT_EXPERIMENTS]


def experiment_sources(folder: Path | None) -> list[tuple[str, bytes]]:
    """Each experiment file of `folder` as (its name from the project root, its bytes), read strictly: a regular
    file of the project of at most fedskew.user_files.MAX_BYTES (its errors name the file)."""
    if folder is None:
        return []
    return [(_shown(path), user_files.read(path, folder.parent, _shown(path))) for path in experiment_files(folder)]


def merge(raw: dict, label: str, sources: list[tuple[str, bytes]], raw_lines: dict[tuple, int] | None = None) -> Merged:
    """`raw` (read from `label`, its key paths on `raw_lines` where known) with every experiment file of `sources`
    (`experiment_sources`) added, training inheritance resolved; a ConfigError listing every problem of the files'
    shapes and names."""
    merged = copy.deepcopy(raw) if isinstance(raw, dict) else raw
    origins: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    if not isinstance(merged, dict):
        return Merged(merged)
    lines = {None: _by_key_path(raw_lines or {})}
    for shown, data in sources:
        parsed = user_files.parse(data, shown)  # its errors name the file
        problems += _add(merged, origins, label, parsed)
        lines[shown] = _by_key_path(parsed.lines)
    if problems:
        raise ConfigError(f"the experiments are invalid ({len(problems)} problem(s)):\n  - " + "\n  - ".join(problems))
    result = Merged(merged, origins, lines=lines)
    inheritance = _resolve_inheritance(result)
    if inheritance:
        raise ConfigError(f"{label} is invalid ({len(inheritance)} problem(s)):\n  - " + "\n  - ".join(inheritance))
    return result


def _add(merged: dict, origins: dict[tuple[str, str], str], label: str, parsed: user_files.Document) -> list[str]:
    """Add one experiment file's names to `merged`; the problems found (nothing of a file with problems is added)."""
    document, shown = parsed.data, parsed.shown
    if document is None:
        return []
    if not isinstance(document, dict):
        return [f"{shown}: an experiment is a mapping of sections ({', '.join(SECTIONS)}), not a "
                f"{type(document).__name__}"]
    problems = [f"{shown}: `{key}` cannot be set by an experiment{suggestion(key, SECTIONS)}; its sections are "
                f"{', '.join(SECTIONS)} (each suite of an experiment is built besides run.suites)"
                for key in document if key not in SECTIONS]
    for section, body in document.items():
        if section not in SECTIONS:
            continue
        if not isinstance(body, dict):
            problems.append(f"{shown}: {section} must be a mapping of names, not a {type(body).__name__}")
            continue
        for name in body:
            if name in merged.get(section, {}):
                other = origins.get((section, name), label)
                problems.append(f"{shown}: {section}.{name} is already defined in {other}; an experiment adds names "
                                f"and replaces none: give yours another name")
    if problems:
        return problems
    for section, body in document.items():
        merged.setdefault(section, {}).update(copy.deepcopy(body))
        origins.update({(section, name): shown for name in body})  # named from the project root, as dvc.yaml's params
    return []


def _shown(path: Path) -> str:
    """An experiment file as messages and dvc.yaml's params name it: from the project root (the params file's
    folder): experiments/<name>.yaml."""
    return path.relative_to(path.parents[1]).as_posix()


def _resolve_inheritance(merged: Merged) -> list[str]:
    """Replace every training block's `inherit: <block>` by that block's settings under its own; the problems."""
    blocks = merged.raw.get("training")
    if not isinstance(blocks, dict):
        return []
    problems: list[str] = []
    resolved: dict[str, dict] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> dict | None:
        if name in resolved:
            return resolved[name]
        block = blocks[name]
        if not isinstance(block, dict) or INHERIT not in block:
            return block if isinstance(block, dict) else None
        parent = block[INHERIT]
        where = f"training.{name}.{INHERIT}"
        if not isinstance(parent, str) or parent not in blocks:
            problems.append(_located(merged, where, f"{parent!r} is not a training block{suggestion(parent, blocks)}; "
                                                    f"blocks: {', '.join(blocks)}"))
            return None
        if parent in chain:
            problems.append(_located(merged, where, f"{parent!r} inherits, through {' → '.join(chain)}, from "
                                                    f"{name!r}: a block cannot inherit from itself; break the chain"))
            return None
        merged.inherits[name] = parent
        base = resolve(parent, (*chain, parent))
        if base is None:
            return None
        own = {k: v for k, v in block.items() if k != INHERIT}
        overrides = {**_used(merged.raw, name, base.get("overrides", {})), **own.get("overrides", {})}
        settings = {k: v for k, v in {**base, **own}.items() if k != "overrides"}
        resolved[name] = {**settings, **({"overrides": overrides} if overrides else {})}
        return resolved[name]

    for name in list(blocks):
        resolve(name, (name,))
    blocks.update(resolved)
    return problems


def _used(raw: dict, suite: str, overrides: dict) -> dict:
    """The inherited per-dataset overrides of the datasets suite `suite` trains on (the others do not apply)."""
    body = raw.get("suites", {}).get(suite)
    if not isinstance(body, dict) or not isinstance(body.get("settings"), list):
        return overrides
    datasets = {setting.get("dataset") for setting in body["settings"] if isinstance(setting, dict)}
    return {dataset: settings for dataset, settings in overrides.items() if dataset in datasets}


def _located(merged: Merged, where: str, message: str) -> str:
    origin = merged.origin_of(where)
    return f"{origin}: {where}: {message}" if origin else f"{where}: {message}"


def _by_key_path(lines: dict[tuple, int]) -> dict[str, int]:
    """A parsed file's lines by key path as problems name it (`suites.focal.methods[1]`)."""
    return {user_files.key_path(path): line for path, line in lines.items() if path}


def locate(merged: Merged, problems: list[str]) -> list[str]:
    """Each problem with where it is written: the experiment's file for a name an experiment defines, and the line
    of its key where the file's lines are known (`experiments/focal.yaml: line 7: suites.focal.methods[1]: ...`)."""
    out = []
    for problem in problems:
        where = problem.split(": ", 1)[0]
        origin = merged.origin_of(where)
        line = merged.line_of(origin, where)
        located = f"line {line}: {problem}" if line is not None else problem
        out.append(f"{origin}: {located}" if origin else located)
    return out
