"""dvc.lock: recorded without training for a change that leaves every result as it is, and checked.

dvc.lock is what DVC records when it builds a stage (`dvc repro`, or `dvc commit` of outputs built otherwise).
`python -m fedskew dvc-lock` writes dvc.yaml, then records in dvc.lock the deps and params of every stage as they
are, trains and hashes no output: for a change that leaves every result as it is (a module moved, a comment, a
suite outside run.suites). It refuses a change of what a stage builds (a run id, a dataset, a partition), which
`dvc repro` rebuilds and records. Outputs keep the hashes dvc.lock records (under a stage's former name, too), and a
dependency on an earlier stage's output takes the hash recorded for that output: the lock says what was built,
whatever this machine holds.

The same for experiments/dvc.lock, which DVC keeps beside experiments/dvc.yaml (the stages of a researcher's own
suites, fedskew.dvcstages): each stage is recorded in, and checked against, the lock beside its stage file.
"""

from __future__ import annotations

import copy
import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from fedskew import user_files
from fedskew.config import Params, load_params
from fedskew.dvcstages import EXPERIMENTS_FILE, ROOT_FILE, DvcFilesError, Stage, stages, write_stages
from fedskew.runfiles import atomic_write_text

LOCK_COMMAND = "python -m fedskew dvc-lock"


def lock_of(file: str) -> str:
    """The lock file DVC keeps beside a stage file: dvc.lock, experiments/dvc.lock."""
    return PurePosixPath(file).with_name("dvc.lock").as_posix()


def _records(root: Path, file: str) -> dict[str, dict]:
    """The stages a stage file's lock records, by name (none where it has no lock)."""
    path = root / lock_of(file)
    return (yaml.safe_load(path.read_text()) or {}).get("stages", {}) if path.exists() else {}


def _file_of(stage, root: Path) -> str:
    """The stage file, from the project root, that holds one of DVC's stages."""
    return Path(stage.path).resolve().relative_to(root.resolve()).as_posix()


def address(file: str, name: str) -> str:
    """A stage as DVC's commands name it from the project root: `train-default`, `experiments/dvc.yaml:train-x`."""
    return name if file == ROOT_FILE else f"{file}:{name}"


def _recorded_params(entry: dict) -> dict[str, Any]:
    """Every params value a lock entry records, by key path, whichever file it is in (params.yaml's keys and an
    experiment's name different things: they are merged as fedskew merges the files)."""
    return {key: value for values in entry.get("params", {}).values() for key, value in values.items()}


def _recorded_values(raw: dict, recorded: dict[str, Any]) -> dict:
    """params.yaml's values with those a stage's lock entry records put back, key path by key path."""
    old = copy.deepcopy(raw)
    for key, value in recorded.items():
        *parents, last = key.split(".")
        node = old
        for part in parents:
            node = node.setdefault(_name_matching(node, part), {})
        node[_name_matching(node, last)] = copy.deepcopy(value)
    return old


def _name_matching(node: dict, pattern: str) -> str:
    matches = [k for k in node if fnmatch.fnmatchcase(str(k), pattern)]
    return matches[0] if len(matches) == 1 else pattern


def builds(params: Params, stage: Stage) -> Any:
    """What a stage builds, as params.yaml decides it: its datasets, its partitions, or the run ids of its suites
    (those it trains, or those whose runs it reads)."""
    if stage.phase == "download":
        return {d: params.dataset_spec(d) for d, _, _ in sorted(params.partitions_needed())}
    if stage.phase == "partition":
        return {f"{d}/{p}/seed{s}": [params.dataset_spec(d), params.partition_spec(p)]
                for d, p, s in sorted(params.partitions_needed())}
    return sorted(cfg.run_id for cfg in params.runs(list(stage.suites)))


def _changed_builds(params: Params, stage: Stage, recorded: dict[str, Any]) -> str | None:
    """None when the params a lock entry records build what params.yaml's do; else what differs."""
    now = builds(params, stage)
    try:
        before = builds(Params(_recorded_values(params.raw, recorded)), stage)
    except (KeyError, TypeError, ValueError) as error:  # the recorded values no longer fit together
        return f"dvc.lock's params for it no longer resolve ({type(error).__name__}: {error})"
    if before == now:
        return None
    if isinstance(now, list):
        return f"{len(set(now) - set(before))} of its {len(now)} run ids are not those dvc.lock recorded"
    differ = sorted(k for k in {*now, *before} if now.get(k) != before.get(k))
    return f"{', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''} differ from what dvc.lock recorded"


def _outs_paths(entry: dict) -> set[str]:
    return {out["path"] for out in entry.get("outs", [])}


