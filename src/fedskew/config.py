"""params.yaml: load, validate, and resolve into one configuration per run.

Validation happens once, early, and the same way for the workflow and the CLI: every float of the file must be
finite, then the JSON schema in workflow/schemas/ (types, ranges with a maximum for every integer, known names,
known hyperparameters, no item listed twice: fedskew.config_schema), then the checks that relate keys to each
other (fedskew.config_checks): among them whether each partition can split each dataset a suite uses it on,
wherever the dataset's size is known in advance (fedskew.data.sizes), whether the arrays a setting makes fedskew
allocate fit (MAX_ARRAY_NUMBERS), and whether an option is left without effect by another
(a method's `switches`). Every problem is reported with the key, the bad value and what is allowed,
all at once. A run's training settings are typed in fedskew.training_config, which holds their defaults.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from fedskew import catalog, discovery, params_cache, plugins, user_files
from fedskew.config_checks import cross_section_problems, grid_size_problems
from fedskew.config_errors import ConfigError
from fedskew.config_schema import read_params_file, schema_problems
from fedskew.experiments import experiment_sources, locate
from fedskew.experiments import merge as merge_experiments
from fedskew.numerics import cpu_pin
from fedskew.training_config import EXECUTION_SETTINGS, LATER_TRAINING_OPTIONS, TrainingConfig, resolve_training

# Method options added after results were published, with the behaviour those results had.
# A run's id includes such an option only when it is set to something else (training settings: LATER_TRAINING_OPTIONS).
LATER_OPTIONS = {"missing_classes": "mask", "logit_form": "paper", "features_from": "local"}


@dataclass(frozen=True)
class RunConfig:
    """One grid point with one seed, every default filled in. Its hash is the run id.

    `training` is the training section as the run records it (config.yaml, MLflow's params, the run id): the
    defaults of TRAINING_DEFAULTS filled in, the other settings only where params.yaml writes them. `train` is
    the same settings typed, every default filled in (fedskew.training_config.TrainingConfig): read once, when
    the configuration is made, so a key it does not know fails here, before any job trains.
    """

    suite: str
    dataset: str
    dataset_spec: dict
    partition: str
    partition_spec: dict
    method: str
    method_spec: dict
    seed: int
    training: dict
    train: TrainingConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "train", TrainingConfig.from_record(self.training, f"training.{self.suite}"))

    def to_dict(self) -> dict:
        """The resolved configuration, as config.yaml and MLflow's params record it: with the numerics versions of
        the pieces that compute it where one is not 1 (a run of version-1 pieces records none, as before versions),
        and, for each piece of an installed plugin, its distribution, version, entry point and code identity (a run
        of built-in pieces records none)."""
        versions, plugin_pieces = self.numerics_versions, self.plugins
        return {
            "suite": self.suite, "dataset": self.dataset, "dataset_spec": self.dataset_spec,
            "partition": self.partition, "partition_spec": self.partition_spec,
            "method": self.method, "method_spec": self.method_spec,
            "seed": self.seed, "training": self.training,
            **({"numerics_versions": versions} if versions else {}),
            **({"plugins": plugin_pieces} if plugin_pieces else {}),
        }

    @property
    def numerics_versions(self) -> dict[str, int]:
        """The versions other than 1 of the engine, method, model, dataset source and partition scheme that compute
        this run, read from their source files (fedskew.discovery): empty while all are at 1."""
        return run_versions(self.method_spec.get("algorithm"), self.train.model,
                            self.dataset_spec.get("source"), self.partition_spec.get("scheme"))

    @property
    def plugins(self) -> dict[str, dict[str, str]]:
        """{piece: what the run records of it} for the pieces of installed plugins that compute this run
        (fedskew.plugins.record): empty for a run of built-in pieces."""
        return run_plugins(self.method_spec.get("algorithm"), self.train.model, self.dataset_spec.get("source"),
                           self.partition_spec.get("scheme"))

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
        so that raising a piece's version retrains exactly its runs; and the code identity of each piece of an
        installed plugin (`plugins`: fedskew.plugin_code), so that editing a plugin's code retrains exactly the
        runs it computes, its distribution's version left out (a release that changes no code retrains nothing).
        Added (`identity`): the version of the portable CPU kernels' recipe for the run's model
        (fedskew.numerics.cpu_pin.kernel_recipe), so that a run computed under an older recipe is retrained;
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
    if "plugins" in config:  # a plugin piece's code, not its distribution's version: what moves its numbers
        content["plugins"] = {piece: record.get("code") if isinstance(record, dict) else record
                              for piece, record in config["plugins"].items()}
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
                "method": _class_version("method", algorithm),
                "model": _model_version(model),
                "source": _class_version("source", source),
                "scheme": _class_version("scheme", scheme)}
    return {piece: version for piece, version in versions.items() if version != 1}


# The plugin kind (fedskew.plugins.GROUPS) of each kind of versioned class (fedskew.discovery.VERSIONED_PACKAGES).
_PLUGIN_KINDS = {"method": "method", "source": "dataset", "scheme": "partition"}


def _class_version(kind: str, name: str | None) -> int:
    """A method's, dataset source's or partition scheme's numerics version: a built-in one's as its source file
    sets it (read without importing it), a plugin's as its class does."""
    built_in = discovery.declared_versions(kind)
    if name is None or name in built_in:
        return built_in.get(name, 1)
    plugin = plugins.loaded(_PLUGIN_KINDS[kind]).get(name)
    return plugin.obj.version if plugin is not None else 1


def run_plugins(algorithm: str | None, model: str | None, source: str | None,
                scheme: str | None) -> dict[str, dict[str, str]]:
    """{piece: its record (fedskew.plugins.record)} of the method, model, source and scheme of a run that installed
    plugins declare, read without importing them; a built-in piece has none."""
    built_in = {"method": discovery.declared_versions("method"),
                "model": discovery.module_constant("fedskew.models", "VERSIONS"),
                "source": discovery.declared_versions("source"), "scheme": discovery.declared_versions("scheme")}
    named = {"method": algorithm, "model": model, "source": source, "scheme": scheme}
    out = {}
    for piece, name in named.items():
        if name is not None and name not in built_in[piece]:
            record = plugins.record(_PLUGIN_KINDS.get(piece, piece), name)
            if record is not None:
                out[piece] = record
    return out


def _model_version(model: str | None) -> int:
    """A model's numerics version: a built-in one's as fedskew.models.VERSIONS sets it (read without importing it),
    a plugin's as its declaration (fedskew.catalog.Model) does."""
    built_in = discovery.module_constant("fedskew.models", "VERSIONS")
    if model is None or model in built_in:
        return built_in.get(model, 1)
    return catalog.models().get(model, {}).get("version", 1)


class Params:
    """A validated params.yaml, with the experiments merged in (fedskew.experiments)."""

    def __init__(self, raw: dict, origins: dict[tuple[str, str], str] | None = None,
                 inherits: dict[str, str] | None = None):
        self.raw = raw
        # (section, name) -> the experiment file that defines it; a name not here is params.yaml's
        self.origins = dict(origins or {})
        self.inherits = dict(inherits or {})  # training block -> the block it inherits (`inherit:`)

    def training_blocks(self, suite: str) -> list[str]:
        """The training blocks a suite's settings come from: its own, then each it inherits from."""
        blocks = [suite]
        while blocks[-1] in self.inherits:
            blocks.append(self.inherits[blocks[-1]])
        return blocks

    @property
    def experiment_suites(self) -> list[str]:
        return [name for section, name in self.origins if section == "suites"]

    @property
    def run_suites(self) -> list[str]:
        """What `make run` (`fedskew run` without --suite) builds and proves: run.suites of params.yaml."""
        return list(self.raw["run"]["suites"])

    @property
    def default_suites(self) -> list[str]:
        """What `snakemake --cores all` and DVC's stages build: run.suites, then every suite of the experiments
        (their stages in experiments/dvc.yaml, fedskew.dvcstages)."""
        return list(dict.fromkeys([*self.run_suites, *self.experiment_suites]))

    def compared(self, suite: str) -> bool:
        """Whether the suite's methods are compared against a baseline (`fedskew compare`, built beside its
        tables): it runs two methods or more."""
        return len(self.raw["suites"][suite]["methods"]) >= 2

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
        return {**catalog.dataset_defaults(spec["source"]), **spec}

    def partition_spec(self, partition: str) -> dict:
        from fedskew.data.partitions import (
            SCHEME_DEFAULTS,  # each scheme's file holds its defaults
        )

        spec = self.raw["partitions"][partition]
        return {**SCHEME_DEFAULTS.get(spec["scheme"], {}), **spec}

    def method_spec(self, method: str) -> dict:
        spec = self.raw["methods"].get(method, {"algorithm": method})
        return {"algorithm": spec["algorithm"], **catalog.defaults(spec["algorithm"]),
                **{k: v for k, v in spec.items() if k != "algorithm"}}

    def training(self, suite: str, dataset: str) -> dict:
        """The training section of a suite's runs on `dataset`, as they record it (RunConfig.training)."""
        return resolve_training(self.raw["training"].get(suite, {}), dataset)

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


_BESIDE = Path("experiments")  # load_params' default: the experiments/ folder beside the params file


def load_params(source: Path | str | dict = "params.yaml", experiments: Path | None = _BESIDE) -> Params:
    """Read and validate params.yaml (or an already-parsed dict) with the experiment files of `experiments`
    merged in (fedskew.experiments); raise ConfigError listing every problem, each in a name an experiment
    defines prefixed with its file.

    `experiments` defaults to the experiments/ folder beside the params file (none for a dict); None reads
    params.yaml alone (the shipped file's own tests). Every file is read strictly (fedskew.user_files). A file's
    configuration that passed validation is kept beside it (fedskew.params_cache): read again, with the same
    bytes in every file, the same code and the same plugins, it is not validated again."""
    if isinstance(source, dict):
        folder = None if experiments is _BESIDE else experiments
        return _validated(source, "params", experiment_sources(folder))
    path = Path(source)
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: no such file; run from the project root or pass --params")
    folder = path.parent / "experiments" if experiments is _BESIDE else experiments
    data = user_files.read(path, path.parent, str(path))
    sources = experiment_sources(folder)
    wanted = params_cache.key((path.name, data), sources)
    if (kept := params_cache.read(path, wanted)) is not None:
        return Params(*kept)
    document = user_files.parse(data, str(path))
    params = _validated(document.data, str(path), sources, document.lines)
    params_cache.write(path, wanted, params.raw, params.origins, params.inherits)
    return params


def _validated(raw: Any, label: str, sources: list[tuple[str, bytes]], lines: dict[tuple, int] | None = None) -> Params:
    """A parsed params file (`label`, its key paths on `lines` where known) with the experiments of `sources`
    merged in, validated: each problem names the file, the line and the key (fedskew.experiments.locate)."""
    # The grids' sizes come first, counted from their lists' lengths: params.yaml's own before merging copies its
    # lists, then with the experiments' suites, before the schema walks every item. The cross-section checks read
    # the sections as the schema promises them, so they run only once it passes.
    problems = grid_size_problems(raw)
    if not problems:
        merged = merge_experiments(raw, label, sources, lines)
        problems = locate(merged, grid_size_problems(merged.raw) or schema_problems(merged.raw)
                          or cross_section_problems(merged.raw))
    if problems:
        raise ConfigError(f"{label} is invalid ({len(problems)} problem(s)):\n  - " + "\n  - ".join(problems))
    return Params(merged.raw, merged.origins, merged.inherits)


def run_config_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump({"run_id": cfg.run_id, **cfg.to_dict()}, sort_keys=False)


# ConfigError (fedskew.config_errors) and read_params_file (fedskew.config_schema) are part of what reading
# params.yaml offers: the workflow and the commands import them from here.
__all__ = ["LATER_OPTIONS", "ConfigError", "Params", "RunConfig", "hash_identity", "identity", "load_params",
           "read_params_file", "run_config_yaml", "run_plugins", "run_versions"]
