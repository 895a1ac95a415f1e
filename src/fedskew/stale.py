"""`python -m fedskew stale`: the runs there are whose run id no longer matches params.yaml and the code.

A run is found where it lives: trained or imported here (`results/runs/<suite>/.../config.yaml`), in the
committed archives of the suites trained here (`results/committed-runs/<suite>/`) and of those trained elsewhere
(`results/imported/<suite>/`). It is out of date when the id that params.yaml and the code give its grid point
now (fedskew.config.RunConfig.run_id: the resolved configuration with the numerics versions of the pieces that
compute it and the CPU kernels) is not the id it was trained under, or when params.yaml no longer has that grid
point. Each is reported with its cause, found by comparing what its config.yaml records with what the run would
be now (fedskew.config.identity): a piece whose version was raised, a setting that changed, or the CPU kernels;
and with what it feeds: its suite's committed table, the paper tables whose cells read it and the ledger's
claims on those tables.

Snakemake decides what retrains (by run id, a parameter of every training job), so `snakemake -n` plans the
out-of-date runs of the suites it builds; this command says which they are and why, across the committed ones
too. `make run`, `make verify` and `make reproduce` print its summary before they build (`summary_lines`), and
no out-of-date run is read in a current one's place: `packed import` refuses one (or, in the reproduction's
import of a suite trained elsewhere, leaves it out and lists it in the suite's IMPORTED mark), the tables read
a run only under its current id, and a paper table's cell counts its out-of-date seeds
(fedskew.reproduce.tables).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from fedskew import paths
from fedskew.config import ConfigError, Params, RunConfig, hash_identity, identity

# Where each kind of piece is named in a run's configuration, for a cause's wording.
_PIECE_NAMES = {"method": ("method_spec", "algorithm"), "model": ("training", "model"),
                "source": ("dataset_spec", "source"), "scheme": ("partition_spec", "scheme")}


@dataclass(frozen=True)
class StaleRun:
    suite: str
    dataset: str
    partition: str
    method: str
    seed: int
    run_id: str                  # the id it was trained under
    current_run_id: str | None   # the id params.yaml and the code give its grid point now; None: no such run now
    where: str                   # its config.yaml, or the archive holding it
    cause: str                   # what changed since, e.g. "method fedprox: version 1 -> 2"
    tables: tuple[str, ...] = field(default=())        # committed tables it feeds: the suite's, the papers'
    claims: tuple[str, ...] = field(default=())        # ledger claims on those paper tables

    def record(self) -> dict:
        return {**asdict(self), "tables": list(self.tables), "claims": list(self.claims)}


def _found_runs(suites: list[str], root: Path) -> Iterator[tuple[dict, str]]:
    """(config.yaml as recorded, where it is) of every run of `suites` trained here or committed as archives."""
    from fedskew.packed.archive import archived_configs

    for suite in suites:
        for config in sorted((root / paths.SUITE_RUNS.format(suite=suite)).glob("**/config.yaml")):
            yield yaml.safe_load(config.read_text()), str(config.relative_to(root))
        for folder in (paths.COMMITTED_RUNS, paths.IMPORTED_ARCHIVES):
            for archive in sorted((root / folder.format(suite=suite)).glob("*.tar.gz")):
                for config in archived_configs(archive):
                    yield config, str(archive.relative_to(root))


def _current(params: Params, config: dict) -> RunConfig | None:
    try:
        return params.run(config["suite"], config["dataset"], config["partition"], config["method"],
                          int(config["seed"]))
    except (ConfigError, KeyError):  # the suite, a setting, the method or the seed is gone from params.yaml
        return None


def cause(config: dict, current: RunConfig | None) -> str:
    """Why a run recorded as `config` (its config.yaml) is out of date against `current`, in words."""
    if current is None:
        return "no longer a run of params.yaml"
    resolved = current.to_dict()
    then, now = identity(config), identity(resolved)
    causes = []
    versions_then, versions_now = then.pop("numerics_versions", {}), now.pop("numerics_versions", {})
    for piece in sorted(versions_then.keys() | versions_now.keys()):
        section, key = _PIECE_NAMES.get(piece, (None, None))
        name = f"{piece} {resolved[section][key]}" if section else piece
        causes.append(f"{name}: version {versions_then.get(piece, 1)} -> {versions_now.get(piece, 1)}")
    codes_then, codes_now = then.pop("plugins", {}), now.pop("plugins", {})
    for piece in sorted(codes_then.keys() | codes_now.keys()):
        if codes_then.get(piece) != codes_now.get(piece):
            recorded, present = config.get("plugins", {}).get(piece), resolved.get("plugins", {}).get(piece)
            causes.append(_plugin_cause(piece, recorded, present, resolved))
    flat_then, flat_now = _flatten(then), _flatten(now)
    for key in sorted(flat_then.keys() | flat_now.keys()):
        if key not in ("cpu_kernel_recipe", "cpu_kernels") and flat_then.get(key, "unset") != flat_now.get(key, "unset"):
            causes.append(f"{key}: {_show(flat_then.get(key, 'unset'))} -> {_show(flat_now.get(key, 'unset'))}")
    if not causes:  # the same configuration and versions: what the code and machine add to the id moved
        causes.append("the CPU kernels it was computed under (the model's kernel recipe, or FEDSKEW_CPU_KERNELS)"
                      if hash_identity(then) == current.run_id else "what its id covers, in a way its config.yaml "
                                                                    "does not record")
    return "; ".join(causes)


def _plugin_cause(piece: str, then: dict | None, now: dict | None, resolved: dict) -> str:
    """Why a run's plugin piece moves its id, from what the run recorded of it (`then`) and what it is now."""
    section, key = _PIECE_NAMES[piece]
    name = f"{piece} {resolved[section][key]}"
    if now is None:
        return f"{name}: no longer of plugin {then['distribution']}"
    if then is None:
        return (f"plugin {now['distribution']}: its code was not recorded with the run ({name}; trained before "
                "fedskew folded a plugin's code into its runs' ids, or as a built-in piece)")
    if then.get("distribution") != now["distribution"]:
        return f"{name}: from plugin {then.get('distribution')} to plugin {now['distribution']}"
    return f"plugin {now['distribution']} changed ({name}: its code)"


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _show(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _what_reads(root: Path) -> tuple[dict, dict[str, list[str]]]:
    """(suite, dataset, partition, method) -> the paper tables with a cell that reads it (and, for a table's
    offline proxies, which read a setting's runs of the table's methods, (suite, dataset, partition) -> tables);
    and table -> the ledger's claims on it."""
    from fedskew.reproduce.claim import load_claims
    from fedskew.reproduce.layouts import load_layouts

    cells: dict[tuple, set[str]] = {}
    for table_id, layout in load_layouts().items():
        for row in (*layout.table.rows, *layout.extra_rows):
            for column in layout.table.columns:
                for protocol in (None, *layout.protocols):
                    spec = layout.cell(row, column, protocol)
                    if spec.suite and not spec.not_run and not spec.derived:
                        cells.setdefault((spec.suite, spec.dataset, spec.partition, spec.method), set()).add(table_id)
        for proxy in layout.proxies:
            cells.setdefault((proxy["suite"], proxy.get("dataset"), proxy.get("partition")), set()).add(table_id)
    claims: dict[str, list[str]] = {}
    for claim in load_claims():
        claims.setdefault(claim.table, []).append(claim.id)
    return cells, claims


def stale_runs(params: Params, suites: list[str] | None = None, root: Path = Path(".")) -> list[StaleRun]:
    """Every run of `suites` (default: every suite of params.yaml, and every suite folder holding runs) that is
    out of date, with its cause and what it feeds."""
    if suites is None:  # also the folders of suites that params.yaml no longer has
        holding = (Path(template.format(suite="x")).parent for template in (paths.SUITE_RUNS, paths.COMMITTED_RUNS,
                                                                            paths.IMPORTED_ARCHIVES))
        suites = sorted(set(params.raw["suites"]) | {p.name for folder in holding for p in (root / folder).glob("*")
                                                      if p.is_dir()})
    cells, claims = _what_reads(root)
    out = []
    for config, where in _found_runs(suites, root):
        current = _current(params, config)
        if current is not None and current.run_id == config.get("run_id"):
            continue
        keys = (config["suite"], config["dataset"], config["partition"], config["method"])
        tables = sorted(cells.get(keys, set()) | cells.get(keys[:3], set()))
        suite_table = paths.TABLE.format(suite=config["suite"], ext="md")
        out.append(StaleRun(*keys, int(config["seed"]), str(config.get("run_id")),
                            None if current is None else current.run_id, where, cause(config, current),
                            tuple(([suite_table] if (root / suite_table).exists() else [])
                                  + [paths.PAPER_TABLE.format(table=t, ext="md") for t in tables]),
                            tuple(c for t in tables for c in claims.get(t, []))))
    return out


def report_lines(runs: list[StaleRun]) -> list[str]:
    """The runs grouped by cause: each cause with its runs by suite and where they are, and what they feed."""
    if not runs:
        return ["fedskew stale: no run is out of date: every run there is has the id params.yaml and the code give it"]
    lines = [f"fedskew stale: {len(runs)} run(s) out of date, for {len({r.cause for r in runs})} cause(s)"]
    for why in sorted({r.cause for r in runs}):
        group = [r for r in runs if r.cause == why]
        lines.append(f"\n{why}: {len(group)} run(s)")
        for where in sorted({r.where for r in group}):
            here = [r for r in group if r.where == where]
            points = sorted({(r.suite, r.dataset, r.partition, r.method) for r in here})
            described = "; ".join(f"{s} {d}/{p} {m} seed {' '.join(str(r.seed) for r in here if (r.suite, r.dataset, r.partition, r.method) == (s, d, p, m))}"
                                  for s, d, p, m in points)
            lines.append(f"  {where}: {described}")
        fed = sorted({t for r in group for t in r.tables})
        claimed = sorted({c for r in group for c in r.claims})
        if fed:
            lines.append(f"  feeds {', '.join(fed)}" + (f"; claims {', '.join(claimed)}" if claimed else ""))
    lines.append("\nRetrain them with `snakemake --cores all` (or `make run`, `make reproduce`): Snakemake plans "
                 "exactly the out-of-date runs of what it builds. `--json` gives one record a run.")
    return lines


def summary_lines(params: Params, suites: list[str], root: Path = Path(".")) -> list[str]:
    """One line for a build (`make run`, `make verify`, `make reproduce`) when runs of its suites are out of date:
    how many, where, and why (empty when none is)."""
    runs = stale_runs(params, suites, root)
    if not runs:
        return []
    causes = sorted({r.cause for r in runs})
    return [f"fedskew: {len(runs)} run(s) of {', '.join(sorted({r.suite for r in runs}))} out of date ("
            f"{'; '.join(causes[:3])}{'; ...' if len(causes) > 3 else ''}): Snakemake retrains those this build "
            "trains, and no out-of-date run is read in a current one's place (`python -m fedskew stale` lists them)"]
