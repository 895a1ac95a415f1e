"""The checks of params.yaml that relate its sections to each other, made once its schema passes.

References between sections (a suite naming an undefined dataset, partition or method; a training section
without its suite), whether a model takes a dataset's inputs, a setting another leaves without effect
(a method's `switches`), whether the arrays a setting makes fedskew allocate fit
(MAX_ARRAY_NUMBERS), and whether each partition can split each dataset a suite uses it on, wherever the
dataset's size is known in advance (fedskew.data.sizes). Without torch: the facts about datasets, models and
algorithms come from fedskew.catalog. Every problem is one line with the key, the bad value and what is allowed,
in the order params.yaml's sections are read.

One check comes before the schema: the size of each suite's grid (`grid_size_problems`, MAX_SEEDS and MAX_RUNS),
counted from the lengths of its lists, so that a file listing a million seeds is refused before anything walks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedskew import catalog
from fedskew.catalog import (
    DatasetInfo,
    dataset_info,
    feature_dim,
    incompatibility,
)
from fedskew.config_errors import short_value, suggestion
from fedskew.families import Family
from fedskew.training_config import TrainingConfig, resolve_training

# The most numbers one array that settings size may hold, 16 GiB as float64: FL-FCR's resampled features,
# Synthetic's generated data. Far above what the papers' protocols need (FL-FCR's balanced resampling of
# TinyImageNet through MobileNetV2's 1280 features is 1.3e8 numbers); past it a run needs tens of GiB in one
# step (FL-FCR also keeps a float32 copy for the retraining, Synthetic its float64 parts before joining them).
MAX_ARRAY_NUMBERS = 2 ** 31

# A suite's seeds: each is one more run of every grid point. The shipped suites have 3 to 5; a thousand leaves room
# for a study of the spread over seeds, and keeps a suite's listings and Snakemake plan in seconds.
MAX_SEEDS = 1_000
# The runs of every suite of params.yaml and experiments/ together: validation and every command expand them into
# configurations (about 0.1 ms and a few KB each) and Snakemake plans a job each. The shipped file defines 5528 (its
# largest suite, fedlc_table, 1100); 100 000 leaves room for eighteen times that and still expands in seconds.
MAX_RUNS = 100_000

# (dataset, partition) -> the settings that use it ("suites.<name>.settings[<j>]"), for the partition checks
Uses = dict[tuple[str, str], list[str]]


def _length(value: Any) -> int:
    return len(value) if isinstance(value, list) else 0


def grid_size_problems(raw: Any) -> list[str]:
    """The suites with more than MAX_SEEDS seeds or MAX_RUNS runs, and all suites together past MAX_RUNS, each with
    its count: computed from the lists' lengths, before any grid is expanded or any item checked (the schema alone
    takes minutes over a million seeds), so that such a file is refused at once. What is not shaped as the schema
    says counts as empty here: the schema reports it."""
    suites = raw.get("suites") if isinstance(raw, dict) else None
    if not isinstance(suites, dict):
        return []
    problems, total = [], 0
    for name, body in suites.items():
        body = body if isinstance(body, dict) else {}
        settings = body.get("settings") if isinstance(body.get("settings"), list) else []
        points = sum(_length(s.get("partitions")) for s in settings if isinstance(s, dict))
        methods, seeds = _length(body.get("methods")), _length(body.get("seeds"))
        runs = points * methods * seeds
        total += runs
        if seeds > MAX_SEEDS:
            problems.append(f"suites.{name}.seeds: {seeds} seeds; at most {MAX_SEEDS} (each seed is a run of every "
                            "grid point): list fewer")
        elif runs > MAX_RUNS:
            problems.append(f"suites.{name}: {points} dataset/partition pair(s) x {methods} method(s) x {seeds} "
                            f"seed(s) = {runs} runs; at most {MAX_RUNS}: split it, or list fewer")
    if total > MAX_RUNS and not problems:
        problems.append(f"suites: {total} runs in the {len(suites)} suites together; at most {MAX_RUNS} (every "
                        "command expands them all): move some suites to another project")
    return problems


def cross_section_problems(raw: dict) -> list[str]:
    """Every problem between the sections of a params.yaml whose schema passed, in the order of its sections."""
    problems = _listed_suite_problems(raw) + _training_section_problems(raw)
    used: Uses = {}
    for name, suite in raw["suites"].items():
        problems += _suite_problems(raw, name, suite, used)
    return problems + _switched_off_problems(raw) + _size_problems(raw, used)


def _not_a_suite(where: str, suite: str, raw: dict) -> str:
    return (f"{where}: {suite!r} is not a suite{suggestion(suite, raw['suites'])}; "
            f"defined: {', '.join(raw['suites'])}")


def _listed_suite_problems(raw: dict) -> list[str]:
    """`run.suites`, `reproduce.suites` and `reproduce.imported` name suites; a suite is trained or imported."""
    reproduce = raw.get("reproduce", {})
    problems = [_not_a_suite(f"run.suites[{i}]", suite, raw)
                for i, suite in enumerate(raw["run"]["suites"]) if suite not in raw["suites"]]
    problems += [_not_a_suite(f"reproduce.suites[{i}]", suite, raw)
                 for i, suite in enumerate(reproduce.get("suites", [])) if suite not in raw["suites"]]
    trained_here = set(reproduce.get("suites", []))
    for i, suite in enumerate(reproduce.get("imported", [])):
        if suite not in raw["suites"]:
            problems.append(_not_a_suite(f"reproduce.imported[{i}]", suite, raw))
        elif suite in trained_here:
            problems.append(f"reproduce.imported[{i}]: {suite!r} is also in reproduce.suites; a suite is either "
                            "trained by the reproduction or imported from its archives: remove it from one list")
    return problems


def _training_section_problems(raw: dict) -> list[str]:
    """Each `training.<name>` belongs to a suite."""
    return [f"training.{name}: no suite named {name!r}{suggestion(name, raw['suites'])}; "
            f"defined: {', '.join(raw['suites'])}" for name in raw["training"] if name not in raw["suites"]]


@dataclass(frozen=True)
class _Setting:
    """One entry of a suite's `settings`, its dataset defined: what the checks of its partitions and its
    training settings need to know about it."""

    suite: str
    index: int
    dataset: str
    spec: dict            # the dataset's options, its source's defaults filled in
    info: DatasetInfo

    @property
    def where(self) -> str:
        return f"suites.{self.suite}.settings[{self.index}]"


def _algorithm(raw: dict, method: str) -> str:
    """The algorithm a suite's method names: a method defined under `methods`, or an algorithm by its name."""
    return raw.get("methods", {}).get(method, {"algorithm": method})["algorithm"]