def _repo(root: Path):
    """DVC's own view of the project at root (dvc.yaml with dvc.lock)."""
    from dvc.repo import Repo

    if not (root / ".dvc").is_dir():
        raise DvcFilesError(f"{root.resolve()} holds no .dvc/ folder: run this from the project's root")
    return Repo(str(root))


def record_lock(root: Path = Path(".")) -> list[str]:
    """Write the stage files, then record in their locks (dvc.lock, and experiments/dvc.lock for the experiments'
    stages) every stage's deps (hashed by DVC) and params as they are, keeping the outputs' hashes; trains nothing.
    Lines saying what changed. DvcFilesError, writing no lock, when a stage would now build something else than its
    lock recorded."""
    from dvc.stage import PipelineStage

    lines = [write_stages(root)]
    params = load_params(root / "params.yaml")
    wanted = {(stage.file, stage.name): stage for stage in stages(params, root)}
    recorded = {file: _records(root, file) for file in (ROOT_FILE, EXPERIMENTS_FILE)}

    with _repo(root) as repo, repo.lock:
        loaded = {key: s for s in repo.index.stages
                  if isinstance(s, PipelineStage) and (key := (_file_of(s, root), s.name)) in wanted}
        # A stage's record: its own, or that of its former name (the one recording the same outputs, in either lock).
        every = [entry for records in recorded.values() for entry in records.values()]
        previous = {}
        for (file, name), stage in loaded.items():
            paths = {out.def_path for out in stage.outs}
            previous[file, name] = recorded[file].get(name) or next(
                (entry for entry in every if _outs_paths(entry) == paths), {})
        out_records = {out["path"]: out for entry in previous.values() for out in entry.get("outs", [])}
        produced = {out.def_path for stage in loaded.values() for out in stage.outs}

        refused, entries = [], {file: {} for file in recorded}
        for (file, name), stage in wanted.items():  # the stage files' order
            entries[file][name] = _stage_record(address(file, name), loaded[file, name], out_records, produced)
            before = _recorded_params(previous[file, name])
            if before and (change := _changed_builds(params, stage, before)):
                refused.append(f"{address(file, name)}: {change}")
    if refused:
        written = "".join(f"{part.partition(' written')[0]} written; " for part in lines[0].split("; ")
                          if " written" in part)
        raise DvcFilesError(
            f"{written}no lock written: params.yaml (or an experiment) changes what these stages build since their "
            "lock recorded them: "
            + "; ".join(refused) + f". `dvc repro` builds and records them (or `dvc commit -f <stage>` where they "
            f"are built here); `{LOCK_COMMAND}` records only changes that leave every result as it is")

    return [*lines, *(line for file in entries if (line := _write_lock(root, file, entries[file], recorded[file])))]


def _stage_record(name: str, stage, out_records: dict[str, dict], produced: set[str]) -> dict:
    """A stage's lock entry: its outputs as recorded, a dependency on an earlier stage's output as that output is
    recorded, every other dependency hashed (or its params read) by DVC now."""
    from dvc.exceptions import DvcException
    from dvc.stage.loader import StageLoader
    from dvc.stage.serialize import to_single_stage_lockfile

    StageLoader.fill_from_lock(stage, {
        "outs": [out_records[o.def_path] for o in stage.outs if o.def_path in out_records],
        "deps": [out_records[d.def_path] for d in stage.deps if d.def_path in out_records]})
    for dep in stage.deps:
        if dep.def_path not in produced:
            try:
                dep.save()  # DVC hashes the file, or reads the params' values
            except DvcException as error:  # a file dvc.yaml names is gone, a key is missing
                raise DvcFilesError(f"{name}: {error}") from None
    entry = to_single_stage_lockfile(stage)
    for key in ("deps", "outs"):  # an output not built yet has no record: leave it out
        entry[key] = [item for item in entry.get(key, []) if "md5" in item]
        if not entry[key]:
            del entry[key]
    return entry


def _write_lock(root: Path, file: str, entries: dict[str, dict], recorded: dict[str, dict]) -> str:
    """Write the lock of stage file `file` (atomically) unless it already says this, or remove it where the file
    has no stage; the line saying what changed ("" for an absent lock that stays absent)."""
    from dvc.utils.serialize import dumps_yaml

    lock, lock_path = lock_of(file), root / lock_of(file)
    if not entries:
        if not lock_path.exists():
            return ""
        lock_path.unlink()
        return f"{lock} removed ({file} has no stage)"
    text = dumps_yaml({"schema": "2.0", "stages": entries})
    if text == (lock_path.read_text() if lock_path.exists() else ""):
        return f"{lock} is up to date"
    atomic_write_text(lock_path, text)
    changed = [name for name, entry in entries.items() if recorded.get(name) != entry]
    dropped = sorted(set(recorded) - set(entries))
    if not changed and not dropped:
        return f"{lock}: stages put in {file}'s order; no record changed"
    return (f"{lock}: deps and params recorded for " + (", ".join(changed) or "no stage")
            + (f"; {', '.join(dropped)} dropped (not in {file})" if dropped else "") + "; outputs kept as recorded")


