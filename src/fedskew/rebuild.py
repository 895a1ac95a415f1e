"""Rebuild a suite's tables and prove it: are they identical to the committed ones?

Two ways, one comparison (`docs/design.md`, "Rebuilding and proving it"):

- `fedskew run` (`make run`) builds `run.suites` in place: Snakemake trains the runs that are missing or
  stale (all of them on a fresh clone, whose run files are DVC outputs and not in git), then rebuilds every
  table of those suites from the run files, then compares each table with the committed one. It leaves the
  project as `snakemake --cores all` would: a second `snakemake` has nothing to do.
- `fedskew verify --suite S` (`make verify SUITE=S`) trains the suite from its seeds in a scratch project
  under `.verify/S/` (the project's params.yaml, its verified raw data, nothing else) and compares the tables
  built there. It never writes into `results/`.
- `fedskew verify --suite S --method M... --seed N...` retrains only those runs, for a suite too long to retrain
  whole (FL-FCR's MNIST suite is a night on two cores). The scratch project takes the suite's committed runs
  (results/committed-runs/S/, or results/imported/S/), sets the chosen ones aside, trains them again from their
  seeds and compares each with its committed files: config.yaml and history.csv byte for byte, metrics.json
  without its provenance (machine and commit). The tables are then rebuilt from all of them.

A suite's tables are compared with its comparison's (`fedskew compare`: md, csv, json), where it has one.
The reference is read before anything is built: each file as committed at HEAD when git tracks it, else as it
was before the build. So nothing committed is overwritten before it has been compared, and a difference is
reported cell by cell, never silently replaced. `make run` adds only a forced re-aggregation and comparison
(cheap) to what `snakemake --cores all` does. Snakemake runs as a child process (fedskew.snakemake_run), its
output in `logs/rebuild/<suite...>.log`; one line is printed per progress step and per finished run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fedskew import metrics, paths
from fedskew.config import Params
from fedskew.snakemake_run import held_lock_fds, run_snakemake, snakemake_env

TABLE_EXTS = ("md", "csv", "tex", "json")
COMPARISON_EXTS = ("md", "csv", "json")  # a suite's comparison (fedskew compare), where it has one
SCRATCH = Path(".verify")
LOG_DIR = Path("logs/rebuild")
# The figures are rebuilt but not compared: a PNG's bytes follow the matplotlib and libpng build, not the numbers.


@dataclass(frozen=True)
class CellDiff:
    """One cell of a suite's table that differs: `key` is dataset/partition/method."""

    key: str
    field: str
    committed: float | None
    rebuilt: float | None

    def text(self) -> str:
        if self.committed is None or self.rebuilt is None:
            return f"{self.key} {self.field}: {_show(self.committed)} -> {_show(self.rebuilt)}"
        scale = 100.0 if "acc" in self.field else 1.0
        delta = (self.rebuilt - self.committed) * scale
        unit = " points" if scale == 100.0 else ""
        return (f"{self.key} {self.field}: {_show(self.committed, scale)} -> {_show(self.rebuilt, scale)} "
                f"({delta:+.4g}{unit})")


def _show(value: float | None, scale: float = 1.0) -> str:
    return "absent" if value is None else f"{value * scale:.6g}"


@dataclass
class TableCheck:
    """The check of one suite's table files (and its comparison's) against their references."""

    suite: str
    reference: str  # "HEAD 1a2b3c4" or "the file before the build" or "none"
    files: int = len(TABLE_EXTS)  # the files compared: its tables, and its comparison's
    differing_files: list[str] = field(default_factory=list)
    missing_reference: list[str] = field(default_factory=list)
    cells: list[CellDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differing_files and not self.missing_reference

    @property
    def differs(self) -> bool:
        """A table differs from its reference (a table with nothing to compare with does not differ: it is new)."""
        return bool(self.differing_files)

    def summary(self) -> str:
        if self.identical:
            return f"{self.suite}: identical to {self.reference}"
        parts = []
        if self.differing_files:
            what = f"{len(self.cells)} cell(s) differ" if self.cells else "the numbers agree, the text differs"
            parts.append(f"{', '.join(self.differing_files)} differ from {self.reference}: {what}")
        if self.missing_reference:
            parts.append(f"{', '.join(self.missing_reference)} new (nothing committed to compare with)")
        return f"{self.suite}: " + "; ".join(parts)


def table_files(suite: str, root: Path = Path("."), compared: bool = False) -> dict[str, Path]:
    """A suite's table files by name (`default.md`), and its comparison's (`compare/default.md`) if `compared`."""
    files = {f"{suite}.{ext}": root / paths.TABLE.format(suite=suite, ext=ext) for ext in TABLE_EXTS}
    return files | ({f"compare/{suite}.{ext}": root / paths.COMPARISON.format(suite=suite, ext=ext)
                     for ext in COMPARISON_EXTS} if compared else {})


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)


