"""`python -m fedskew packed run|status|ship|import`: the packed runner's command line (fedskew.packed)."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from fedskew import arguments, paths
from fedskew.config import Params, RunConfig
from fedskew.packed.unpacking import MAX_ARCHIVE_BYTES

if TYPE_CHECKING:  # for annotations only: each verb imports what it needs when it runs (archive reaches torch)
    from fedskew.packed.archive import ImportReport

log = logging.getLogger("fedskew")


def _selection(params: Params, args: argparse.Namespace) -> list[RunConfig]:
    from fedskew.packed.plan import order_runs, select_runs

    runs = select_runs(params, args.suite, datasets=args.dataset, partitions=args.partition, methods=args.method,
                       seeds=args.seed, run_ids=args.run_id)
    return order_runs(runs, args.first)


def cmd_run(params: Params, args: argparse.Namespace) -> None:
    from fedskew.packed.plan import prepare_inputs, run_state
    from fedskew.packed.runner import run_piece

    runs = _selection(params, args)
    pending = [cfg for cfg in runs if run_state(cfg) != "finished"]
    print(f"packed: {len(runs) - len(pending)} of {len(runs)} selected runs finished; {len(pending)} to train with "
          f"{args.workers} worker(s) for at most {args.time_limit:.0f} s", flush=True)
    if not pending:
        return
    prepare_inputs(params, pending)
    if args.prepare_only:
        print("packed: datasets and partitions ready", flush=True)
        return
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    summary = run_piece(pending, workers=args.workers, time_limit_s=args.time_limit, threads=threads,
                        max_rounds=args.max_rounds)
    line = summary.line()
    rounds_per_run = sum(c.train.rounds for c in pending) / len(pending)
    mfu = f", MFU {line['mfu']:.3f} of the {line['peak_tflops']} TFLOP/s peak" if line["mfu"] is not None else ""
    print(f"packed: {line['finished']} finished, {line['paused']} paused, {line['diverged']} diverged, "
          f"{line['failed']} failed, {line['skipped']} left for the next piece; {line['rounds']} rounds in "
          f"{line['wall_s']:.0f} s on {summary.device_name} ({summary.precision}); about {line['pflop']} PFLOP, "
          f"{line['tflops']} TFLOP/s sustained{mfu}; {summary.runs_per_hour(rounds_per_run):.3g} runs per "
          f"device-hour at this pace", flush=True)
    need = summary.seconds_to_finish_paused()
    if need is not None:
        print(f"packed: the paused runs need up to {need:.0f} s more at this pace; a piece at least that long "
              "(plus the start) finishes them where the machine keeps their checkpoints", flush=True)
    done = sum(run_state(cfg) == "finished" for cfg in runs)
    print(f"packed: {done} of {len(runs)} selected runs finished", flush=True)
    if line["failed"]:
        raise RuntimeError(f"{line['failed']} run(s) failed in this piece; see the log above and "
                           "logs/packed/pieces.jsonl (the other runs were not affected)")


def cmd_status(params: Params, args: argparse.Namespace) -> None:
    from fedskew.packed.plan import run_state

    runs = _selection(params, args)
    by_method: dict[str, dict[str, int]] = {}
    for cfg in runs:
        counts = by_method.setdefault(cfg.method, {"finished": 0, "started": 0, "not started": 0})
        counts[run_state(cfg)] += 1
    width = max([len(m) for m in by_method] + [6])
    for method, counts in by_method.items():
        print(f"{method:{width}s}  " + ", ".join(f"{n} {state}" for state, n in counts.items()))
    total = {state: sum(c[state] for c in by_method.values()) for state in ("finished", "started", "not started")}
    print(f"{'all':{width}s}  " + ", ".join(f"{n} {state}" for state, n in total.items()) + f" of {len(runs)}")


def cmd_ship(params: Params, args: argparse.Namespace) -> None:
    from fedskew.packed.archive import ship

    archives = ship(_selection(params, args), Path(args.out), max_bytes=int(args.max_mb * 2**20))
    for path in archives:
        print(f"{path} ({path.stat().st_size} bytes)")
    if not archives:
        print("packed ship: no finished run in the selection that the archives in --out do not already hold; "
              "nothing written")


def cmd_import(params: Params, args: argparse.Namespace) -> None:
    from fedskew import job
    from fedskew.packed.archive import import_archives

    if not args.archive and not args.mark:
        from fedskew.config import ConfigError

        raise ConfigError("packed import needs the archives to import: `python -m fedskew packed import <archive>...`")
    report = import_archives(params, [Path(a) for a in args.archive], skip_stale=args.skip_stale)
    print(f"packed import: {len(report.imported)} run(s) added to results/runs, {len(report.already)} already there")
    for entry in report.stale:
        print(f"packed import: left out {entry['run']} of {entry['archive']}: trained as run {entry['run_id']}, "
              f"which params.yaml and the code now make {entry['current_run_id']} (`python -m fedskew stale` says why)")
    if args.mark:  # the reproduction's mark that the suite is imported, with what it left out (its cells say so)
        from fedskew.runfiles import atomic_write_text

        atomic_write_text(Path(args.mark), json.dumps({"stale": report.stale}, indent=1, allow_nan=False)
                          + "\n")
    if job.tracking_enabled():
        _log_imported_runs(report)


def _log_imported_runs(report: ImportReport) -> None:
    """Log to MLflow the runs an import placed and those it found in place, each unless MLflow already records
    it with its status (as `track` does): a run imported before while tracking was off, or whose logging
    failed, is logged now. A failure leaves the run files in place and names the `track` command that logs
    them later."""
    from fedskew import job, tracking
    from fedskew.runfiles import read_metrics

    runs = [cfg for cfg, _ in report.imported] + report.already
    logged, unlogged = 0, {}
    for suite in dict.fromkeys(cfg.suite for cfg in runs):
        of_suite = [cfg for cfg in runs if cfg.suite == suite]
        try:
            recorded = tracking.recorded_runs(tracking.tracking_uri(Path(".")), f"fedskew/{suite}")
        except Exception as error:  # noqa: BLE001 - the run files are in place; say how to log them later
            log.error("reading the MLflow runs of suite %s failed: %s", suite, error)
            unlogged[suite] = len(of_suite)
            continue
        for cfg in of_suite:
            try:
                final = read_metrics(cfg)
                if recorded.get(cfg.run_id) == job.finished_status(final):
                    continue
                provenance = final.get("provenance", {})
                tags = {**job.run_tags(cfg), **{f"fedskew.provenance.{k}": str(v) for k, v in provenance.items()},
                        "fedskew.imported_from": report.sources[cfg.run_id].name,
                        **({"git.commit": provenance["commit"]} if provenance.get("commit", "unknown") != "unknown"
                           else {})}
                job.log_run_files(cfg, tags)
                logged += 1
            except Exception as error:  # noqa: BLE001 - the run files are in place; name each run that failed to log
                log.error("logging %s failed: %s", cfg.path(paths.RUN_DIR), error)
                unlogged[suite] = unlogged.get(suite, 0) + 1
    if logged:
        print(f"packed import: {logged} run(s) logged to MLflow")
    if unlogged:
        commands = "; ".join(f"`python -m fedskew track --suite {suite}`" for suite in unlogged)
        raise job.TrackingError(f"{sum(unlogged.values())} imported run(s) could not be logged to MLflow; their files "
                                f"are in place: {commands} logs them later")


def add_parser(sub: argparse._SubParsersAction) -> None:
    packed = sub.add_parser("packed", help="train many runs on one device in time-limited pieces, ship their files "
                                           "in bounded archives, import them (docs/gpu.md)")
    verbs = packed.add_subparsers(dest="packed_command", required=True)

    def selection(p: argparse.ArgumentParser) -> None:
        p.add_argument("--suite", nargs="+", required=True)
        p.add_argument("--dataset", nargs="+")
        p.add_argument("--partition", nargs="+")
        p.add_argument("--method", nargs="+")
        p.add_argument("--seed", nargs="+", type=arguments.seed)
        p.add_argument("--run-id", nargs="+", dest="run_id", help="run ids (config.yaml's run_id)")
        p.add_argument("--first", nargs="+", default=[], metavar="METHOD",
                       help="train these methods first, in this order (e.g. scala fedavg splitfed_v1)")

    p = verbs.add_parser("run", help="one piece: train the selection's unfinished runs until --time-limit")
    selection(p)
    p.add_argument("--workers", type=arguments.processes, default=1,
                   help="worker processes sharing the device (default 1)")
    p.add_argument("--time-limit", type=arguments.number(0, low_open=True), default=540.0, dest="time_limit",
                   help="seconds for the piece, runs in progress are checkpointed before it ends (default 540)")
    p.add_argument("--threads", type=arguments.threads, default=None,
                   help="torch CPU threads per worker (default: cores / workers)")
    p.add_argument("--prepare-only", action="store_true", dest="prepare_only",
                   help="only make the datasets and partitions the selection needs, then stop")
    p.add_argument("--max-rounds", type=arguments.rounds, default=None, dest="max_rounds",
                   help="train at most this many rounds of each run in this piece (a slice, e.g. to measure throughput)")
    p = verbs.add_parser("status", help="finished / started / not started runs of the selection, by method")
    selection(p)
    p = verbs.add_parser("ship", help="pack the selection's finished runs into verified archives")
    selection(p)
    p.add_argument("--out", required=True, help="folder for the archives (runs its archives hold are not packed again)")
    p.add_argument("--max-mb", type=arguments.number(0, MAX_ARCHIVE_BYTES / 2**20, low_open=True), default=16.0,
                   dest="max_mb", help="largest archive in MiB (default 16, the most an import takes)")
    p = verbs.add_parser("import", help="verify archives and add their runs to results/runs and MLflow")
    p.add_argument("archive", nargs="*", help="the archives (none: with --mark, only the mark is written)")
    p.add_argument("--skip-stale", action="store_true", dest="skip_stale",
                   help="leave out, and name, the runs whose run id params.yaml and the code no longer give them "
                        "(without it such a run refuses the import)")
    p.add_argument("--mark", help="write this JSON file once imported: the runs left out as out of date")


def cmd_packed(params: Params, args: argparse.Namespace) -> None:
    {"run": cmd_run, "status": cmd_status, "ship": cmd_ship, "import": cmd_import}[args.packed_command](params, args)
