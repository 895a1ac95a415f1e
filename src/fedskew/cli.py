"""`python -m fedskew <command>`: the entry point every Snakemake rule calls.

Every command validates params.yaml first, so a bad value fails before any work.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from fedskew import paths
from fedskew.config import ConfigError, Params, RunConfig, load_params
from fedskew.runfiles import RunFileError, read_history, read_metrics, write_run_files

log = logging.getLogger("fedskew")


class TrackingError(RuntimeError):
    """`fedskew track` could not log every run."""


def cmd_validate(params: Params, args: argparse.Namespace) -> None:
    runs = params.runs()
    print(f"params.yaml is valid: suites {params.default_suites}, {len(runs)} runs, "
          f"{len(params.partitions_needed())} partitions")


def cmd_download(params: Params, args: argparse.Namespace) -> None:
    from fedskew.data.registry import prepare

    if args.dataset not in params.raw["datasets"]:
        raise ConfigError(f"--dataset {args.dataset!r} is not defined under `datasets` in params.yaml")
    prepare(args.dataset, params.dataset_spec(args.dataset), Path("."), download=not args.no_download)


def cmd_partition(params: Params, args: argparse.Namespace) -> None:
    from fedskew.data import registry
    from fedskew.data.partition import make_partition, plot_heatmap, save_partition

    spec = params.partition_spec(args.partition)
    data = registry.load(args.dataset, params.dataset_spec(args.dataset))
    scheme_params = {k: v for k, v in spec.items() if k != "scheme"}
    partition = make_partition(data.y_train.numpy(), data.num_classes, spec["scheme"], scheme_params,
                               args.seed, dataset=args.dataset, natural_groups=data.natural_groups)
    keys = {"dataset": args.dataset, "partition": args.partition, "seed": args.seed}
    save_partition(partition, Path(paths.PARTITION.format(**keys)))
    plot_heatmap(partition, Path(paths.PARTITION_HEATMAP.format(**keys)),
                 title=f"{args.dataset} / {args.partition} / seed {args.seed}")


def _track(cfg: RunConfig, history: list[dict], files: list[Path], status: str, extra_tags: dict) -> bool:
    """Log a run to MLflow; True when it was recorded.

    The run files are the truth and the tracker only observes them: a tracking failure is
    reported loudly but never fails (or, under Snakemake, deletes) a trained result.
    `python -m fedskew track --suite ...` logs such runs later from their files.
    """
    from fedskew import track

    partition_json = Path(cfg.path(paths.PARTITION_JSON))
    heatmap = Path(cfg.path(paths.PARTITION_HEATMAP))
    partition_hash = json.loads(partition_json.read_text())["content_hash"] if partition_json.exists() else "unknown"
    tags = {track.RUN_KEY_TAG: cfg.run_id, "fedskew.config_hash": cfg.run_id,
            "fedskew.partition_hash": partition_hash, **{f"fedskew.{k}": str(v) for k, v in cfg.keys.items()},
            **extra_tags}
    artifacts = [f for f in [*files, heatmap] if f.exists()]
    name = f"{cfg.dataset}/{cfg.partition}/{cfg.method}/seed{cfg.seed}"
    try:
        track.log_run(project_root=Path(".").resolve(), experiment=f"fedskew/{cfg.suite}", run_name=name,
                      params=cfg.to_dict(), history=history, tags=tags, artifacts=artifacts, status=status)
    except Exception as error:  # noqa: BLE001 - whatever the tracker's failure, the result stands
        log.error("TRACKING FAILED for %s: %s. The run files are intact; log them later with "
                  "`python -m fedskew track --suite %s`.", cfg.path(paths.RUN_DIR), error, cfg.suite)
        return False
    return True


def _tracking_enabled() -> bool:
    return os.environ.get("FEDSKEW_TRACKING", "1") != "0"  # tests and quick experiments may turn it off


def cmd_train(params: Params, args: argparse.Namespace) -> None:
    from fedskew.engine.simulation import NonFiniteError, run_training, summarise_divergence

    cfg = params.run(args.suite, args.dataset, args.partition, args.method, args.seed)
    try:
        result = run_training(cfg, threads=args.threads)
    except NonFiniteError as error:
        history = error.history or []
        files = []
        if cfg.training["on_divergence"] == "record":
            # A divergence is a result of this method in this setting: the tables show it.
            files = write_run_files(cfg, history, summarise_divergence(error))
        if _tracking_enabled():
            _track(cfg, history, files, "FAILED", {"fedskew.error": str(error)})
        if cfg.training["on_divergence"] == "record":
            log.warning("%s diverged (recorded as a result): %s", cfg.path(paths.RUN_DIR), error)
            return
        raise
    files = write_run_files(cfg, result.history, result.final)
    if _tracking_enabled():
        tags = {"fedskew.resumed_from_round": str(result.resumed_from),
                "fedskew.threads": str(args.threads or cfg.training["threads"])}
        _track(cfg, result.history, files, "FINISHED", tags)
    log.info("%s: final accuracy %.4f", cfg.path(paths.RUN_DIR), result.final["final_acc"])


def cmd_track(params: Params, args: argparse.Namespace) -> None:
    """Log a suite's trained runs to MLflow from their run files (a backfill; safe to repeat)."""
    from fedskew import track

    if args.suite not in params.raw["suites"]:
        raise ConfigError(f"--suite {args.suite!r} is not defined under `suites` in params.yaml")
    recorded = track.recorded_runs(track.tracking_uri(Path(".")), f"fedskew/{args.suite}")
    counts = {"logged": 0, "already recorded": 0, "not trained": 0, "failed": 0}
    for cfg in params.suite_runs(args.suite):
        if not Path(cfg.path(paths.RUN_METRICS)).exists():
            counts["not trained"] += 1
            continue
        final = read_metrics(cfg)  # only intact run files are logged
        status = "FAILED" if final.get("status") == "diverged" else "FINISHED"
        if recorded.get(cfg.run_id) == status:
            counts["already recorded"] += 1
            continue
        files = [Path(cfg.path(p)) for p in (paths.RUN_CONFIG, paths.RUN_HISTORY, paths.RUN_METRICS)]
        extra = {"fedskew.error": final["error"]} if "error" in final else {}
        counts["logged" if _track(cfg, read_history(cfg), files, status, extra) else "failed"] += 1
    print(f"suite {args.suite}: " + ", ".join(f"{n} {what}" for what, n in counts.items()))
    if counts["failed"]:
        raise TrackingError(f"{counts['failed']} run(s) could not be logged; see the errors above")