def read_references(suite: str, root: Path = Path("."), compared: bool = False) -> tuple[str, dict[str, bytes | None]]:
    """Each table file of `suite` (and its comparison's if `compared`) as committed at HEAD (when git tracks
    them), else as it is now: read before a build, so that a rebuild cannot overwrite what it is compared with."""
    files = table_files(suite, root, compared)
    try:
        head = _git(root, "rev-parse", "--short", "HEAD")
        tracked = head.returncode == 0 and all(
            _git(root, "ls-files", "--error-unmatch", str(p.relative_to(root))).returncode == 0 for p in files.values())
    except (OSError, subprocess.SubprocessError):
        tracked = False
    if tracked:
        label = f"the committed tables (HEAD {head.stdout.decode().strip()})"
        blobs = {}
        for ext, path in files.items():
            shown = _git(root, "show", f"HEAD:{path.relative_to(root).as_posix()}")
            blobs[ext] = shown.stdout if shown.returncode == 0 else None
        return label, blobs
    present = {ext: (path.read_bytes() if path.exists() else None) for ext, path in files.items()}
    label = "the tables as they were before the build" if any(present.values()) else "nothing (no earlier tables)"
    return label, present


def cell_differences(committed_json: bytes, rebuilt_json: bytes) -> list[CellDiff]:
    """The numbers that differ between two `<suite>.json` tables, cell by cell (exact comparison)."""
    try:
        committed, rebuilt = json.loads(committed_json), json.loads(rebuilt_json)
    except ValueError:
        return []
    cells = []
    for key in sorted(set(committed) | set(rebuilt)):
        old, new = committed.get(key, {}), rebuilt.get(key, {})
        for name in sorted(set(old) | set(new), key=_field_order):
            a, b = old.get(name), new.get(name)
            if a != b and not (_is_nan(a) and _is_nan(b)):
                cells.append(CellDiff(key, name, a, b))
    return cells


def _field_order(name: str) -> tuple[int, str]:
    """The reported metric's fields first (its mean, then its std), then the others by name."""
    return (0 if name.startswith(metrics.reported_key()) else 1, name)


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def compare(suite: str, built_root: Path, reference_label: str, references: dict[str, bytes | None]) -> TableCheck:
    """Compare the table files built under `built_root` with `references` (read by `read_references`)."""
    check = TableCheck(suite, reference_label, len(references))
    files = table_files(suite, built_root, compared=len(references) > len(TABLE_EXTS))
    built = {name: path.read_bytes() for name, path in files.items()}
    for name in files:
        if references.get(name) is None:
            check.missing_reference.append(name)
        elif references[name] != built[name]:
            check.differing_files.append(name)
    table = f"{suite}.json"
    if references.get(table) is not None and references[table] != built[table]:
        check.cells = cell_differences(references[table], built[table])
    return check


def closing_line(checks: list[TableCheck], how: str) -> str:
    """The one line a rebuild ends with."""
    tables = sum(c.files for c in checks)
    if all(c.identical for c in checks):
        suites = ", ".join(c.suite for c in checks)
        return f"fedskew: {how} {suites}: all {tables} tables are identical, byte for byte, to {checks[0].reference}."
    bad = [c for c in checks if not c.identical]
    verdict = (f"{sum(c.differs for c in checks)} of {len(checks)} suite(s) differ" if any(c.differs for c in checks)
               else "no table differs, but not every table had a committed one")
    return f"fedskew: {how}: {verdict}: " + " | ".join(c.summary() for c in bad)


