"""Rebuild a suite's tables and prove it: are they identical to the committed ones?

Two ways, one comparison (`docs/design.md`, "Rebuilding and proving it"):

- `fedskew run` (`make run`) builds `run.suites` in place (`--suite S ...`: those suites, a researcher's own of
  experiments/ among them, which `make run` leaves to be named): Snakemake trains the runs that are missing or
  stale (all of them on a fresh clone, whose run files are DVC outputs and not in git), then rebuilds every
  table of those suites from the run files, then compares each table with its reference (below). It leaves the
  project as `snakemake --cores all` would: a second `snakemake` has nothing to do.
- `fedskew verify --suite S` (`make verify SUITE=S`) trains the suite from its seeds in a scratch project
  under `.verify/S/` (the project's params.yaml, its verified raw data, nothing else) and compares the tables
  built there. It never writes into `results/`.
- `fedskew verify --suite S --method M... --seed N...` retrains only those runs, for a suite too long to retrain
  whole (FL-FCR's MNIST suite is a night on two cores). The scratch project takes the suite's committed runs
  (results/committed-runs/S/, or results/imported/S/), sets the chosen ones aside, trains them again from their
  seeds and compares each with its committed files: config.yaml and history.csv byte for byte, metrics.json
  without its provenance (machine and commit). The tables are then rebuilt from all of them.

A suite's tables, and its comparison's (`fedskew compare`) where it has one, are compared with what there is to
compare them with (fedskew.table_check): the committed tables, else the previous build's, else nothing, read
before anything is built. So nothing committed is overwritten before it has been compared, and a difference is
reported cell by cell, never silently replaced; the closing line says of each suite what it was compared with.
`run` exits 1 where a committed table differs (a previous build's that changed is listed, not a failure);
`verify` where any table differs from what the project holds. `make run` adds only a forced re-aggregation and
comparison (cheap) to what `snakemake --cores all` does. Snakemake runs as a child process
(fedskew.snakemake_run), its output in `logs/rebuild/<suite...>.log`; one line is printed per progress step and
per finished run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from fedskew import paths
from fedskew.config import Params
from fedskew.snakemake_run import held_lock_fds, run_snakemake, snakemake_env
from fedskew.table_check import compare, read_references, report

SCRATCH = Path(".verify")
LOG_DIR = Path("logs/rebuild")


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
    checks = [compare(s, root, references[s]) for s in suites]
    # A committed table the build does not give is a failed proof; a previous build's that changed is news.
    return (1 if any(c.differs_from_committed for c in checks) else 0), report(checks, "rebuilt")


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
    reference = read_references(suite, root, params.compared(suite))
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
    check = compare(suite, scratch, reference)
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
    reference = read_references(suite, root, params.compared(suite))
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
    check = compare(suite, scratch, reference)
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
