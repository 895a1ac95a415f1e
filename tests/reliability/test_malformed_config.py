"""A malformed params.yaml is refused before any work, with the key that is wrong.

Each case mutates the tiny valid params of tests/conftest.py (or, for what only YAML text can
hold, such as a key written twice, edits its text) and expects `python -m fedskew validate` to
exit with 2 and name the key on stderr. Every case runs in-process; a few representative ones
also go through `snakemake -n`, which must refuse them before creating data/ or results/.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import yaml

from fedskew.cli import main
from tests.helpers import TINY_PARAMS, venv_bin


def _set(*path_and_value) -> Callable[[dict], None]:
    """A mutation setting params[k1][k2]...[kn] = value (a list index may appear in the path)."""
    *path, key, value = path_and_value

    def change(params: dict) -> None:
        node = params
        for part in path:
            node = node[part]
        node[key] = value

    return change


def _drop(*path) -> Callable[[dict], None]:
    *path, key = path

    def change(params: dict) -> None:
        node = params
        for part in path:
            node = node[part]
        del node[key]

    return change


def _use_partition(name: str, spec: dict, dataset: str = "digits") -> Callable[[dict], None]:
    """Define partition `name` and make it the only one of the tiny suite's setting (on `dataset`)."""

    def change(params: dict) -> None:
        params["partitions"][name] = spec
        params["suites"]["tiny"]["settings"] = [{"dataset": dataset, "partitions": [name]}]
        if dataset not in params["datasets"]:
            params["datasets"][dataset] = {"source": dataset}

    return change


def _use_method(name: str, spec: dict) -> Callable[[dict], None]:
    """Define method `name` and add it to the tiny suite's methods."""

    def change(params: dict) -> None:
        params["methods"][name] = spec
        params["suites"]["tiny"]["methods"].append(name)

    return change


def _both(*changes) -> Callable[[dict], None]:
    def change(params: dict) -> None:
        for each in changes:
            each(params)

    return change


T = ("training", "tiny")
NAN, INF = float("nan"), float("inf")
DIR = ("partitions", "dir0.5")
SUITE = ("suites", "tiny")

