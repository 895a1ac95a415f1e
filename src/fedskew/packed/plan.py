"""Which runs a packed runner trains, in which order, and the inputs they need."""

from __future__ import annotations

import json
from pathlib import Path

from fedskew import paths
from fedskew.config import ConfigError, Params, RunConfig


def select_runs(params: Params, suites: list[str], *, datasets: list[str] | None = None,
                partitions: list[str] | None = None, methods: list[str] | None = None,
                seeds: list[int] | None = None, run_ids: list[str] | None = None) -> list[RunConfig]:
    """The runs of `suites` that pass every given filter, in params.yaml's order.

    A filter value no run of those suites has is an error naming the values there are, so a
    typo never turns into an empty (or silently smaller) selection.
    """
    unknown = [s for s in suites if s not in params.raw["suites"]]
    if unknown:
        raise ConfigError(f"--suite {', '.join(unknown)}: not a suite of params.yaml; defined: "
                          f"{', '.join(params.raw['suites'])}")
    runs = [cfg for suite in suites for cfg in params.suite_runs(suite)]
    for name, wanted, value in (("dataset", datasets, lambda c: c.dataset), ("partition", partitions,
                                lambda c: c.partition), ("method", methods, lambda c: c.method),
                                ("seed", seeds, lambda c: c.seed), ("run-id", run_ids, lambda c: c.run_id)):
        if not wanted:
            continue
        present = list(dict.fromkeys(value(c) for c in runs))
        missing = [w for w in wanted if w not in present]
        if missing:
            raise ConfigError(f"--{name} {', '.join(map(str, missing))}: no run of suite(s) {', '.join(suites)} has "
                              f"it; they have: {', '.join(map(str, present))}")
        runs = [c for c in runs if value(c) in wanted]
    return runs


def order_runs(runs: list[RunConfig], first: list[str] | None = None) -> list[RunConfig]:
    """The methods named in `first` first, in that order (each over every dataset, partition and seed),
    then the rest as listed: what a table needs most runs first when GPU time is short."""
    rank = {method: i for i, method in enumerate(first or [])}
    return sorted(runs, key=lambda c: rank.get(c.method, len(rank)))  # stable: params.yaml's order within


def run_state(cfg: RunConfig, root: Path = Path(".")) -> str:
    """"finished" (its metrics.json exists), "started" (a checkpoint exists) or "not started"."""
    if (root / cfg.path(paths.RUN_METRICS)).exists():
        return "finished"
    if (root / cfg.path(paths.CHECKPOINT_DIR) / "last.pt").exists():
        return "started"
    return "not started"


def prepare_inputs(params: Params, runs: list[RunConfig]) -> None:
    """The datasets and partitions `runs` read, made where missing in the project folder (the working
    directory, as for every command): what Snakemake's download and partition jobs would do; a dataset
    comes from its local sources or the network as usual."""
    root = Path(".")
    from fedskew.data.registry import prepare
    from fedskew.job import prepare_partition

    for dataset in dict.fromkeys(c.dataset for c in runs):
        spec = params.dataset_spec(dataset)
        ready = root / paths.RAW_READY.format(dataset=dataset)
        try:
            prepared = json.loads(ready.read_text()).get("spec") == spec
        except (OSError, ValueError, AttributeError):
            prepared = False
        if not prepared:
            prepare(dataset, spec, root)
    for dataset, partition, seed in dict.fromkeys((c.dataset, c.partition, c.seed) for c in runs):
        keys = {"dataset": dataset, "partition": partition, "seed": seed}
        if not (root / paths.PARTITION.format(**keys)).exists():
            prepare_partition(params, dataset, partition, seed)
