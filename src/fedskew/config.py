"""params.yaml: load, validate, and resolve into one configuration per run.

Validation happens once, early, and the same way for the workflow and the CLI: every
float of the file must be finite (YAML's .nan and .inf are floats, which JSON Schema's range
checks let through), then the JSON schema in workflow/schemas/ (types, ranges with a maximum
for every integer, known names, known hyperparameters, no item listed twice), then the
checks that relate keys to each other: among them whether each partition can split each
dataset a suite uses it on, wherever the dataset's size is known in advance
(fedskew.data.sizes), whether the arrays a setting makes fedskew allocate fit
(MAX_ARRAY_NUMBERS), and whether an option is left without effect by another
(fedskew.catalog.SWITCHED_OPTIONS). Every problem is reported with the key, the bad value
and what is allowed, all at once.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import yaml

from fedskew import discovery, paths
from fedskew.catalog import (
    DATASET_DEFAULTS,
    HYPERPARAMETERS,
    SGD_ONLY_ALGORITHMS,
    SPLIT_ALGORITHMS,
    SPLIT_POINTS,
    SWITCHED_OPTIONS,
    dataset_info,
    feature_dim,
    incompatibility,
)
from fedskew.numerics import cpu_pin

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = PROJECT_ROOT / "workflow" / "schemas" / "params.schema.yaml"

TRAINING_DEFAULTS: dict[str, Any] = {
    "model": "mlp",
    "rounds": 50,
    "participation": 1.0,
    "local_epochs": 1,
    "batch_size": 32,
    "lr": 0.05,
    "momentum": 0.0,
    "weight_decay": 0.0,
    "eval_every": 1,
    "checkpoint_every": 10,
    "threads": 1,
    "device": "cpu",
    "on_divergence": "fail",
}
# Training settings that do not change what a converging run computes: left out of run ids.
EXECUTION_SETTINGS = ("threads", "on_divergence")
# Method options added after results were published, with the behaviour those results had.
# A run's id includes such an option only when it is set to something else.
LATER_OPTIONS = {"missing_classes": "mask", "logit_form": "paper", "features_from": "local"}
# The same for training settings: `execution` (vectorised clients), `precision` and `optimizer` came after
# the published runs.
LATER_TRAINING_OPTIONS = {"execution": "sequential", "precision": "fp32", "optimizer": "sgd"}
# The most numbers one array that settings size may hold, 16 GiB as float64: FL-FCR's resampled features,
# Synthetic's generated data. Far above what the papers' protocols need (FL-FCR's balanced resampling of
# TinyImageNet through MobileNetV2's 1280 features is 1.3e8 numbers); past it a run needs tens of GiB in one
# step (FL-FCR also keeps a float32 copy for the retraining, Synthetic its float64 parts before joining them).
MAX_ARRAY_NUMBERS = 2 ** 31


class ConfigError(ValueError):
    """params.yaml is invalid; the message lists every problem found."""


def suggestion(name: object, choices) -> str:
    """" (did you mean 'fedprox'?)" for a misspelt name, or "" when no defined name is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _where(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(error, root_schema: dict) -> str:
    """One line per schema violation: key, bad value, what is allowed."""
    where, value, schema, kind = _where(error.absolute_path), error.instance, error.schema, error.validator
    if kind == "type":
        return f"{where}: {_short(value)} has the wrong type; expected {error.validator_value}"
    if kind in ("enum", "const"):
        allowed = error.validator_value if kind == "enum" else [error.validator_value]
        return (f"{where}: {_short(value)} is not allowed{suggestion(value, allowed)}; "
                f"allowed: {', '.join(map(str, allowed))}")
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[kind]
        return f"{where}: {_short(value)} is out of range; must be {op} {error.validator_value}"
    if kind in ("additionalProperties", "unevaluatedProperties"):
        allowed = set(schema.get("properties", {}))
        if "$ref" in schema:  # training sections: the fields live in a referenced definition
            allowed |= set(root_schema["$defs"][schema["$ref"].split("/")[-1]].get("properties", {}))
        extra = ", ".join(re.findall(r"'([^']+)'", error.message.split("(")[-1]))
        return f"{where}: unknown key(s) {extra}; allowed: {', '.join(sorted(allowed)) or 'none'}"
    if kind == "required":
        return f"{where}: {error.message}"
    if kind == "pattern":
        return f"{where}: {_short(value)} is not a valid name; use letters, digits, '_', '.', '-'"
    if kind in ("minItems", "minProperties"):
        return f"{where}: must not be empty"
    if kind == "uniqueItems":
        return f"{where}: {_twice(value) or _short(value) + ' has duplicates'}; keep one"
    return f"{where}: {error.message}"


def _twice(items: list) -> str:
    """The items of a list that repeat an earlier one, with both positions: "'fedavg' is listed twice (items 0, 2)"."""
    first: dict[str, int] = {}
    repeats = []
    for i, item in enumerate(items):
        key = json.dumps(item, sort_keys=True, default=str)
        if key in first:
            repeats.append(f"{_short(item)} is listed twice (items {first[key]}, {i})")
        else:
            first[key] = i
    return "; ".join(repeats)


def _non_finite(node: Any, path: tuple = ()) -> list[tuple[str, float]]:
    """(key path, value) of every float in a parsed document that is NaN or ±inf."""
    if isinstance(node, float):
        return [] if math.isfinite(node) else [(_where(path), node)]
    if isinstance(node, dict):
        return [found for key, value in node.items() for found in _non_finite(value, (*path, key))]
    if isinstance(node, list):
        return [found for i, value in enumerate(node) for found in _non_finite(value, (*path, i))]
    return []


def _yaml_spelling(value: float) -> str:
    """NaN and ±inf as params.yaml writes them."""
    return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"


# libyaml's parser where PyYAML has it: every training job reads params.yaml, and the pure-Python
# parser takes about 0.25 s of a job's fixed cost for it.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):
    """YAML loading that refuses a key written twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden below it
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(f"key {key!r} is written twice in one mapping, on lines {seen[key]} and "
                                      f"{line}; keep one of them")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_params_file(path: Path) -> Any:
    """Parse params.yaml, refusing duplicate keys (naming both lines) and reporting YAML errors."""
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


@cache
def params_schema() -> dict:
    """The schema of params.yaml (workflow/schemas/params.schema.yaml) with the dataset sources of fedskew.catalog.

    A source is one module of fedskew.data.datasets plus its catalog entry, so the schema file does not list
    the sources: `source` takes exactly the catalog's names, and a source the file gives no options clause
    checks its options by the names of its catalog defaults (the file's clauses add types and ranges).
    Parsed once per process (about 0.1 s; tests validate hundreds of files).
    """
    schema = yaml.load(SCHEMA_PATH.read_text(), Loader=_SafeLoader)
    dataset = schema["$defs"]["dataset"]
    dataset["properties"]["source"] = {"enum": list(DATASET_DEFAULTS)}
    covered: set[str] = set()
    for clause in dataset["allOf"]:
        condition = clause["if"]["properties"]["source"]
        covered |= {condition["const"]} if "const" in condition else set(condition["enum"])
    for source in [name for name in DATASET_DEFAULTS if name not in covered]:
        dataset["allOf"].append({"if": {"properties": {"source": {"const": source}}},
                                 "then": {"additionalProperties": False,
                                          "properties": {"source": True, **dict.fromkeys(DATASET_DEFAULTS[source], True)}}})
    return schema


@cache
def _schema_validator():
    import jsonschema

    schema = params_schema()
    # JSON Schema counts 10.0 as an integer; training would then crash on range(10.0). Here an
    # integer must be written as one.
    strict_types = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=strict_types)(schema)


def _schema_errors(raw: Any) -> list[str]:
    validator = _schema_validator()
    schema = validator.schema
    messages = []
    for error in validator.iter_errors(raw):
        # if/then branches report through their leaf errors; skip the wrapper messages.
        leaves = [e for e in (error.context or [])] or [error]
        messages.extend(_describe(e, schema) for e in leaves)
    return sorted(set(messages))


@dataclass(frozen=True)
class RunConfig:
    """One grid point with one seed, every default filled in. Its hash is the run id."""

    suite: str
    dataset: str
    dataset_spec: dict
    partition: str
    partition_spec: dict
    method: str
    method_spec: dict
    seed: int
    training: dict

    def to_dict(self) -> dict:
        """The resolved configuration, as config.yaml and MLflow's params record it: with the numerics versions of
        the pieces that compute it where one is not 1 (a run of version-1 pieces records none, as before versions)."""
        versions = self.numerics_versions
        return {
            "suite": self.suite, "dataset": self.dataset, "dataset_spec": self.dataset_spec,
            "partition": self.partition, "partition_spec": self.partition_spec,
            "method": self.method, "method_spec": self.method_spec,
            "seed": self.seed, "training": self.training,
            **({"numerics_versions": versions} if versions else {}),
        }

    @property
    def numerics_versions(self) -> dict[str, int]:
        """The versions other than 1 of the engine, method, model, dataset source and partition scheme that compute
        this run, read from their source files (fedskew.discovery): empty while all are at 1."""
        return run_versions(self.method_spec.get("algorithm"), self.training.get("model"),
                            self.dataset_spec.get("source"), self.partition_spec.get("scheme"))

    @cached_property
    def run_id(self) -> str:
        """sha256 of everything that determines the run's results.

        Left out: options added after runs were published (LATER_OPTIONS, LATER_TRAINING_OPTIONS) while they hold
        the value those runs used, so that adding an option does not orphan existing runs;
        the suite name (two suites sharing a run share its id) and the
        EXECUTION_SETTINGS: `training.threads`, which a cluster profile may override (the
        count actually used is recorded with the run in MLflow), and
        `training.on_divergence`, which only decides how a diverged run is reported.
        In it: the numerics versions of the pieces that compute the run (engine, method, model, dataset source,
        partition scheme: `numerics_versions`, part of to_dict, read from their source files) where one is not 1,
        so that raising a piece's version retrains exactly its runs. Added (`identity`): the version of the portable
        CPU kernels' recipe for the run's model (fedskew.numerics.cpu_pin.kernel_recipe), so that a run computed
        under an older recipe is retrained;
        and `FEDSKEW_CPU_KERNELS=native` where it turns the pin off (x86-64: cpu_pin.kernels_in_run_id), since
        the CPU's own kernels give other numbers, so that a native run never takes a portable run's place. Ids
        under the portable kernels (the default) are those they always were. A FEDSKEW_CPU_KERNELS that
        fedskew does not know is a ConfigError.
        """
        return hash_identity(identity(self.to_dict()))

    @property
    def keys(self) -> dict[str, Any]:
        return {"suite": self.suite, "dataset": self.dataset, "partition": self.partition,
                "method": self.method, "seed": self.seed}

    def path(self, template: str) -> Path:
        return Path(template.format(**self.keys))


def identity(config: dict) -> dict:
    """What a run id hashes (RunConfig.run_id): a resolved configuration as RunConfig.to_dict gives it (or as a
    run's config.yaml records it), without what does not change its numbers, with what the code and the machine
    add: the kernel recipe of its model and the kernel choice, as they are now."""
    content = {k: v for k, v in config.items() if k not in ("suite", "run_id")}
    content["training"] = {k: v for k, v in config["training"].items()
                           if k not in EXECUTION_SETTINGS and LATER_TRAINING_OPTIONS.get(k, object()) != v}
    content["method_spec"] = {k: v for k, v in config["method_spec"].items() if LATER_OPTIONS.get(k, object()) != v}
    recipe = cpu_pin.kernel_recipe(config["training"]["model"])
    if recipe != 1:  # runs published before recipes had versions were computed under recipe 1
        content["cpu_kernel_recipe"] = recipe
    try:
        kernels = cpu_pin.kernels_in_run_id()
    except cpu_pin.CpuPinError as error:
        raise ConfigError(str(error)) from None
    if kernels is not None:
        content["cpu_kernels"] = kernels
    return content


def hash_identity(content: dict) -> str:
    """The run id of an identity: the first 16 hex digits of the sha256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def run_versions(algorithm: str | None, model: str | None, source: str | None, scheme: str | None) -> dict[str, int]:
    """{piece: version} of the pieces that compute a run (engine, method, model, source, scheme), where the version
    is not 1: each as its own source file sets it (fedskew.engine.VERSION, fedskew.models.VERSIONS, a method's,
    source's or scheme's class attribute `version`), read without importing torch."""
    versions = {"engine": discovery.module_constant("fedskew.engine", "VERSION"),
                "method": discovery.declared_versions("method").get(algorithm, 1),
                "model": discovery.module_constant("fedskew.models", "VERSIONS").get(model, 1),
                "source": discovery.declared_versions("source").get(source, 1),
                "scheme": discovery.declared_versions("scheme").get(scheme, 1)}
    return {piece: version for piece, version in versions.items() if version != 1}


class Params:
    """A validated params.yaml."""

    def __init__(self, raw: dict):
        self.raw = raw

    @property
    def default_suites(self) -> list[str]:
        return list(self.raw["run"]["suites"])

    def suite_runs(self, suite: str) -> list[RunConfig]:
        """`runs([suite])`, computed once per suite (the reproduction looks suites up per cell)."""
        cache = self.__dict__.setdefault("_suite_runs", {})
        if suite not in cache:
            cache[suite] = self.runs([suite])
        return cache[suite]

    @property
    def reproduce_suites(self) -> list[str]:
        """The suites trained for the papers' tables and the claims ledger (`reproduce.suites`)."""
        return list(self.raw.get("reproduce", {}).get("suites", []))

    @property
    def imported_suites(self) -> list[str]:
        """Suites trained elsewhere whose finished runs the reproduction imports from committed archives
        (`reproduce.imported`, `results/imported/<suite>/`): their cells read the runs there are."""
        return list(self.raw.get("reproduce", {}).get("imported", []))

    def dataset_spec(self, dataset: str) -> dict:
        spec = self.raw["datasets"][dataset]
        return {**DATASET_DEFAULTS[spec["source"]], **spec}

    def partition_spec(self, partition: str) -> dict:
        from fedskew.data.partitions import (
            SCHEME_DEFAULTS,  # each scheme's file holds its defaults
        )

        spec = self.raw["partitions"][partition]
        return {**SCHEME_DEFAULTS.get(spec["scheme"], {}), **spec}

    def method_spec(self, method: str) -> dict:
        spec = self.raw["methods"].get(method, {"algorithm": method})
        return {"algorithm": spec["algorithm"], **HYPERPARAMETERS[spec["algorithm"]],
                **{k: v for k, v in spec.items() if k != "algorithm"}}

    def training(self, suite: str, dataset: str) -> dict:
        section = copy.deepcopy(self.raw["training"].get(suite, {}))
        overrides = section.pop("overrides", {}).get(dataset, {})
        return {**TRAINING_DEFAULTS, **section, **overrides}

    def runs(self, suites: list[str] | None = None) -> list[RunConfig]:
        out = []
        for suite in suites or self.default_suites:
            body = self.raw["suites"][suite]
            for setting in body["settings"]:
                for partition in setting["partitions"]:
                    for method in body["methods"]:
                        for seed in body["seeds"]:
                            out.append(self._run_config(suite, setting["dataset"], partition, method, seed))
        return out

    def run(self, suite: str, dataset: str, partition: str, method: str, seed: int) -> RunConfig:
        body = self.raw["suites"][suite]
        if (any(s["dataset"] == dataset and partition in s["partitions"] for s in body["settings"])
                and method in body["methods"] and seed in body["seeds"]):
            return self._run_config(suite, dataset, partition, method, seed)
        raise ConfigError(f"suite {suite!r} has no run dataset={dataset} partition={partition} "
                          f"method={method} seed={seed}; check suites.{suite} in params.yaml")

    def _run_config(self, suite: str, dataset: str, partition: str, method: str, seed: int) -> RunConfig:
        return RunConfig(suite=suite, dataset=dataset, dataset_spec=self.dataset_spec(dataset),
                         partition=partition, partition_spec=self.partition_spec(partition),
                         method=method, method_spec=self.method_spec(method), seed=seed,
                         training=self.training(suite, dataset))

    def partitions_needed(self, suites: list[str] | None = None) -> set[tuple[str, str, int]]:
        return {(c.dataset, c.partition, c.seed) for c in self.runs(suites)}


def _cross_checks(raw: dict) -> list[str]:
    """Checks the schema cannot express: references between sections, model/dataset fit, partition feasibility.

    Without torch: the facts about datasets, models and algorithms come from fedskew.catalog.
    """
    problems = []
    used: dict[tuple[str, str], list[str]] = {}  # (dataset, partition) -> the settings using it
    for i, suite in enumerate(raw["run"]["suites"]):
        if suite not in raw["suites"]:
            problems.append(f"run.suites[{i}]: {suite!r} is not a suite{suggestion(suite, raw['suites'])}; "
                            f"defined: {', '.join(raw['suites'])}")
    for i, suite in enumerate(raw.get("reproduce", {}).get("suites", [])):
        if suite not in raw["suites"]:
            problems.append(f"reproduce.suites[{i}]: {suite!r} is not a suite{suggestion(suite, raw['suites'])}; "
                            f"defined: {', '.join(raw['suites'])}")
    trained_here = set(raw.get("reproduce", {}).get("suites", []))
    for i, suite in enumerate(raw.get("reproduce", {}).get("imported", [])):
        if suite not in raw["suites"]:
            problems.append(f"reproduce.imported[{i}]: {suite!r} is not a suite{suggestion(suite, raw['suites'])}; "
                            f"defined: {', '.join(raw['suites'])}")
        elif suite in trained_here:
            problems.append(f"reproduce.imported[{i}]: {suite!r} is also in reproduce.suites; a suite is either "
                            "trained by the reproduction or imported from its archives: remove it from one list")
    for name in raw["training"]:
        if name not in raw["suites"]:
            problems.append(f"training.{name}: no suite named {name!r}{suggestion(name, raw['suites'])}; "
                            f"defined: {', '.join(raw['suites'])}")
    for name, suite in raw["suites"].items():
        training = raw["training"].get(name, {})
        for key in training.get("overrides", {}):
            if key not in [s["dataset"] for s in suite["settings"]]:
                problems.append(f"training.{name}.overrides.{key}: suite {name!r} uses no dataset {key!r}")
        for i, method in enumerate(suite["methods"]):
            if method not in raw["methods"] and method not in HYPERPARAMETERS:
                hint = suggestion(method, [*raw["methods"], *HYPERPARAMETERS])
                problems.append(f"suites.{name}.methods[{i}]: {method!r} is neither a method defined under "
                                f"`methods` nor an algorithm{hint}; methods: {', '.join(raw['methods']) or 'none'}; "
                                f"algorithms: {', '.join(HYPERPARAMETERS)}")
        first_setting: dict[tuple[str, str], int] = {}
        for j, setting in enumerate(suite["settings"]):
            where = f"suites.{name}.settings[{j}]"
            dataset = setting["dataset"]
            if dataset not in raw["datasets"]:
                problems.append(f"{where}.dataset: {dataset!r} is not defined under `datasets`"
                                f"{suggestion(dataset, raw['datasets'])}; "
                                f"defined: {', '.join(raw['datasets'])}")
                continue
            spec = {**DATASET_DEFAULTS[raw["datasets"][dataset]["source"]], **raw["datasets"][dataset]}
            info = dataset_info(spec)
            for k, partition in enumerate(setting["partitions"]):
                if partition not in raw["partitions"]:
                    problems.append(f"{where}.partitions[{k}]: {partition!r} is not defined under `partitions`"
                                    f"{suggestion(partition, raw['partitions'])}; "
                                    f"defined: {', '.join(raw['partitions'])}")
                elif raw["partitions"][partition]["scheme"] == "natural" and not info.has_natural_partition:
                    problems.append(f"{where}.partitions[{k}]: {partition!r} uses scheme 'natural', but dataset "
                                    f"{dataset!r} ({spec['source']}) has no natural clients; use iid/dirichlet/...")
                elif (dataset, partition) in first_setting:  # the same runs twice, under one path
                    problems.append(f"{where}.partitions[{k}]: partition {partition!r} of dataset {dataset!r} is "
                                    f"listed twice in suite {name!r} (also in "
                                    f"settings[{first_setting[dataset, partition]}]); keep one")
                else:
                    first_setting[dataset, partition] = j
                    used.setdefault((dataset, partition), []).append(where)
            section = copy.deepcopy(training)
            written = {**section, **section.get("overrides", {}).get(dataset, {})}
            resolved = {**TRAINING_DEFAULTS, **written}
            model = resolved["model"]
            problem = incompatibility(model, info)
            if problem:
                problems.append(f"training.{name}: model {model!r} on dataset {dataset!r}: {problem}")
            elif resolved.get("augmentation", "none") != "none" and not info.is_image:
                problems.append(f"training.{name}: augmentation {resolved['augmentation']!r} on dataset {dataset!r}: "
                                "augmentations transform images, but the dataset gives vectors; use 'none'")
            elif "split_point" in resolved:
                points = SPLIT_POINTS[model]
                if resolved["split_point"] not in points:
                    problems.append(f"training.{name}: split_point {resolved['split_point']!r} is not a split point "
                                    f"of model {model!r}; known: {', '.join(points)}")
            if resolved.get("optimizer") == "adam":
                if resolved["momentum"] != 0:
                    problems.append(f"training.{name}: momentum {resolved['momentum']} is SGD's; Adam's moments use "
                                    "its own betas (0.9, 0.999): set momentum 0, or optimizer sgd")
                for method in suite["methods"]:
                    algorithm = raw.get("methods", {}).get(method, {"algorithm": method})["algorithm"]
                    if algorithm in SGD_ONLY_ALGORITHMS:
                        problems.append(f"training.{name}: optimizer adam, but method {method!r} "
                                        f"{SGD_ONLY_ALGORITHMS[algorithm]}; train it with optimizer sgd")
            for key, what in (("eval_every", "evaluated"), ("checkpoint_every", "checkpointed")):
                # a value written: `rounds: 5` alone keeps checkpoint_every's default 10, and is not refused for it
                if key in written and written[key] > resolved["rounds"]:
                    problems.append(f"training.{name}: {key} {resolved[key]} on dataset {dataset!r} is above rounds "
                                    f"{resolved['rounds']}: only the last round is {what} either way, as {key}: "
                                    f"{resolved['rounds']} says; use at most {resolved['rounds']}")
            if not problem:
                problems += _resampling_problems(raw, name, suite["methods"], dataset, spec, model)
            if resolved.get("precision") == "tf32" and resolved["device"] == "cpu":
                problems.append(f"training.{name}: precision 'tf32' needs an NVIDIA GPU, but device is 'cpu'; use "
                                "fp32 or bf16 on a CPU, or device cuda/auto")
            if resolved.get("local_diagnostics"):
                split = [m for m in suite["methods"]
                         if raw.get("methods", {}).get(m, {"algorithm": m})["algorithm"] in SPLIT_ALGORITHMS]
                if split:
                    problems.append(f"training.{name}.local_diagnostics: suite {name!r} runs split method(s) "
                                    f"{', '.join(split)}, which have no local model of the whole network to "
                                    "diagnose; use a suite of federated methods")
    return problems + _switched_off_problems(raw) + _size_problems(raw, used)


def _switched_off_problems(raw: dict) -> list[str]:
    """Method options another option leaves without effect (fedskew.catalog.SWITCHED_OPTIONS), set to a value
    other than their default: the same computation as the default, under another run id."""
    problems = []
    for name, spec in raw["methods"].items():
        algorithm = spec["algorithm"]
        options = {**HYPERPARAMETERS[algorithm], **spec}
        if algorithm == "flfcr" and options["samples_per_class"] == 0 and options["retrain_epochs"] > 0:
            problems.append(f"methods.{name}.samples_per_class: 0 draws no features, so retrain_epochs "
                            f"{options['retrain_epochs']} retrains nothing; to turn retraining off, write "
                            "retrain_epochs: 0 and leave samples_per_class out")
        for switch, meaning, dependents in SWITCHED_OPTIONS.get(algorithm, ()):
            if options[switch] != 0:
                continue
            for option in dependents:
                if option in spec and spec[option] != HYPERPARAMETERS[algorithm][option]:
                    problems.append(f"methods.{name}.{option}: {_short(spec[option])} has no effect while {switch} "
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
        per_class = method_spec.get("samples_per_class", HYPERPARAMETERS["flfcr"]["samples_per_class"])
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
        if spec["source"] == "synthetic":  # generated as one array, here too (sizes.label_counts)
            spec = {**DATASET_DEFAULTS["synthetic"], **spec}
            samples = sizes.train_size(spec)
            if samples * spec["dim"] > MAX_ARRAY_NUMBERS:
                problems.append(f"datasets.{name}: {spec['clients']} clients generate {samples:,} training samples "
                                f"of dim {spec['dim']}, {samples * spec['dim']:,} numbers, above the bound of "
                                f"{MAX_ARRAY_NUMBERS:,} for one array; use fewer clients or a smaller dim")
                unsplittable.add(name)
        if spec["source"] == "digits":
            fraction = spec.get("test_fraction", DATASET_DEFAULTS["digits"]["test_fraction"])
            n_train, n_test = sizes.digits_split_sizes(fraction)
            if min(n_train, n_test) < 10:  # scikit-learn's stratified split needs one image per class in each
                problems.append(f"datasets.{name}.test_fraction: {fraction} leaves {n_train} training and {n_test} "
                                "test images of the 1797; each needs at least 10 (one per class); use a value "
                                "between 0.006 and 0.994")
                unsplittable.add(name)
    for (dataset, partition), settings in used.items():
        spec = {**DATASET_DEFAULTS[raw["datasets"][dataset]["source"]], **raw["datasets"][dataset]}
        scheme = raw["partitions"][partition]["scheme"]
        n = sizes.train_size(spec)
        if n is None or scheme == "natural" or dataset in unsplittable:  # natural: no parameters, fit checked above
            continue
        params = {k: v for k, v in {**SCHEME_DEFAULTS.get(scheme, {}), **raw["partitions"][partition]}.items()
                  if k != "scheme"}
        num_classes = dataset_info(spec).num_classes
        try:
            check_feasible(scheme, params, n, num_classes, sizes.label_counts(spec), dataset)
        except PartitionError as error:
            problems.append(f"partitions.{partition} cannot split datasets.{dataset} ({n} training samples, "
                            f"{num_classes} classes), used by {', '.join(settings)}: {error}")
    return problems


def load_params(source: Path | str | dict = "params.yaml") -> Params:
    """Read and validate params.yaml (or an already-parsed dict); raise ConfigError listing every problem."""
    if isinstance(source, dict):
        raw, label = source, "params"
    else:
        path = Path(source)
        if not path.exists():
            raise ConfigError(f"{path}: no such file; run from the project root or pass --params")
        raw = read_params_file(path)
        label = str(path)
    non_finite = _non_finite(raw)
    problems = [f"{where}: {_yaml_spelling(value)} is not a finite number; write a finite number"
                for where, value in non_finite]
    # A NaN or ±inf may break a schema range too: it is reported once, as not finite.
    reported = tuple(f"{where}: " for where, _ in non_finite)
    problems += [line for line in _schema_errors(raw) if not line.startswith(reported)]
    if not problems:
        problems = _cross_checks(raw)
    if problems:
        raise ConfigError(f"{label} is invalid ({len(problems)} problem(s)):\n  - " + "\n  - ".join(problems))
    return Params(raw)


def run_config_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump({"run_id": cfg.run_id, **cfg.to_dict()}, sort_keys=False)


__all__ = ["ConfigError", "Params", "RunConfig", "load_params", "paths", "run_config_yaml"]