def report(checks: list[TableCheck], how: str, max_cells: int = 40) -> str:
    """The cells that differ (at most `max_cells` per suite), then the closing line."""
    lines = []
    for check in checks:
        for cell in check.cells[:max_cells]:
            lines.append(f"  {check.suite}: {cell.text()}")
        if len(check.cells) > max_cells:
            lines.append(f"  {check.suite}: ... and {len(check.cells) - max_cells} more (compare the .json tables)")
    lines.append(closing_line(checks, how))
    return "\n".join(lines)


def _targets(params: Params, suites: list[str]) -> list[str]:
    """The Snakemake targets that rebuild the suites' tables and, where a suite has one, its comparison."""
    return [paths.TABLE.format(suite=s, ext="md") for s in suites] + [
        paths.COMPARISON.format(suite=s, ext="md") for s in suites if params.compared(s)]


def _probe_tracking_server(suites: list[str]) -> None:
    """Once before the build's first job: a tracking server that does not answer is said here, in one line, and
    its verdict goes to every job in their environment (fedskew.tracking.reach), so that none waits for it."""
    from fedskew.tracking import reach

    if line := reach.probe_for_build(suites):
        print(line, flush=True)


def run_in_place(params: Params, suites: list[str], root: Path = Path("."), cores: str = "all") -> tuple[int, str]:
    """`make run`: train what is missing, rebuild the suites' tables from the run files, compare.
    Returns (exit code, closing report)."""
    references = {suite: read_references(suite, root, params.compared(suite)) for suite in suites}
    runs = params.runs(suites)
    log_path = root / LOG_DIR / f"{'+'.join(suites)}.log"
    log_path.unlink(missing_ok=True)
    print(f"fedskew: building {', '.join(suites)} ({len(runs)} runs; Snakemake's output: {log_path})", flush=True)
    _probe_tracking_server(suites)
    env = snakemake_env()
    trained = [str(cfg.path(paths.RUN_METRICS)) for cfg in runs]
    code = run_snakemake(["--cores", cores, *trained], cwd=root, runs=runs, log_path=log_path, env=env)
    if code == 0:
        code = run_snakemake(["--cores", cores, "--forcerun", "aggregate", "compare", "--", *_targets(params, suites)],
                             cwd=root, runs=[], log_path=log_path, env=env)
    if code != 0:
        return code, f"fedskew: the build failed; nothing was compared (see {log_path})"
    checks = [compare(s, root, *references[s]) for s in suites]
    return (1 if any(c.differs for c in checks) else 0), report(checks, "rebuilt")


def reproduce(params: Params, root: Path = Path("."), cores: str = "all") -> int:
    """`make reproduce`: `snakemake results/claims.md` (the suites of reproduce.suites trained, those of
    reproduce.imported imported, the papers' tables and the ledger written), stopped with its jobs on SIGINT or
    SIGTERM. Returns Snakemake's exit code."""
    runs = params.runs(params.reproduce_suites) if params.reproduce_suites else []
    log_path = root / LOG_DIR / "reproduce.log"
    print(f"fedskew: reproducing the papers' tables ({len(runs)} runs to train or reuse; Snakemake's output: "
          f"{log_path})", flush=True)
    _probe_tracking_server(params.reproduce_suites)
    code = run_snakemake(["--cores", cores, paths.CLAIMS.format(ext="md")], cwd=root, runs=runs, log_path=log_path,
                         env=snakemake_env())
    if code == 0:
        print(f"fedskew: wrote {paths.CLAIMS.format(ext='md')} and the papers' tables in results/papers/", flush=True)
    return code