def cmd_aggregate(params: Params, args: argparse.Namespace) -> None:
    from fedskew.report.figures import accuracy_curves
    from fedskew.report.tables import write_tables

    if args.suite not in params.raw["suites"]:
        raise ConfigError(f"--suite {args.suite!r} is not defined under `suites` in params.yaml")
    write_tables(params, args.suite)
    accuracy_curves(params, args.suite)


def cmd_paper_table(params: Params, args: argparse.Namespace) -> None:
    from fedskew.reproduce.paper_tables import paper_table_ids
    from fedskew.reproduce.tables import write_paper_table

    if args.table not in paper_table_ids():
        raise ConfigError(f"--table {args.table!r} is not a transcribed paper table; "
                          f"known: {', '.join(paper_table_ids())}")
    write_paper_table(params, args.table, Path(paths.PAPER_TABLE.format(table=args.table, ext="md")),
                      Path(paths.PAPER_TABLE.format(table=args.table, ext="json")))


def cmd_claims(params: Params, args: argparse.Namespace) -> None:
    from fedskew.reproduce.claims import VERDICTS, write_ledger

    records = write_ledger(params, Path(paths.CLAIMS.format(ext="md")), Path(paths.CLAIMS.format(ext="json")))
    counts = ", ".join(f"{sum(r['verdict'] == v for r in records)} {v}" for v in VERDICTS)
    log.info("%d claims: %s", len(records), counts)