# ---------------------------------------------------------------------------------------------------------------
# Checks (the tests use them)


def lock_problems(root: Path = Path(".")) -> list[str]:
    """Where the locks (dvc.lock, and experiments/dvc.lock beside the experiments' stages) disagree with their stage
    files, the code, params.yaml and the experiments, as DVC computes them: one line each, empty when they agree.
    Every stage is recorded with its command; every dependency path recorded exists as one of the stage's; a
    dependency on an earlier stage's output carries the hash recorded for that output (which may not be built
    here); every other dependency hashes as recorded; every params value is its file's."""
    from dvc.stage import PipelineStage

    files: dict[str, Any] = {}  # params.yaml and the experiment files, each read once

    def values(path: str) -> Any:
        if path not in files:  # the researcher's own files, read as every command reads them
            files[path] = user_files.load(root / path, root, path).data
        return files[path]

    problems = []
    with _repo(root) as repo:
        loaded = [s for s in repo.index.stages if isinstance(s, PipelineStage)]
        outputs = {out.def_path: out for stage in loaded for out in stage.outs}
        held = {(_file_of(s, root), s.name) for s in loaded}
        recorded = {file: _records(root, file) for file in {ROOT_FILE, EXPERIMENTS_FILE} | {f for f, _ in held}}
        for file, records in sorted(recorded.items()):
            for name in sorted(n for n in records if (file, n) not in held):
                problems.append(f"{lock_of(file)} records stage {name}, which {file} does not have: "
                                f"run `{LOCK_COMMAND}`")
        for stage in loaded:
            file = _file_of(stage, root)
            problems += _stage_problems(stage, file, recorded[file].get(stage.name), outputs, values, root)
    return problems


def _stage_problems(stage, file: str, entry: dict | None, outputs: dict, values, root: Path) -> list[str]:
    """Where one stage's record in the lock of its stage file `file` (`entry`, None: none) disagrees with the
    stage as DVC computes it."""
    from dvc.dependency import ParamsDependency

    fix, name, lock = f"run `{LOCK_COMMAND}`", address(file, stage.name), lock_of(file)
    if entry is None:
        return [f"{name}: not in {lock}: {fix}"]
    problems = [f"{name}: {lock} records another command: {fix}"] if stage.cmd_changed else []
    listed = {dep.def_path for dep in stage.deps}
    recorded_paths = {dep["path"] for dep in entry.get("deps", [])}
    for path in sorted(recorded_paths - listed):
        gone = "" if (root / path).exists() else ", and it does not exist"
        problems.append(f"{name}: {lock} records dependency {path}, which {file} does not list{gone}: {fix}")
    for dep in stage.deps:
        if isinstance(dep, ParamsDependency):
            changed = dep.workspace_status().get(str(dep), {})
            for key, status in changed.items():
                problems.append(f"{name}: {dep.def_path} key {key} {status}: {fix}")
            for key, value in (dep.hash_info.value or {}).items():
                if key not in changed and _value_at(values(dep.def_path), key) != value:
                    problems.append(f"{name}: {lock}'s {key} is not {dep.def_path}'s: {fix}")
        elif dep.def_path in outputs:
            if dep.hash_info != outputs[dep.def_path].hash_info:
                problems.append(f"{name}: dependency {dep.def_path} is not recorded as the output "
                                f"{lock} records for it: {fix}")
        elif dep.def_path not in recorded_paths:
            problems.append(f"{name}: dependency {dep.def_path} is not recorded in {lock}: {fix}")
        else:
            for path, status in dep.workspace_status().items():
                problems.append(f"{name}: dependency {path} {status}: {fix}")
    return problems


_MISSING = object()


def _value_at(raw: dict, key: str) -> Any:
    """params.yaml's value at one of DVC's key paths (a dot of a name written `?` or as a class), or _MISSING."""
    node: Any = raw
    for part in key.split("."):
        matches = [k for k in node if fnmatch.fnmatchcase(str(k), part)] if isinstance(node, dict) else []
        if len(matches) != 1:
            return _MISSING
        node = node[matches[0]]
    return node