def _suite_problems(raw: dict, name: str, suite: dict, used: Uses) -> list[str]:
    """A suite's references (overrides, methods, each setting's dataset and partitions) and each setting's
    training settings; records in `used` the (dataset, partition) pairs it trains on."""
    if name not in raw["training"]:  # never silent defaults: the suite says what it trains with
        return [f"suites.{name}: no training block training.{name}; write one with the suite's settings, or "
                f"`training: {{{name}: {{inherit: <block>, ...}}}}` to take another block's and change some "
                f"(blocks: {', '.join(raw['training']) or 'none'})"]
    training = raw["training"][name]
    datasets = [s["dataset"] for s in suite["settings"]]
    problems = [f"training.{name}.overrides.{key}: suite {name!r} uses no dataset {key!r}"
                for key in training.get("overrides", {}) if key not in datasets]
    for i, method in enumerate(suite["methods"]):
        if method not in raw["methods"] and method not in catalog.methods():
            hint = suggestion(method, [*raw["methods"], *catalog.methods()])
            problems.append(f"suites.{name}.methods[{i}]: {method!r} is neither a method defined under "
                            f"`methods` nor an algorithm{hint}; methods: {', '.join(raw['methods']) or 'none'}; "
                            f"algorithms: {', '.join(catalog.methods())}")
    first_setting: dict[tuple[str, str], int] = {}
    for j, entry in enumerate(suite["settings"]):
        dataset = entry["dataset"]
        if dataset not in raw["datasets"]:
            problems.append(f"suites.{name}.settings[{j}].dataset: {dataset!r} is not defined under `datasets`"
                            f"{suggestion(dataset, raw['datasets'])}; defined: {', '.join(raw['datasets'])}")
            continue
        spec = {**catalog.dataset_defaults(raw["datasets"][dataset]["source"]), **raw["datasets"][dataset]}
        setting = _Setting(name, j, dataset, spec, dataset_info(spec))
        problems += _partition_problems(raw, setting, entry["partitions"], first_setting, used)
        problems += _setting_training_problems(raw, setting, suite["methods"], training)
    return problems


