"""Where a workflow's time went, by suite: read from Snakemake's own records of a project's jobs.

Snakemake keeps, for every output it made, the job's start and end time (`.snakemake/metadata/`,
one JSON record a file, named by the output path in base64). This groups the training jobs by suite
(their outputs are `results/runs/<suite>/...`) and prints, per suite, the jobs, the sum of their
durations (job-seconds: with one thread a job, about its CPU time on a machine that is not
oversubscribed) and the span from the first job's start to the last job's end (wall time, which
includes jobs of other suites that ran beside them). A job counts once, by its `metrics.json`.

    .venv/bin/python benchmarks/workflow_time.py [--project .] [--suites flfcr_adult ...] [--since 2026-11-27T04:00]

A record describes the last time Snakemake made that output: runs retrained later replace their
record, and runs trained in another project (imported, or copied in) have none.
"""

from __future__ import annotations

import argparse
import base64
import json
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path


def train_jobs(project: Path, since: float = 0.0) -> dict[str, list[tuple[float, float]]]:
    """(start, end) of every training job that started at `since` or later, by suite, from the project's
    Snakemake metadata."""
    jobs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record_file in sorted((project / ".snakemake" / "metadata").iterdir()):
        output = base64.b64decode(record_file.name.replace("@", "/") + "==").decode()
        parts = Path(output).parts
        if parts[:2] != ("results", "runs") or parts[-1] != "metrics.json":
            continue
        record = json.loads(record_file.read_text())
        if record.get("incomplete") or record.get("starttime") is None or record.get("endtime") is None:
            continue
        if record["starttime"] < since:
            continue
        jobs[parts[2]].append((record["starttime"], record["endtime"]))
    return jobs


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=Path("."))
    parser.add_argument("--suites", nargs="*", help="only these suites (default: every suite with records)")
    parser.add_argument("--since", type=datetime.fromisoformat,
                        help="only jobs that started at this UTC time or later, e.g. 2026-11-27T04:00")
    args = parser.parse_args()
    since = args.since.replace(tzinfo=timezone.utc).timestamp() if args.since else 0.0
    jobs = train_jobs(args.project, since)
    suites = args.suites or sorted(jobs)
    print(f"{'suite':22s} {'jobs':>5s} {'job-hours':>10s} {'per job s':>10s} {'span h':>7s}  "
          "first start -> last end (UTC)")
    total = 0.0
    for suite in suites:
        spans = jobs.get(suite, [])
        if not spans:
            print(f"{suite:22s} {0:5d}  (no records)")
            continue
        seconds = sum(end - start for start, end in spans)
        total += seconds
        first, last = min(s for s, _ in spans), max(e for _, e in spans)
        print(f"{suite:22s} {len(spans):5d} {seconds / 3600:10.2f} {seconds / len(spans):10.1f} "
              f"{(last - first) / 3600:7.2f}  {_when(first)} -> {_when(last)}")
    print(f"{'all':22s} {'':5s} {total / 3600:10.2f}")


if __name__ == "__main__":
    main()