# (description, mutation of the params dict, text that stderr must contain: the key)
MUTATIONS: list[tuple[str, Callable[[dict], None], str]] = [
    # integers written as floats
    ("rounds as a float", _set(*T, "rounds", 4.0), "training.tiny.rounds"),
    ("batch_size as a float", _set(*T, "batch_size", 32.0), "training.tiny.batch_size"),
    ("local_epochs as a float", _set(*T, "local_epochs", 1.0), "training.tiny.local_epochs"),
    ("eval_every as a float", _set(*T, "eval_every", 2.0), "training.tiny.eval_every"),
    ("checkpoint_every as a float", _set(*T, "checkpoint_every", 2.0), "training.tiny.checkpoint_every"),
    ("threads as a float", _set(*T, "threads", 1.0), "training.tiny.threads"),
    ("clients as a float", _set(*DIR, "clients", 4.0), "partitions.dir0.5.clients"),
    ("min_size as a float", _set(*DIR, "min_size", 5.0), "partitions.dir0.5.min_size"),
    ("max_redraws as a float", _set(*DIR, "max_redraws", 10.0), "partitions.dir0.5.max_redraws"),
    ("alpha as a float", _set("partitions", "q2", "alpha", 2.0), "partitions.q2.alpha"),
    ("a seed as a float", _set(*SUITE, "seeds", [0, 1.0]), "suites.tiny.seeds[1]"),
    ("synthetic clients as a float", _set("datasets", "synth", "clients", 12.0), "datasets.synth.clients"),
    ("digits seed as a float", _set("datasets", "digits", "seed", 0.0), "datasets.digits.seed"),
    # strings and booleans for numbers
    ("lr as a string", _set(*T, "lr", "0.05"), "training.tiny.lr"),
    ("rounds as a string", _set(*T, "rounds", "4"), "training.tiny.rounds"),
    ("participation as a word", _set(*T, "participation", "half"), "training.tiny.participation"),
    ("beta as a string", _set(*DIR, "beta", "0.5"), "partitions.dir0.5.beta"),
    ("rounds as a boolean", _set(*T, "rounds", True), "training.tiny.rounds"),
    ("a hyperparameter as a string", _set("methods", "fedprox", "mu", "small"), "methods.fedprox.mu"),
    # zero, negative, out of range
    ("zero rounds", _set(*T, "rounds", 0), "training.tiny.rounds"),
    ("negative batch_size", _set(*T, "batch_size", -32), "training.tiny.batch_size"),
    ("zero local_epochs", _set(*T, "local_epochs", 0), "training.tiny.local_epochs"),
    ("zero eval_every", _set(*T, "eval_every", 0), "training.tiny.eval_every"),
    ("zero threads", _set(*T, "threads", 0), "training.tiny.threads"),
    ("zero clients", _set(*DIR, "clients", 0), "partitions.dir0.5.clients"),
    ("negative seed", _set(*SUITE, "seeds", [-1]), "suites.tiny.seeds[0]"),
    ("lr zero", _set(*T, "lr", 0), "training.tiny.lr"),
    ("lr negative", _set(*T, "lr", -0.1), "training.tiny.lr"),
    ("participation zero", _set(*T, "participation", 0), "training.tiny.participation"),
    ("participation above one", _set(*T, "participation", 1.5), "training.tiny.participation"),
    ("momentum of one", _set(*T, "momentum", 1.0), "training.tiny.momentum"),
    ("negative weight_decay", _set(*T, "weight_decay", -0.1), "training.tiny.weight_decay"),
    ("beta zero", _set(*DIR, "beta", 0), "partitions.dir0.5.beta"),
    ("min_size zero", _set(*DIR, "min_size", 0), "partitions.dir0.5.min_size"),
    ("negative FedProx mu", _set("methods", "fedprox", "mu", -1), "methods.fedprox.mu"),
    ("test_fraction of one", _set("datasets", "digits", "test_fraction", 1.0), "datasets.digits.test_fraction"),
    ("test_fraction leaving no training set", _set("datasets", "digits", "test_fraction", 0.999),
     "datasets.digits.test_fraction"),
    # unknown keys, at every level
    ("unknown top-level key", _set("experiments", {}), "unknown key(s) experiments"),
    ("unknown key under run", _set("run", "parallel", True), "run: unknown key(s) parallel"),
    ("unknown key under reproduce", _set("reproduce", {"suites": ["tiny"], "all": True}),
     "reproduce: unknown key(s) all"),
    ("unknown dataset option", _set("datasets", "digits", "colour", True),
     "datasets.digits: unknown key(s) colour"),
    ("option of another scheme", _set("partitions", "q2", "beta", 0.5), "partitions.q2: unknown key(s) beta"),
    ("unknown hyperparameter", _set("methods", "fedlc", "temperature", 2.0),
     "methods.fedlc: unknown key(s) temperature"),
    ("hyperparameter on FedAvg", _set("methods", "fedavg", "mu", 0.1), "methods.fedavg: unknown key(s) mu"),
    ("unknown suite key", _set(*SUITE, "rounds", 5), "suites.tiny: unknown key(s) rounds"),
    ("unknown setting key", _set(*SUITE, "settings", 0, "clients", 5),
     "suites.tiny.settings[0]: unknown key(s) clients"),
    ("misspelt training key", _set(*T, "learning_rate", 0.1), "training.tiny: unknown key(s) learning_rate"),
    ("unknown key in an override", _set(*T, "overrides", {"digits": {"foo": 1}}),
     "training.tiny.overrides.digits: unknown key(s) foo"),
    # unknown names
    ("unknown algorithm", _set("methods", "fedfoo", {"algorithm": "fedfoo"}), "methods.fedfoo.algorithm"),
    ("unknown dataset source", _set("datasets", "big", {"source": "imagenet22k"}), "datasets.big.source"),
    ("unknown scheme", _set("partitions", "odd", {"scheme": "pathological", "clients": 3}), "partitions.odd.scheme"),
    ("unknown model", _set(*T, "model", "resnet1000"), "training.tiny.model"),
    ("unknown device", _set(*T, "device", "tpu"), "training.tiny.device"),
    ("unknown divergence policy", _set(*T, "on_divergence", "ignore"), "training.tiny.on_divergence"),
    ("unknown augmentation", _set(*T, "augmentation", "mixup"), "training.tiny.augmentation"),
    ("a name with a space", _set("datasets", "my digits", {"source": "digits"}), "'my digits' is not a valid name"),
    # missing or empty required keys
    ("no run section", _drop("run"), "'run' is a required property"),
    ("suite without seeds", _drop(*SUITE, "seeds"), "suites.tiny: 'seeds' is a required property"),
    ("quantity without alpha", _drop("partitions", "q2", "alpha"), "partitions.q2: 'alpha' is a required property"),
    ("Dirichlet without beta", _drop(*DIR, "beta"), "partitions.dir0.5: 'beta' is a required property"),
    ("dataset without source", _drop("datasets", "digits", "source"), "datasets.digits: 'source' is a required"),
    ("method without algorithm", _drop("methods", "fedavg", "algorithm"), "methods.fedavg: 'algorithm' is a required"),
    ("no methods in a suite", _set(*SUITE, "methods", []), "suites.tiny.methods: must not be empty"),
    ("no datasets", _set("datasets", {}), "datasets: must not be empty"),
    ("no suites to run", _set("run", "suites", []), "run.suites: must not be empty"),
    # references between sections
    ("suite names an undefined method", _set(*SUITE, "methods", ["fedavg", "fedxyz"]), "suites.tiny.methods[1]"),
    ("suite names an undefined partition", _set(*SUITE, "settings", 0, "partitions", ["dir9"]),
     "suites.tiny.settings[0].partitions[0]"),
    ("suite names an undefined dataset", _set(*SUITE, "settings", 0, "dataset", "digitz"),
     "suites.tiny.settings[0].dataset"),
    ("run names an unknown suite", _set("run", "suites", ["tiny", "huge"]), "run.suites[1]"),
    ("reproduce names an unknown suite", _set("reproduce", {"suites": ["ghost"]}), "reproduce.suites[0]"),
    ("training for an undefined suite", _set("training", "ghost", {"rounds": 2}), "training.ghost"),
    ("override of a dataset the suite does not use", _set(*T, "overrides", {"synth": {"lr": 0.1}}),
     "training.tiny.overrides.synth"),
    ("natural partition of digits", _set(*SUITE, "settings", 0, "partitions", ["natural"]),
     "suites.tiny.settings[0].partitions[0]"),
    ("CNN on tabular data", _both(_set(*SUITE, "settings", [{"dataset": "synth", "partitions": ["natural"]}]),
                                  _set(*T, "model", "cnn")), "training.tiny: model 'cnn'"),
    ("split point the model lacks", _set(*T, "split_point", "S2"), "training.tiny: split_point 'S2'"),
    # listed twice
    ("suite listed twice in run.suites", _set("run", "suites", ["tiny", "tiny"]),
     "run.suites: 'tiny' is listed twice"),
    ("suite listed twice in reproduce.suites", _set("reproduce", {"suites": ["tiny", "tiny"]}),
     "reproduce.suites: 'tiny' is listed twice"),
    ("method listed twice", _set(*SUITE, "methods", ["fedavg", "fedlc", "fedavg"]),
     "suites.tiny.methods: 'fedavg' is listed twice"),
    ("seed listed twice", _set(*SUITE, "seeds", [0, 1, 0]), "suites.tiny.seeds: 0 is listed twice"),
    ("partition listed twice in a setting", _set(*SUITE, "settings", 0, "partitions", ["q2", "q2"]),
     "suites.tiny.settings[0].partitions: 'q2' is listed twice"),
    ("partition listed again in a second setting",
     _set(*SUITE, "settings", [{"dataset": "digits", "partitions": ["q2"]}] * 2),
     "suites.tiny.settings[1].partitions[0]"),
    # partitions the partition job would refuse: refused before any job
    ("5000 clients on digits", _use_partition("iid5000", {"scheme": "iid", "clients": 5000}),
     "partitions.iid5000 cannot split datasets.digits"),
    ("Dirichlet with 500 clients on digits",
     _use_partition("dir500", {"scheme": "dirichlet", "beta": 0.5, "clients": 500}),
     "partitions.dir500 cannot split datasets.digits"),
    ("quantity alpha 11 with 10 classes", _use_partition("q11", {"scheme": "quantity", "alpha": 11, "clients": 5}),
     "partitions.q11 cannot split datasets.digits"),
    ("min_size 1000", _set(*DIR, "min_size", 1000), "partitions.dir0.5 cannot split datasets.digits"),
    ("more quantity sets than samples", _use_partition("q800", {"scheme": "quantity", "alpha": 2, "clients": 800}),
     "partitions.q800 cannot split datasets.digits"),
    ("more shards than samples",
     _use_partition("s20", {"scheme": "shards", "shards_per_client": 20, "clients": 100}),
     "partitions.s20 cannot split datasets.digits"),
    ("quantity_per_label not dividing the classes",
     _use_partition("qpl", {"scheme": "quantity_per_label", "alpha": 2, "clients": 7}), "partitions.qpl cannot split"),
    ("quantity_per_label alpha above the classes",
     _use_partition("qpl", {"scheme": "quantity_per_label", "alpha": 11, "clients": 10}),
     "partitions.qpl cannot split"),
    ("more clients than MNIST's 60000", _use_partition("iid", {"scheme": "iid", "clients": 60001}, "mnist"),
     "partitions.iid cannot split datasets.mnist"),
    ("quantity alpha 101 on CIFAR-100", _use_partition("q101", {"scheme": "quantity", "alpha": 101, "clients": 20},
                                                        "cifar100"), "partitions.q101 cannot split datasets.cifar100"),
    ("Dirichlet min_size over Synthetic's size", _use_partition(
        "dir", {"scheme": "dirichlet", "beta": 0.5, "clients": 100, "min_size": 1000}, "synth"),
     "partitions.dir cannot split datasets.synth"),
    # NaN and ±inf (YAML's .nan, .inf: floats that range checks let through), wherever they are written
    ("lr NaN", _set(*T, "lr", NAN), "training.tiny.lr: .nan is not a finite number"),
    ("lr inf", _set(*T, "lr", INF), "training.tiny.lr: .inf is not a finite number"),
    ("lr -inf", _set(*T, "lr", -INF), "training.tiny.lr: -.inf is not a finite number"),
    ("lr NaN in an override", _set(*T, "overrides", {"digits": {"lr": NAN}}),
     "training.tiny.overrides.digits.lr: .nan is not a finite number"),
    ("momentum NaN", _set(*T, "momentum", NAN), "training.tiny.momentum: .nan is not a finite number"),
    ("participation inf", _set(*T, "participation", INF), "training.tiny.participation: .inf is not a finite"),
    ("FL-FCR retrain_lr NaN", _set("methods", "flfcr", {"algorithm": "flfcr", "retrain_lr": NAN}),
     "methods.flfcr.retrain_lr: .nan is not a finite number"),
    ("FL-FCR retrain_lr inf", _set("methods", "flfcr", {"algorithm": "flfcr", "retrain_lr": INF}),
     "methods.flfcr.retrain_lr: .inf is not a finite number"),
    ("FL-FCR H NaN", _set("methods", "flfcr", {"algorithm": "flfcr", "H": NAN}),
     "methods.flfcr.H: .nan is not a finite number"),
    ("FL-FCR H inf", _set("methods", "flfcr", {"algorithm": "flfcr", "H": INF}),
     "methods.flfcr.H: .inf is not a finite number"),
    ("FedProx mu NaN", _set("methods", "fedprox", "mu", NAN), "methods.fedprox.mu: .nan is not a finite number"),
    ("Dirichlet beta NaN", _set(*DIR, "beta", NAN), "partitions.dir0.5.beta: .nan is not a finite number"),
    ("Synthetic lam inf", _set("datasets", "synth", "lam", INF), "datasets.synth.lam: .inf is not a finite number"),
    ("test_fraction NaN", _set("datasets", "digits", "test_fraction", NAN),
     "datasets.digits.test_fraction: .nan is not a finite number"),
    ("a seed inf", _set(*SUITE, "seeds", [0, INF]), "suites.tiny.seeds[1]: .inf is not a finite number"),
    ("NaN under an unknown key", _set(*T, "learning_rate", NAN), "training.tiny.learning_rate: .nan is not a finite"),
    # sizes past their bounds (workflow/schemas/params.schema.yaml: every integer has a maximum)
    ("a million rounds", _set(*T, "rounds", 10 ** 6),
     "training.tiny.rounds: 1000000 is out of range; must be <= 100000"),
    ("a batch of a billion", _set(*T, "batch_size", 10 ** 9),
     "training.tiny.batch_size: 1000000000 is out of range; must be <= 131072"),
    ("ten thousand local epochs", _set(*T, "local_epochs", 10 ** 4),
     "training.tiny.local_epochs: 10000 is out of range; must be <= 1000"),
    ("eval_every of a million", _set(*T, "eval_every", 10 ** 6), "training.tiny.eval_every: 1000000 is out of range"),
    ("checkpoint_every of a million", _set(*T, "checkpoint_every", 10 ** 6),
     "training.tiny.checkpoint_every: 1000000 is out of range"),
    ("a hundred thousand threads", _set(*T, "threads", 10 ** 5),
     "training.tiny.threads: 100000 is out of range; must be <= 1024"),
    ("a million clients", _set(*DIR, "clients", 10 ** 6),
     "partitions.dir0.5.clients: 1000000 is out of range; must be <= 131072"),
    ("max_redraws of a billion", _set(*DIR, "max_redraws", 10 ** 9), "partitions.dir0.5.max_redraws: 1000000000"),
    ("a 64-bit seed", _set(*SUITE, "seeds", [2 ** 40]), "suites.tiny.seeds[0]: 1099511627776 is out of range"),
    ("a 64-bit dataset seed", _set("datasets", "digits", "seed", 2 ** 40), "datasets.digits.seed: 1099511627776"),
    ("Synthetic of a million features", _set("datasets", "synth", "dim", 10 ** 6),
     "datasets.synth.dim: 1000000 is out of range; must be <= 10000"),
    ("MOON projection of a billion", _set("methods", "moon", {"algorithm": "moon", "proj_dim": 10 ** 9}),
     "methods.moon.proj_dim: 1000000000 is out of range; must be <= 65536"),
    ("SCALA server batch of a billion", _set("methods", "scala", {"algorithm": "scala", "server_batch": 10 ** 9}),
     "methods.scala.server_batch: 1000000000 is out of range"),
    ("FL-FCR H of a million", _set("methods", "flfcr", {"algorithm": "flfcr", "H": 1e6}),
     "methods.flfcr.H: 1000000.0 is out of range; must be <= 1000"),
    ("FL-FCR samples_per_class of a billion",
     _set("methods", "flfcr", {"algorithm": "flfcr", "samples_per_class": 10 ** 9}),
     "methods.flfcr.samples_per_class: 1000000000 is out of range; must be <= 131072"),
    ("FL-FCR resampling beyond one array", _both(_use_method("fl", {"algorithm": "flfcr", "samples_per_class": 100000}),
                                                 _set(*T, "model", "alexnet")),
     "methods.fl.samples_per_class: 100000 × 10 classes × 4096 features of model 'alexnet' on dataset 'digits' "
     "(suite 'tiny') is 4,096,000,000 numbers"),
    ("Synthetic generating beyond one array", _both(_set("datasets", "synth", "clients", 100000),
                                                    _set("datasets", "synth", "dim", 10000)),
     "datasets.synth: 100000 clients generate"),
    ("eval_every above rounds", _set(*T, "eval_every", 5),
     "training.tiny: eval_every 5 on dataset 'digits' is above rounds 4"),
    ("checkpoint_every above rounds in an override", _set(*T, "overrides", {"digits": {"checkpoint_every": 8}}),
     "training.tiny: checkpoint_every 8 on dataset 'digits' is above rounds 4"),
    # a setting that another leaves without effect: the same computation under another run id
    ("FL-FCR drawing no samples but retraining",
     _set("methods", "flfcr", {"algorithm": "flfcr", "samples_per_class": 0}),
     "methods.flfcr.samples_per_class: 0 draws no features, so retrain_epochs 1 retrains nothing"),
    ("FL-FCR retraining off with a retraining lr",
     _set("methods", "flfcr", {"algorithm": "flfcr", "retrain_epochs": 0, "retrain_lr": 0.1}),
     "methods.flfcr.retrain_lr: 0.1 has no effect while retrain_epochs is 0"),
    ("FL-FCR retraining off with a sample count",
     _set("methods", "flfcr", {"algorithm": "flfcr", "retrain_epochs": 0, "samples_per_class": "balanced"}),
     "methods.flfcr.samples_per_class: 'balanced' has no effect while retrain_epochs is 0"),
    ("FL-FCR retraining off with aggregated features",
     _set("methods", "flfcr", {"algorithm": "flfcr", "retrain_epochs": 0, "features_from": "aggregated"}),
     "methods.flfcr.features_from: 'aggregated' has no effect while retrain_epochs is 0"),
    ("FL-FCR without margins choosing their counts", _set("methods", "flfcr", {"algorithm": "flfcr", "H": 0,
                                                                                "global_counts": 0}),
     "methods.flfcr.global_counts: 0 has no effect while H is 0"),
    ("FedNTD without distillation choosing its temperature",
     _set("methods", "fedntd", {"algorithm": "fedntd", "beta": 0, "tau": 3.0}),
     "methods.fedntd.tau: 3.0 has no effect while beta is 0"),
    ("MOON without its contrastive term choosing its temperature",
     _set("methods", "moon", {"algorithm": "moon", "mu": 0, "temperature": 0.1}),
     "methods.moon.temperature: 0.1 has no effect while mu is 0"),
    ("FedED without logit suppression choosing its form",
     _set("methods", "feded", {"algorithm": "feded", "logit_weight": 0, "logit_form": "authors_code"}),
     "methods.feded.logit_form: 'authors_code' has no effect while logit_weight is 0"),
]