def _partition_problems(raw: dict, setting: _Setting, partitions: list[str],
                        first_setting: dict[tuple[str, str], int], used: Uses) -> list[str]:
    """A setting's partitions: defined, natural only where the dataset has natural clients, and not already
    trained on by an earlier setting of the suite (`first_setting`); the others are recorded in `used`."""
    problems = []
    dataset, where = setting.dataset, setting.where
    for k, partition in enumerate(partitions):
        if partition not in raw["partitions"]:
            problems.append(f"{where}.partitions[{k}]: {partition!r} is not defined under `partitions`"
                            f"{suggestion(partition, raw['partitions'])}; "
                            f"defined: {', '.join(raw['partitions'])}")
        elif raw["partitions"][partition]["scheme"] == "natural" and not setting.info.has_natural_partition:
            problems.append(f"{where}.partitions[{k}]: {partition!r} uses scheme 'natural', but dataset "
                            f"{dataset!r} ({setting.spec['source']}) has no natural clients; use iid/dirichlet/...")
        elif (dataset, partition) in first_setting:  # the same runs twice, under one path
            problems.append(f"{where}.partitions[{k}]: partition {partition!r} of dataset {dataset!r} is "
                            f"listed twice in suite {setting.suite!r} (also in "
                            f"settings[{first_setting[dataset, partition]}]); keep one")
        else:
            first_setting[dataset, partition] = setting.index
            used.setdefault((dataset, partition), []).append(where)
    return problems


def _setting_training_problems(raw: dict, setting: _Setting, methods: list[str], training: dict) -> list[str]:
    """The suite's training settings, with its overrides for the setting's dataset, against that dataset and
    the suite's methods."""
    written = {**training, **training.get("overrides", {}).get(setting.dataset, {})}
    train = TrainingConfig.from_record(resolve_training(training, setting.dataset), f"training.{setting.suite}")
    unfit = incompatibility(train.model, setting.info)
    problems = _model_problems(setting, train, unfit)
    problems += _optimizer_problems(raw, setting.suite, methods, train)
    problems += _interval_problems(setting, train, written)
    if not unfit:
        problems += _resampling_problems(raw, setting.suite, methods, setting.dataset, setting.spec, train.model)
    if train.precision == "tf32" and train.device == "cpu":
        problems.append(f"training.{setting.suite}: precision 'tf32' needs an NVIDIA GPU, but device is 'cpu'; "
                        "use fp32 or bf16 on a CPU, or device cuda/auto")
    split = [m for m in methods if catalog.family(_algorithm(raw, m)) == Family.SPLIT]
    if train.local_diagnostics and split:
        problems.append(f"training.{setting.suite}.local_diagnostics: suite {setting.suite!r} runs split method(s) "
                        f"{', '.join(split)}, which have no local model of the whole network to "
                        "diagnose; use a suite of federated methods")
    return problems


