"""dvc.yaml and dvc.lock from what computes each phase, so that `dvc status` names the stages Snakemake would rerun.

DVC's stage files are written, never edited: `python -m fedskew dvc-stages` writes them from params.yaml, the
experiments and the imports of src/fedskew, and a test fails while the committed dvc.yaml is not what it writes.

- Two files. dvc.yaml, tracked, holds the stages of `run.suites`: it is the same, byte for byte, with or without
  a researcher's experiments. experiments/dvc.yaml, beside the experiments, holds their suites' stages (and those
  of claims files about them), each with `wdir: ..` so that it runs at the project root; DVC reads every dvc.yaml
  of the project (`dvc status`; `dvc repro --all-pipelines`), records those stages in experiments/dvc.lock, and a
  `git pull` of fedskew never meets a change of the user's.
- One stage a phase: `download`, `partition`, and `train-<suite>`, `aggregate-<suite>` for each suite,
  `compare-<suite>` for each that runs two methods or more, `claims-<name>` for each claims file of
  experiments/claims/ about suites DVC builds (a stage name takes letters, digits, `_` and `-`: a dot of a
  suite's name becomes `_`; every name is one stage's in both files, every output one stage's). Each calls
  one Snakemake target (Snakemake reruns the jobs whose inputs or run ids changed; the outputs are `persist`ed so
  DVC does not delete them first).
- Its `deps` are the files its code runs (fedskew.phase_code: the modules its entry points import, and the files
  of the methods, dataset sources and partition schemes its suites use), its Snakemake rule file, and the outputs
  of the stages before it.
- Its `params` are the keys of params.yaml it reads, by name: a suite's train stage reads `suites.<suite>`,
  `training.<suite>`, and `methods.`, `datasets.`, `partitions.` of the names it uses (a method the suite names
  that `methods` does not define is an algorithm with its defaults: no key), each in the file that defines it.
  DVC splits a key path at dots, so a dot in a name is written `?` (one character, any: the key
  `partitions.dir0?5` reads `partitions: {dir0.5: ...}`).

dvc.lock is recorded by fedskew.dvclock (`python -m fedskew dvc-lock`).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import yaml

from fedskew.config import Params, load_params
from fedskew.phase_code import PHASES, DvcFilesError, SourceTree, Uses
from fedskew.runfiles import atomic_write_text

STAGES_COMMAND = "python -m fedskew dvc-stages"


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


ROOT_FILE = "dvc.yaml"  # the project's, tracked: run.suites' stages
EXPERIMENTS_FILE = "experiments/dvc.yaml"  # a researcher's: their suites' stages, beside their experiments
_WDIR = {EXPERIMENTS_FILE: {"wdir": ".."}}  # a stage's command and paths are the project root's wherever it is


@dataclass(frozen=True)
class Stage:
    name: str
    phase: str
    suites: tuple[str, ...]  # the suites whose runs it trains or reads; (): it serves every suite of run.suites
    body: dict
    file: str = ROOT_FILE  # the dvc.yaml that holds it: ROOT_FILE, or EXPERIMENTS_FILE for the experiments' suites


def stage_name(phase: str, suite: str) -> str:
    return f"{phase}-{suite.replace('.', '_')}"


def stages(params: Params, root: Path) -> list[Stage]:
    """Every stage for params.yaml, the experiments and the code under root/src: run.suites' in dvc.yaml, the
    experiments' suites' in experiments/dvc.yaml, so that the tracked file is the same with or without them."""
    tree = SourceTree(root)

    def code(phase: str, suites_served: list[str]) -> list[str]:
        return tree.code_of(PHASES[phase], Uses.of(params, suites_served).members(params)) + [PHASES[phase].rule]

    own = [s for s in params.default_suites if s not in params.run_suites]
    found = [*_data_stages(params, code), *_suite_stages(params, params.run_suites, code, ROOT_FILE),
             *_suite_stages(params, own, code, EXPERIMENTS_FILE), *_own_ledger_stages(params, root, code)]
    _refuse_clashes(found)
    return found


def _data_stages(params: Params, code) -> list[Stage]:
    """`download` and `partition`, for run.suites (Snakemake's download_all and partition_all also take the
    experiments' data, which their train stages depend on through these stages' outputs)."""
    suites = params.run_suites
    every = Uses.of(params, suites)
    settings = [param_key(params, "suites", s, "settings") for s in suites]
    datasets = [param_key(params, "datasets", d) for d in every.datasets]
    return [
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


def _suite_stages(params: Params, suites: list[str], code, file: str) -> list[Stage]:
    """Each suite's train and aggregate stages, and its compare stage where it runs two methods or more."""
    found = []
    for suite in suites:
        found.append(Stage(stage_name("train", suite), "train", (suite,), {
            "cmd": f"snakemake --cores all results/runs/{suite}/TRAINED",
            "deps": ["data/raw", "data/partitions", *code("train", [suite])],
            "params": dvc_params(suite_keys(params, suite)),
            "outs": [{f"results/runs/{suite}": {"persist": True}},
                     {f"results/checkpoints/{suite}": {"persist": True}}]}, file))
    for suite in suites:
        found.append(Stage(stage_name("aggregate", suite), "aggregate", (suite,), {
            "cmd": f"snakemake --cores all results/tables/{suite}.md",
            "deps": [f"results/runs/{suite}", "data/partitions", *code("aggregate", [suite])],  # label counts
            "params": dvc_params(suite_keys(params, suite)),  # the tables print every spec and the protocol
            "outs": [*({f"results/tables/{suite}.{ext}": {"cache": False}} for ext in ("md", "csv", "tex")),
                     {f"results/tables/runs/{suite}.csv": {"cache": False}}],
            "metrics": [{f"results/tables/{suite}.json": {"cache": False}}],
            "plots": [{f"results/figures/{suite}": {"cache": False}}]}, file))
    for suite in filter(params.compared, suites):
        found.append(Stage(stage_name("compare", suite), "compare", (suite,), {
            "cmd": f"snakemake --cores all results/tables/compare/{suite}.md",
            "deps": [f"results/runs/{suite}", "data/partitions", *code("compare", [suite])],
            "params": dvc_params(suite_keys(params, suite)),
            "outs": [{f"results/tables/compare/{suite}.{ext}": {"cache": False}} for ext in ("md", "csv", "png")],
            "metrics": [{f"results/tables/compare/{suite}.json": {"cache": False}}]}, file))
    return found