def cmd_cost(params: Params, args: argparse.Namespace) -> None:
    from fedskew.reproduce.cost import cost_markdown

    print(cost_markdown(params))


def cmd_methods(params: Params | None, args: argparse.Namespace) -> None:
    from fedskew.algorithms import ALGORITHMS

    for name, cls in ALGORITHMS.items():
        hps = ", ".join(f"{k}={v}" for k, v in cls.hyperparameters.items()) or "no hyperparameters"
        # The class docstring tells variants in one file apart; else the module's cites the paper.
        own_doc = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or ""
        print(f"{name:15s} [{cls.family}] {hps}\n{'':15s} {own_doc.strip().splitlines()[0]}")


def cmd_models(params: Params | None, args: argparse.Namespace) -> None:
    import torch

    from fedskew.models import MODELS, build_model, example_info

    for name in MODELS:
        # Split points do not depend on the input size; build the structure only (no weights).
        info = example_info(name)
        with torch.device("meta"):
            model = build_model(name, info)
        points = ", ".join(f"{point} (after {stage})" if point != stage else point
                           for point, stage in model.split_points.items())
        doc = (MODELS[name].__doc__ or "").strip().splitlines()[0]
        print(f"{name:16s} split points: {points}; default {model.default_split}\n{'':16s} {doc}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedskew", description=__doc__)
    parser.add_argument("--params", default="params.yaml", help="the experiment configuration (default: params.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="check params.yaml and count runs")
    sub.add_parser("methods", help="list the methods with their hyperparameters and defaults")
    sub.add_parser("models", help="list the models with their split points")
    p = sub.add_parser("download", help="prepare a dataset under data/raw/")
    p.add_argument("--dataset", required=True)
    p.add_argument("--no-download", action="store_true", help="use only files already on disk")
    p = sub.add_parser("partition", help="write a seeded partition under data/partitions/")
    p.add_argument("--dataset", required=True)
    p.add_argument("--partition", required=True)
    p.add_argument("--seed", type=int, required=True)
    p = sub.add_parser("train", help="train one run (resuming from its checkpoint) and log it to MLflow")
    for key in ("suite", "dataset", "partition", "method"):
        p.add_argument(f"--{key}", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: training.threads)")
    p = sub.add_parser("track", help="log a suite's trained runs to MLflow from their run files "
                                     "(after a tracking failure; repeating it adds nothing)")
    p.add_argument("--suite", required=True)
    p = sub.add_parser("aggregate", help="tables and figures of a suite")
    p.add_argument("--suite", required=True)
    p = sub.add_parser("paper-table", help="a paper's table in its own layout, ours beside the paper's values")
    p.add_argument("--table", required=True, help="e.g. fedlc_t4 (see src/fedskew/reproduce/papers/)")
    sub.add_parser("claims", help="the claims ledger: every paper claim with its verdict (results/claims.md)")
    sub.add_parser("cost", help="runs and estimated compute of every paper table (markdown)")
    return parser


COMMANDS = {"validate": cmd_validate, "download": cmd_download, "partition": cmd_partition,
            "train": cmd_train, "track": cmd_track, "aggregate": cmd_aggregate, "methods": cmd_methods,
            "models": cmd_models,
            "paper-table": cmd_paper_table, "claims": cmd_claims, "cost": cmd_cost}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    from fedskew.data.download import DatasetCorruptError, DatasetUnavailableError
    from fedskew.data.partition import PartitionError
    from fedskew.engine.simulation import NonFiniteError

    try:
        params = None if args.command in ("methods", "models") else load_params(args.params)
        COMMANDS[args.command](params, args)
    except (ConfigError, DatasetUnavailableError, DatasetCorruptError, PartitionError, NonFiniteError,
            FileNotFoundError, RunFileError, TrackingError) as error:
        print(f"fedskew {args.command}: {error}", file=sys.stderr)
        return 1 if isinstance(error, NonFiniteError) else 2
    return 0