def _model_problems(setting: _Setting, train: TrainingConfig, unfit: str | None) -> list[str]:
    """The first of: the model cannot take the dataset's inputs (`unfit`), image augmentation on vectors, a split
    point the model does not have."""
    name, dataset, model = setting.suite, setting.dataset, train.model
    if unfit:
        return [f"training.{name}: model {model!r} on dataset {dataset!r}: {unfit}"]
    if train.augmentation != "none" and not setting.info.is_image:
        return [f"training.{name}: augmentation {train.augmentation!r} on dataset {dataset!r}: "
                "augmentations transform images, but the dataset gives vectors; use 'none'"]
    if train.split_point is not None and train.split_point not in catalog.SPLIT_POINTS[model]:
        return [f"training.{name}: split_point {train.split_point!r} is not a split point "
                f"of model {model!r}; known: {', '.join(catalog.SPLIT_POINTS[model])}"]
    return []


def _optimizer_problems(raw: dict, name: str, methods: list[str], train: TrainingConfig) -> list[str]:
    """Adam takes no momentum, and methods whose corrections are SGD's refuse it."""
    if train.optimizer != "adam":
        return []
    problems = []
    if train.momentum != 0:
        problems.append(f"training.{name}: momentum {train.momentum} is SGD's; Adam's moments use "
                        "its own betas (0.9, 0.999): set momentum 0, or optimizer sgd")
    for method in methods:
        algorithm = _algorithm(raw, method)
        why = catalog.methods().get(algorithm, {}).get("sgd_only")
        if why:
            problems.append(f"training.{name}: optimizer adam, but method {method!r} {why}; "
                            "train it with optimizer sgd")
    return problems


def _interval_problems(setting: _Setting, train: TrainingConfig, written: dict[str, Any]) -> list[str]:
    """An `eval_every` or `checkpoint_every` written above `rounds`: the same run as `rounds`, under another id.
    Only a value written: `rounds: 5` alone keeps checkpoint_every's default 10, and is not refused for it."""
    problems = []
    for key, what in (("eval_every", "evaluated"), ("checkpoint_every", "checkpointed")):
        if key in written and written[key] > train.rounds:
            problems.append(f"training.{setting.suite}: {key} {getattr(train, key)} on dataset {setting.dataset!r} "
                            f"is above rounds {train.rounds}: only the last round is {what} either way, as {key}: "
                            f"{train.rounds} says; use at most {train.rounds}")
    return problems


def _switched_off_problems(raw: dict) -> list[str]:
    """Method options another option leaves without effect (a method's `switches`), set to a value
    other than their default: the same computation as the default, under another run id."""
    problems = []
    for name, spec in raw["methods"].items():
        algorithm = spec["algorithm"]
        defaults = catalog.defaults(algorithm)
        options = {**defaults, **spec}
        if algorithm == "flfcr" and options["samples_per_class"] == 0 and options["retrain_epochs"] > 0:
            problems.append(f"methods.{name}.samples_per_class: 0 draws no features, so retrain_epochs "
                            f"{options['retrain_epochs']} retrains nothing; to turn retraining off, write "
                            "retrain_epochs: 0 and leave samples_per_class out")
        for switch, meaning, dependents in catalog.methods()[algorithm]["switches"]:
            if options[switch] != 0:
                continue
            for option in dependents:
                if option in spec and spec[option] != defaults[option]:
                    problems.append(f"methods.{name}.{option}: {short_value(spec[option])} has no effect while {switch} "
                                    f"is 0 ({meaning}); leave {option} out, or make {switch} nonzero")
    return problems