def _own_ledger_stages(params: Params, root: Path, code) -> list[Stage]:
    """`claims-<name>` for each claims file of experiments/claims/: in dvc.yaml when its suites are all of
    `run.suites`, else in experiments/dvc.yaml when they are all built by DVC (the others' runs are outside DVC's
    stages, as their tables are)."""
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
            "metrics": [{LEDGER.format(name=own.name, ext="json"): {"cache": False}}]},
            ROOT_FILE if set(own.suites) <= set(params.run_suites) else EXPERIMENTS_FILE))
    return found


def _refuse_clashes(found: list[Stage]) -> None:
    """Every stage name once, across both files (so that each names one stage wherever it is run from), and every
    output declared by one stage only, none inside another's (DVC refuses overlapping outputs)."""
    names = [stage.name for stage in found]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise DvcFilesError(f"stages {', '.join(clashes)} would be written twice: the suites of run.suites and "
                            "experiments/ (or claims files) hold names that differ only by `.` and `_`, which DVC's "
                            "stage names cannot tell apart: rename one")
    owner: dict[str, str] = {}
    for stage in found:
        for key in ("outs", "metrics", "plots"):
            for path in (p for entry in stage.body.get(key, []) for p in entry):
                for other, name in owner.items():
                    if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                        raise DvcFilesError(f"{stage.file}: stage {stage.name}'s output {path} overlaps {other}, "
                                            f"an output of stage {name}: rename the suite or claims file")
                owner[path] = stage.name


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

EXPERIMENTS_HEADER = f"""\
# Written by `{STAGES_COMMAND}` for the suites of experiments/ (and the claims files about them): do not edit
# it, run that again after a change of experiments/. The project's dvc.yaml holds run.suites' stages and stays as
# it is; DVC reads this file beside it: `dvc status` names these stages with the others, `dvc repro --all-pipelines`
# (or `dvc repro experiments/dvc.yaml`) builds them, and DVC records them in experiments/dvc.lock. `wdir: ..`: each
# stage runs at the project's root and its paths are the project's. Their data are the outputs of dvc.yaml's
# download and partition stages, whose Snakemake targets take every suite of experiments/ too.
"""

_HEADERS = {ROOT_FILE: HEADER, EXPERIMENTS_FILE: EXPERIMENTS_HEADER}


def dvc_files(params: Params, root: Path) -> dict[str, str | None]:
    """What `dvc-stages` writes into each of its files for `params`: None for experiments/dvc.yaml where no
    suite of experiments/ has a stage."""
    found = stages(params, root)
    texts: dict[str, str | None] = {}
    for file, header in _HEADERS.items():
        held = {s.name: {**_WDIR.get(file, {}), **s.body} for s in found if s.file == file}
        texts[file] = header + yaml.safe_dump({"stages": held}, sort_keys=False, width=120) \
            if held or file == ROOT_FILE else None
    return texts


def dvc_yaml_text(params: Params, root: Path) -> str:
    """What `dvc-stages` writes into root/dvc.yaml for `params`."""
    text = dvc_files(params, root)[ROOT_FILE]
    assert text is not None
    return text


def write_stages(root: Path = Path(".")) -> str:
    """Write root/dvc.yaml and root/experiments/dvc.yaml for root/params.yaml and its experiments (the files DVC
    reads; the second removed when no experiment has a stage); a line saying what changed."""
    texts = dvc_files(load_params(root / "params.yaml"), root)
    for file in texts:  # all checked before any is written
        path = root / file
        if file != ROOT_FILE and path.exists() and not path.read_text().startswith(_HEADERS[file].split("\n")[0]):
            raise DvcFilesError(f"{file} was not written by `{STAGES_COMMAND}`, which writes the stages of the suites "
                                "of experiments/ there: move it elsewhere and run it again")
    return "; ".join(line for file, text in texts.items() if (line := _write(root, file, text)))


def _write(root: Path, file: str, text: str | None) -> str:
    """Write one of the files (None: remove it); what changed, or "" for an absent file that stays absent."""
    path = root / file
    if text is None:
        if not path.exists():
            return ""
        path.unlink()
        return f"{file} removed (no suite of experiments/ has a stage)"
    if path.exists() and path.read_text() == text:
        return f"{file} is up to date"
    atomic_write_text(path, text)
    return f"{file} written: stages {', '.join(yaml.safe_load(text)['stages'])}"