def _scratch_project(suite: str, root: Path) -> tuple[Path, Path]:
    """An empty project in `.verify/<suite>/` (params.yaml, the raw data linked) and its emptied log file."""
    scratch = (root / SCRATCH / suite).resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "data").mkdir(parents=True)
    shutil.copy2(root / "params.yaml", scratch / "params.yaml")
    raw = (root / "data" / "raw").resolve()
    raw.mkdir(parents=True, exist_ok=True)
    # Raw data is verified by its checksums wherever it came from; sharing it saves a download.
    # Partitions, runs and tables are made afresh from the seeds.
    os.symlink(raw, scratch / "data" / "raw")
    log_path = (root / LOG_DIR / f"verify-{suite}.log").resolve()
    log_path.unlink(missing_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return scratch, log_path


def verify_in_scratch(params: Params, suite: str, root: Path = Path("."), cores: str = "all",
                      keep: bool = False, methods: list[str] | None = None,
                      seeds: list[int] | None = None) -> tuple[int, str]:
    """`make verify SUITE=...`: train `suite` from its seeds in `.verify/<suite>/` and compare its tables.
    With `methods` or `seeds`, retrain only those runs beside the suite's committed ones (module docstring)."""
    if methods or seeds:
        return _verify_some_runs(params, suite, root, cores, keep, select_runs(params, suite, methods, seeds))
    label, references = read_references(suite, root, params.compared(suite))
    scratch, log_path = _scratch_project(suite, root)
    runs = params.runs([suite])
    print(f"fedskew: rebuilding {suite} from its seeds in {scratch} ({len(runs)} runs; Snakemake's output: "
          f"{log_path})", flush=True)
    env = {**snakemake_env(), "FEDSKEW_TRACKING": "0"}  # a check, not a result: the MLflow store stays as it is
    snakefile = (root / "workflow" / "Snakefile").resolve()
    code = run_snakemake(["--snakefile", str(snakefile), "--directory", str(scratch), "--cores", cores,
                          *_targets(params, [suite])], cwd=scratch, runs=runs, log_path=log_path,
                         env=env)
    if code != 0:
        return code, (f"fedskew: rebuilding {suite} failed; nothing was compared (see {log_path}; "
                      f"the scratch project is kept in {scratch})")
    check = compare(suite, scratch, label, references)
    if check.identical and not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    elif not check.identical:
        print(f"fedskew: the rebuilt tables are kept in {scratch / 'results' / 'tables'}", flush=True)
    return (1 if check.differs else 0), report([check], "rebuilt from the seeds")


# ---- retraining some of a suite's runs beside its committed ones -------------------------------

COMPARED_RUN_FILES = ("config.yaml", "history.csv", "metrics.json")
NOT_COMPARED_METRICS = ("provenance", "integrity")  # which machine and commit; the digests that cover it


def committed_archives(params: Params, suite: str, root: Path = Path(".")) -> list[Path]:
    """The archives of a suite's committed runs (results/committed-runs/README.md)."""
    folder = paths.IMPORTED_ARCHIVES if suite in params.imported_suites else paths.COMMITTED_RUNS
    return sorted((root / folder.format(suite=suite)).glob("*.tar.gz"))


def select_runs(params: Params, suite: str, methods: list[str] | None, seeds: list[int] | None) -> list:
    """The runs of `suite` with one of `methods` and one of `seeds` (each, when not given: all)."""
    from fedskew.config import ConfigError
    from fedskew.config_errors import suggestion

    body = params.raw["suites"][suite]
    for method in methods or []:
        if method not in body["methods"]:
            raise ConfigError(f"--method {method!r} is not a method of suite {suite!r}"
                              f"{suggestion(method, body['methods'])}; its methods: {', '.join(body['methods'])}")
    for seed in seeds or []:
        if seed not in body["seeds"]:
            raise ConfigError(f"--seed {seed} is not a seed of suite {suite!r}; its seeds: "
                              f"{', '.join(map(str, body['seeds']))}")
    return [cfg for cfg in params.runs([suite])
            if (not methods or cfg.method in methods) and (not seeds or cfg.seed in seeds)]


def run_file_differences(committed: Path, retrained: Path) -> list[str]:
    """The files of one run that differ: config.yaml and history.csv byte for byte, metrics.json
    without `NOT_COMPARED_METRICS`. Empty when the run rebuilt."""
    differing = []
    for name in COMPARED_RUN_FILES:
        old, new = (folder / name for folder in (committed, retrained))
        if not new.exists():
            differing.append(f"{name} (not written)")
        elif name == "metrics.json":
            old_record, new_record = (json.loads(p.read_text()) for p in (old, new))
            for record in (old_record, new_record):
                for key in NOT_COMPARED_METRICS:
                    record.pop(key, None)
            if old_record != new_record:
                keys = sorted(k for k in old_record.keys() | new_record.keys()
                              if old_record.get(k) != new_record.get(k))
                differing.append(f"metrics.json ({', '.join(keys)})")
        elif old.read_bytes() != new.read_bytes():
            differing.append(name)
    return differing


def _fedskew(args: list[str], scratch: Path, env: dict, log_path: Path) -> int:
    """`python -m fedskew <args>` in the scratch project, its output appended to the log."""
    with open(log_path, "a") as log:
        log.write(f"$ fedskew {' '.join(args)}   (in {scratch})\n")
        log.flush()
        return subprocess.run([sys.executable, "-m", "fedskew", *args], cwd=scratch, env=env, stdout=log,
                              stderr=subprocess.STDOUT, pass_fds=held_lock_fds()).returncode  # the build's too


def _verify_some_runs(params: Params, suite: str, root: Path, cores: str, keep: bool,
                      selected: list) -> tuple[int, str]:
    from fedskew.config import ConfigError

    archives = committed_archives(params, suite, root)
    if not archives:
        raise ConfigError(f"suite {suite!r} has no committed runs to compare with (results/committed-runs/{suite}/ "
                          f"holds no archive): verify it whole, without --method and --seed")
    label, references = read_references(suite, root, params.compared(suite))
    scratch, log_path = _scratch_project(suite, root)
    env = {**snakemake_env(), "FEDSKEW_TRACKING": "0"}
    kept = f"the scratch project is kept in {scratch}"
    if _fedskew(["packed", "import", *map(str, (a.resolve() for a in archives))], scratch, env, log_path) != 0:
        return 1, f"fedskew: importing the committed runs of {suite} failed; nothing was compared (see {log_path})"
    committed = scratch / "committed"
    for cfg in selected:
        if not (scratch / cfg.path(paths.RUN_METRICS)).exists():
            raise ConfigError(f"{cfg.path(paths.RUN_DIR)} is not among the committed runs of {suite}; "
                              f"retrain it with `make verify SUITE={suite}` or commit it first")
        target = committed / cfg.path(paths.RUN_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        (scratch / cfg.path(paths.RUN_DIR)).rename(target)
    print(f"fedskew: retraining {len(selected)} of {len(params.runs([suite]))} runs of {suite} from their seeds in "
          f"{scratch}, beside its committed runs (Snakemake's output: {log_path})", flush=True)
    snakefile = (root / "workflow" / "Snakefile").resolve()
    partitions = [paths.PARTITION_JSON.format(dataset=d, partition=p, seed=k)  # every run's: the per-client
                  for d, p, k in params.partitions_needed([suite])]             # outcomes of the tables read them
    code = run_snakemake(["--snakefile", str(snakefile), "--directory", str(scratch), "--cores", cores, *partitions,
                          *(str(cfg.path(paths.RUN_METRICS)) for cfg in selected)], cwd=scratch, runs=selected,
                         log_path=log_path, env=env)
    if code != 0:
        return code, f"fedskew: retraining runs of {suite} failed; nothing was compared (see {log_path}; {kept})"
    differing = {}
    for cfg in selected:
        run_dir = cfg.path(paths.RUN_DIR)
        if diff := run_file_differences(committed / run_dir, scratch / run_dir):
            differing[run_dir.as_posix()] = diff
    rebuilt = [["aggregate", "--suite", suite]] + ([["compare", "--suite", suite, "--write"]]
                                                   if params.compared(suite) else [])
    if any(_fedskew(args, scratch, env, log_path) != 0 for args in rebuilt):
        return 1, f"fedskew: rebuilding the tables of {suite} failed (see {log_path}; {kept})"
    check = compare(suite, scratch, label, references)
    lines = [f"  {run}: {', '.join(diff)}" for run, diff in differing.items()]
    lines.append(f"fedskew: retrained {len(selected)} runs of {suite}: " +
                 (f"{len(differing)} differ from their committed runs" if differing else
                  "each identical to its committed run (config.yaml and history.csv byte for byte, metrics.json "
                  "but for its provenance)") + ".")
    if check.identical and not differing and not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    elif differing or not check.identical:
        print(f"fedskew: {kept}; the committed runs set aside are in {committed}", flush=True)
    return (1 if check.differs or differing else 0), "\n".join(lines) + "\n" + report(
        [check], "rebuilt with those runs retrained")