def _resampling_problems(raw: dict, suite: str, methods: list[str], dataset: str, spec: dict, model: str
                         ) -> list[str]:
    """FL-FCR's virtual features, drawn each round as float64 (fedskew.fl.flfcr: `_calibrate`), must fit in
    MAX_ARRAY_NUMBERS: samples_per_class × classes features of the model's feature width. `balanced` and
    `class_sized` draw at most the round's pooled samples, bounded by the training set where its size is known."""
    from fedskew.data import sizes

    info = dataset_info(spec)
    width = feature_dim(model, info)
    problems = []
    for method in methods:
        method_spec = raw["methods"].get(method, {"algorithm": method})
        if method_spec["algorithm"] != "flfcr":
            continue
        per_class = method_spec.get("samples_per_class", catalog.defaults("flfcr")["samples_per_class"])
        fixed = isinstance(per_class, int)
        drawn = per_class * info.num_classes if fixed else sizes.train_size(spec)
        if drawn is None or drawn * width <= MAX_ARRAY_NUMBERS:
            continue
        count = (f"{per_class} × {info.num_classes} classes" if fixed
                 else f"{per_class!r}, up to the {drawn:,} training samples,")
        problems.append(f"methods.{method}.samples_per_class: {count} × {width} features of model {model!r} on "
                        f"dataset {dataset!r} (suite {suite!r}) is {drawn * width:,} numbers to resample a round, "
                        f"above the bound of {MAX_ARRAY_NUMBERS:,} for one array; use a number of at most "
                        f"{MAX_ARRAY_NUMBERS // (width * info.num_classes):,} per class")
    return problems


def _size_problems(raw: dict, used: dict[tuple[str, str], list[str]]) -> list[str]:
    """What the download or partition job would refuse, found now from sizes known in advance.

    Each (dataset, partition) pair a suite uses goes through the partition job's own rules
    (fedskew.data.partitions.check_feasible), where the training-set size is known before
    download (fedskew.data.sizes). The others are checked by the partition job.
    """
    from fedskew.data import sizes
    from fedskew.data.partitions import SCHEME_DEFAULTS, PartitionError, check_feasible

    problems, unsplittable = [], set()
    for name, spec in raw["datasets"].items():
        if spec["source"] == "synthetic":  # generated as one array, here too (sizes.class_counts)
            spec = {**catalog.dataset_defaults("synthetic"), **spec}
            samples = sizes.train_size(spec)
            if samples * spec["dim"] > MAX_ARRAY_NUMBERS:
                problems.append(f"datasets.{name}: {spec['clients']} clients generate {samples:,} training samples "
                                f"of dim {spec['dim']}, {samples * spec['dim']:,} numbers, above the bound of "
                                f"{MAX_ARRAY_NUMBERS:,} for one array; use fewer clients or a smaller dim")
                unsplittable.add(name)
        if spec["source"] == "digits":
            fraction = spec.get("test_fraction", catalog.dataset_defaults("digits")["test_fraction"])
            n_train, n_test = sizes.digits_split_sizes(fraction)
            if min(n_train, n_test) < 10:  # scikit-learn's stratified split needs one image per class in each
                problems.append(f"datasets.{name}.test_fraction: {fraction} leaves {n_train} training and {n_test} "
                                "test images of the 1797; each needs at least 10 (one per class); use a value "
                                "between 0.006 and 0.994")
                unsplittable.add(name)
    for (dataset, partition), settings in used.items():
        spec = {**catalog.dataset_defaults(raw["datasets"][dataset]["source"]), **raw["datasets"][dataset]}
        scheme = raw["partitions"][partition]["scheme"]
        n = sizes.train_size(spec)
        if n is None or scheme == "natural" or dataset in unsplittable:  # natural: no parameters, fit checked above
            continue
        params = {k: v for k, v in {**SCHEME_DEFAULTS.get(scheme, {}), **raw["partitions"][partition]}.items()
                  if k != "scheme"}
        num_classes = dataset_info(spec).num_classes
        try:
            check_feasible(scheme, params, n, num_classes, sizes.class_counts(spec), dataset)
        except PartitionError as error:
            problems.append(f"partitions.{partition} cannot split datasets.{dataset} ({n} training samples, "
                            f"{num_classes} classes), used by {', '.join(settings)}: {error}")
    return problems