# What only YAML text can hold. Each edit replaces one line of the tiny params' YAML.
TEXT_EDITS: list[tuple[str, str, str, str]] = [
    # (description, line to find, text to put in its place, text stderr must contain)
    ("training key written twice", "    lr: 0.05\n", "    lr: 0.05\n    lr: 0.5\n", "key 'lr' is written twice"),
    ("suite defined twice", "\nsuites:\n", "\nsuites:\n  tiny:\n    settings: []\n", "key 'tiny' is written twice"),
    ("partition defined twice", "\npartitions:\n", "\npartitions:\n  q2: {scheme: iid, clients: 3}\n",
     "key 'q2' is written twice"),
    ("dataset option written twice", "    source: digits\n", "    source: digits\n    source: mnist\n",
     "key 'source' is written twice"),
    ("top-level section written twice", "\ntraining:\n", "\nmethods: {}\ntraining:\n",
     "key 'methods' is written twice"),
    ("an unclosed list", "run:\n", "run: [unclosed\n", "not valid YAML"),
    ("a tab for indentation", "    lr: 0.05\n", "\tlr: 0.05\n", "not valid YAML"),
]


def _params_text() -> str:
    return yaml.safe_dump(TINY_PARAMS, sort_keys=False, default_flow_style=False)


def _mutated_text(change: Callable[[dict], None]) -> str:
    params = copy.deepcopy(TINY_PARAMS)
    change(params)
    return yaml.safe_dump(params, sort_keys=False)


def _edited_text(find: str, replace: str) -> str:
    text = _params_text()
    assert text.count(find) == 1, f"{find!r} is not one line of\n{text}"
    return text.replace(find, replace)


def _validate(tmp_path, capsys, text: str) -> tuple[int, str]:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    code = main(["--params", str(path), "validate"])
    return code, capsys.readouterr().err


def test_the_unmutated_params_are_valid(tmp_path, capsys):
    assert _validate(tmp_path, capsys, _params_text())[0] == 0


def test_there_are_at_least_60_distinct_mutations():
    texts = {_mutated_text(change) for _, change, _ in MUTATIONS} | {_edited_text(f, r) for _, f, r, _ in TEXT_EDITS}
    assert len(texts) == len(MUTATIONS) + len(TEXT_EDITS) >= 60


@pytest.mark.parametrize("description, change, key", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_malformed_value_is_refused_naming_the_key(tmp_path, capsys, description, change, key):
    code, err = _validate(tmp_path, capsys, _mutated_text(change))
    assert code == 2, f"{description}: accepted"
    assert key in err, f"{description}: {key!r} missing from\n{err}"
    assert "Traceback" not in err


@pytest.mark.parametrize("description, find, replace, key", TEXT_EDITS, ids=[t[0] for t in TEXT_EDITS])
def test_malformed_yaml_text_is_refused_naming_the_key(tmp_path, capsys, description, find, replace, key):
    code, err = _validate(tmp_path, capsys, _edited_text(find, replace))
    assert code == 2, f"{description}: accepted"
    assert key in err, f"{description}: {key!r} missing from\n{err}"


# A few representative cases through Snakemake: refused while the DAG is built, nothing created.
_BY_NAME = {m[0]: m for m in MUTATIONS}
WORKFLOW_CASES = [
    ("float rounds", _mutated_text(_BY_NAME["rounds as a float"][1]), "training.tiny.rounds"),
    ("unknown key", _mutated_text(_BY_NAME["misspelt training key"][1]), "learning_rate"),
    ("method listed twice", _mutated_text(_BY_NAME["method listed twice"][1]), "'fedavg' is listed twice"),
    ("infeasible partition", _mutated_text(_BY_NAME["Dirichlet with 500 clients on digits"][1]),
     "partitions.dir500 cannot split datasets.digits"),
    ("key written twice", _edited_text("    lr: 0.05\n", "    lr: 0.05\n    lr: 0.5\n"), "key 'lr' is written twice"),
    ("NaN learning rate", _mutated_text(_BY_NAME["lr NaN"][1]), "training.tiny.lr: .nan is not a finite number"),
    ("a size past its bound", _mutated_text(_BY_NAME["FL-FCR resampling beyond one array"][1]),
     "methods.fl.samples_per_class: 100000 × 10 classes"),
    ("a setting without effect", _mutated_text(_BY_NAME["FL-FCR drawing no samples but retraining"][1]),
     "methods.flfcr.samples_per_class: 0 draws no features"),
]


@pytest.mark.slow
@pytest.mark.parametrize("description, text, key", WORKFLOW_CASES, ids=[c[0] for c in WORKFLOW_CASES])
def test_snakemake_refuses_before_any_job(tmp_path, description, text, key):
    from tests.helpers import make_copy, run

    root = make_copy(tmp_path, {})
    (root / "params.yaml").write_text(text)
    result = run([venv_bin("snakemake"), "-n", "--cores", "1"], root)
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"{description}: snakemake accepted it\n{output[-3000:]}"
    assert key in output, f"{description}: {key!r} missing from\n{output[-3000:]}"
    assert not (root / "data").exists() and not (root / "results").exists()


@pytest.mark.slow
def test_snakemake_refuses_an_unknown_kernel_choice_before_any_job(tmp_path):
    """Every run id depends on FEDSKEW_CPU_KERNELS (fedskew.config.RunConfig.run_id): a value fedskew does
    not know stops the workflow while the DAG is built, with the same message `python -m fedskew` gives."""
    from tests.helpers import make_copy, run

    root = make_copy(tmp_path, TINY_PARAMS)
    result = run([venv_bin("snakemake"), "-n", "--cores", "1"], root, FEDSKEW_CPU_KERNELS="bogus")
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"snakemake accepted it\n{output[-3000:]}"
    assert "FEDSKEW_CPU_KERNELS='bogus' is not one of portable, native" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert not (root / "data").exists() and not (root / "results").exists()
