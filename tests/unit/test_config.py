"""params.yaml validation: every bad input fails early, naming key, value and what is allowed."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import yaml

from fedskew.config import ConfigError, load_params
from tests.helpers import REPO, TINY_PARAMS


def _with(change) -> dict:
    params = copy.deepcopy(TINY_PARAMS)
    change(params)
    return params


BAD_INPUTS = [
    # (description, mutation, words the message must contain)
    ("wrong type for rounds", lambda p: p["training"]["tiny"].update(rounds="ten"),
     ["training.tiny.rounds", "'ten'", "integer"]),
    ("negative round count", lambda p: p["training"]["tiny"].update(rounds=-3),
     ["training.tiny.rounds", "-3", ">= 1"]),
    ("beta = 0", lambda p: p["partitions"]["dir0.5"].update(beta=0),
     ["partitions.dir0.5.beta", "0", "> 0"]),
    ("negative beta", lambda p: p["partitions"]["dir0.5"].update(beta=-0.5),
     ["partitions.dir0.5.beta", "-0.5", "> 0"]),
    ("unknown partition scheme", lambda p: p["partitions"].update(bad={"scheme": "pathological", "clients": 3}),
     ["partitions.bad.scheme", "'pathological'", "dirichlet", "quantity"]),
    ("unknown algorithm", lambda p: p["methods"].update(fedfoo={"algorithm": "fedfoo"}),
     ["methods.fedfoo.algorithm", "'fedfoo'", "fedavg", "fedlc"]),
    ("unknown hyperparameter", lambda p: p["methods"]["fedprox"].update(lam=0.1),
     ["methods.fedprox", "lam", "mu"]),
    ("unknown dataset source", lambda p: p["datasets"].update(bad={"source": "imagenet22k"}),
     ["datasets.bad.source", "'imagenet22k'", "digits", "cifar10"]),
    ("suite names an undefined dataset", lambda p: p["suites"]["tiny"]["settings"][0].update(dataset="digitz"),
     ["suites.tiny.settings[0].dataset", "'digitz'", "digits"]),
    ("suite names an undefined method", lambda p: p["suites"]["tiny"].update(methods=["fedavg", "fedxyz"]),
     ["suites.tiny.methods[1]", "'fedxyz'"]),
    ("suite names an undefined partition", lambda p: p["suites"]["tiny"]["settings"][0].update(partitions=["dir9"]),
     ["suites.tiny.settings[0].partitions[0]", "'dir9'", "dir0.5"]),
    ("negative seed", lambda p: p["suites"]["tiny"].update(seeds=[0, -1]),
     ["suites.tiny.seeds[1]", "-1", ">= 0"]),
    ("participation above one", lambda p: p["training"]["tiny"].update(participation=1.5),
     ["training.tiny.participation", "1.5", "<= 1"]),
    ("unknown training key", lambda p: p["training"]["tiny"].update(learning_rate=0.1),
     ["training.tiny", "learning_rate", "lr"]),
    ("CNN on tabular data", lambda p: (p["suites"]["tiny"]["settings"].append(
        {"dataset": "synth", "partitions": ["natural"]}), p["training"]["tiny"].update(model="cnn")),
     ["model 'cnn'", "synth", "image"]),
    ("natural partition of a dataset without natural clients",
     lambda p: p["suites"]["tiny"]["settings"][0].update(partitions=["natural"]),
     ["partitions[0]", "'natural'", "digits"]),
    ("run names an undefined suite", lambda p: p["run"].update(suites=["tiny", "huge"]),
     ["run.suites[1]", "'huge'"]),
    ("unknown model", lambda p: p["training"]["tiny"].update(model="resnet1000"),
     ["training.tiny.model", "'resnet1000'", "cnn"]),
    ("1-channel paper model on CIFAR", lambda p: (p["datasets"].update(cifar10={"source": "cifar10"}),
                                                   p["suites"]["tiny"]["settings"].append(
                                                       {"dataset": "cifar10", "partitions": ["dir0.5"]}),
                                                   p["training"]["tiny"].update(model="fedlc_cnn_mnist")),
     ["model 'fedlc_cnn_mnist' on dataset 'cifar10'", "needs 1×28×28", "gives images of shape 3×32×32"]),
    ("image augmentation on tabular data", lambda p: (p["suites"]["tiny"]["settings"].append(
        {"dataset": "synth", "partitions": ["natural"]}), p["training"]["tiny"].update(augmentation="crop_flip")),
     ["training.tiny", "augmentation 'crop_flip'", "synth", "vectors"]),
    ("unknown augmentation", lambda p: p["training"]["tiny"].update(augmentation="mixup"),
     ["training.tiny.augmentation", "'mixup'", "crop_flip"]),
    ("split point the model does not have", lambda p: p["training"]["tiny"].update(split_point="S2"),
     ["training.tiny", "split_point 'S2'", "model 'mlp'", "relu1", "relu2"]),
    ("split method with an unknown hyperparameter", lambda p: p["methods"].update(s={"algorithm": "scala", "tau": 1}),
     ["methods.s", "tau", "local_iterations", "server_batch"]),
    # Integers written as floats pass JSON Schema's "integer" (10.0 is an integer there) and then
    # crash training; they are refused here.
    ("rounds written as a float", lambda p: p["training"]["tiny"].update(rounds=10.0),
     ["training.tiny.rounds", "10.0", "integer"]),
    ("batch size written as a float", lambda p: p["training"]["tiny"].update(batch_size=32.0),
     ["training.tiny.batch_size", "32.0", "integer"]),
    ("client count written as a float", lambda p: p["partitions"]["dir0.5"].update(clients=10.0),
     ["partitions.dir0.5.clients", "10.0", "integer"]),
    ("min_size 0 allows empty clients", lambda p: p["partitions"]["dir0.5"].update(min_size=0),
     ["partitions.dir0.5.min_size", "0", ">= 1"]),
    ("reproduce names an undefined suite", lambda p: p.update(reproduce={"suites": ["ghost"]}),
     ["reproduce.suites[0]", "'ghost'"]),
    ("reproduce imports an undefined suite", lambda p: p.update(reproduce={"suites": ["tiny"], "imported": ["ghost"]}),
     ["reproduce.imported[0]", "'ghost'"]),
    ("a suite both trained and imported", lambda p: p.update(reproduce={"suites": ["tiny"], "imported": ["tiny"]}),
     ["reproduce.imported[0]", "'tiny' is also in reproduce.suites", "remove it from one list"]),
    # Anything listed twice is named with both positions (a suite defined twice is a duplicate
    # YAML key: test_a_key_written_twice_...).
    ("suite listed twice in run.suites", lambda p: p["run"].update(suites=["tiny", "tiny"]),
     ["run.suites: 'tiny' is listed twice (items 0, 1); keep one"]),
    ("suite listed twice in reproduce.suites", lambda p: p.update(reproduce={"suites": ["tiny", "tiny"]}),
     ["reproduce.suites: 'tiny' is listed twice (items 0, 1)"]),
    ("method listed twice", lambda p: p["suites"]["tiny"].update(methods=["fedavg", "fedlc", "fedavg"]),
     ["suites.tiny.methods: 'fedavg' is listed twice (items 0, 2)"]),
    ("seed listed twice", lambda p: p["suites"]["tiny"].update(seeds=[3, 3]),
     ["suites.tiny.seeds: 3 is listed twice (items 0, 1)"]),
    ("partition listed twice in a setting", lambda p: p["suites"]["tiny"]["settings"][0].update(
        partitions=["q2", "dir0.5", "q2"]), ["suites.tiny.settings[0].partitions: 'q2' is listed twice (items 0, 2)"]),
    ("partition of a dataset listed again in a second setting", lambda p: p["suites"]["tiny"]["settings"].append(
        {"dataset": "digits", "partitions": ["q2"]}),
     ["suites.tiny.settings[1].partitions[0]", "'q2' of dataset 'digits' is listed twice", "settings[0]"]),
    # Partitions the partition job would refuse, refused now: the dataset's size is known in advance.
    ("more clients than digits has training images", lambda p: p["partitions"]["q2"].update(clients=5000),
     ["partitions.q2 cannot split datasets.digits (1437 training samples, 10 classes)",
      "used by suites.tiny.settings[0]", "use at most 1437 clients"]),
    ("Dirichlet min_size over 500 clients exceeds digits", lambda p: p["partitions"]["dir0.5"].update(
        clients=500, min_size=10), ["partitions.dir0.5 cannot split datasets.digits", "needs 5000 samples",
                                    "smaller min_size"]),
    ("quantity alpha above the class count", lambda p: p["partitions"]["q2"].update(alpha=11),
     ["partitions.q2 cannot split datasets.digits", "alpha must be in [1, num_classes=10], got 11"]),
    ("min_size larger than any client can get", lambda p: p["partitions"]["dir0.5"].update(min_size=1000),
     ["partitions.dir0.5", "min_size=1000", "needs 4000 samples but only 1437"]),
    ("quantity_per_label whose portions do not divide", lambda p: (
        p["partitions"].update(qpl={"scheme": "quantity_per_label", "clients": 7, "alpha": 2}),
        p["suites"]["tiny"]["settings"][0].update(partitions=["qpl"])),
     ["partitions.qpl cannot split datasets.digits", "divisible by num_classes=10"]),
    ("a suite outside run.suites is checked too", lambda p: (
        p["partitions"].update(huge={"scheme": "iid", "clients": 60001}),
        p["datasets"].update(mnist={"source": "mnist"}),
        p["suites"].update(other={"settings": [{"dataset": "mnist", "partitions": ["huge"]}], "methods": ["fedavg"],
                                  "seeds": [0]}),
        p["training"].update(other={"inherit": "tiny"})),
     ["partitions.huge cannot split datasets.mnist (60000 training samples", "suites.other.settings[0]"]),
    ("a test fraction that leaves digits no training set", lambda p: p["datasets"]["digits"].update(
        test_fraction=0.999), ["datasets.digits.test_fraction", "0.999", "leaves 1 training", "between 0.006"]),
    # NaN and ±inf: named at their key, with what to write instead
    ("a NaN learning rate", lambda p: p["training"]["tiny"].update(lr=float("nan")),
     ["training.tiny.lr: .nan is not a finite number; write a finite number"]),
    ("an infinite FedLC tau", lambda p: p["methods"]["fedlc"].update(tau=float("inf")),
     ["methods.fedlc.tau: .inf is not a finite number"]),
    # sizes: the key, the value and the bound
    ("FL-FCR resampling more than one array holds", lambda p: (
        p["methods"].update(fl={"algorithm": "flfcr", "samples_per_class": 100000}),
        p["suites"]["tiny"]["methods"].append("fl"), p["training"]["tiny"].update(model="alexnet")),
     ["methods.fl.samples_per_class: 100000 × 10 classes × 4096 features", "4,096,000,000 numbers",
      "above the bound of 2,147,483,648", "use a number of at most 52,428 per class"]),
    # (only logistic regression on Synthetic has features wide enough, and those are the generated data's)
    ("FL-FCR's balanced resampling bounded by the training set", lambda p: (
        p["datasets"].update(synth={"source": "synthetic", "clients": 1000, "dim": 10000, "classes": 1000}),
        p["methods"].update(fl={"algorithm": "flfcr", "samples_per_class": "balanced"}),
        p["suites"]["tiny"]["settings"].append({"dataset": "synth", "partitions": ["natural"]}),
        p["suites"]["tiny"].update(methods=["fl"]), p["training"]["tiny"].update(model="logreg")),
     ["methods.fl.samples_per_class: 'balanced', up to the", "training samples, × 10000 features of model 'logreg' "
      "on dataset 'synth'", "use a number of at most 214 per class",
      "datasets.synth: 1000 clients generate 321,742 training samples of dim 10000, 3,217,420,000 numbers"]),
    ("eval_every above rounds", lambda p: p["training"]["tiny"].update(eval_every=6),
     ["training.tiny: eval_every 6 on dataset 'digits' is above rounds 4", "use at most 4"]),
    # an option another one turns off, set to something else than its default
    ("FL-FCR sampling nothing while retraining", lambda p: p["methods"].update(
        fl={"algorithm": "flfcr", "samples_per_class": 0, "retrain_epochs": 2}),
     ["methods.fl.samples_per_class: 0 draws no features, so retrain_epochs 2 retrains nothing",
      "write retrain_epochs: 0"]),
    ("FL-FCR sampling nothing and not retraining", lambda p: p["methods"].update(
        fl={"algorithm": "flfcr", "samples_per_class": 0, "retrain_epochs": 0}),
     ["methods.fl.samples_per_class: 0 has no effect while retrain_epochs is 0 (no head retraining)",
      "leave samples_per_class out"]),
]


@pytest.mark.parametrize("description,change,words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_rejected_with_a_clear_message(description, change, words):
    with pytest.raises(ConfigError) as info:
        load_params(_with(change))
    message = str(info.value)
    for word in words:
        assert word in message, f"{description}: {word!r} missing from\n{message}"


@pytest.mark.parametrize("text, key, lines", [
    ("training:\n  tiny:\n    lr: 0.05\n    rounds: 4\n    lr: 0.5\n", "lr", (3, 5)),
    ("suites:\n  tiny: {seeds: [0]}\n  other: {seeds: [1]}\n  tiny: {seeds: [2]}\n", "tiny", (2, 4)),
])
def test_a_key_written_twice_is_an_error_naming_the_key_and_both_lines(tmp_path, text, key, lines):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    message = str(pytest.raises(ConfigError, load_params, path).value)
    assert f"key {key!r} is written twice" in message and f"lines {lines[0]} and {lines[1]}" in message


def test_a_merge_key_may_be_overridden_below_it(tmp_path):
    # `<<: *anchor` followed by one of the anchor's keys is YAML's override, not a duplicate.
    text = (REPO / "params.yaml").read_text()
    assert "<<: *" in text
    path = tmp_path / "params.yaml"
    path.write_text(text)
    assert load_params(path).raw["training"]["split_long_p0.2"]["participation"] == 0.2


def test_a_partition_is_not_checked_where_the_size_is_unknown():
    # FEMNIST's size depends on the writer draw: checked by the partition job, not refused here.
    def femnist(p):
        p["datasets"]["femnist"] = {"source": "femnist"}
        p["partitions"]["huge"] = {"scheme": "iid", "clients": 10 ** 5}  # within the schema's bound
        p["suites"]["tiny"]["settings"].append({"dataset": "femnist", "partitions": ["huge"]})
        p["training"]["tiny"]["model"] = "cnn"

    params = load_params(_with(femnist))  # accepted: no error
    assert any(cfg.dataset == "femnist" and cfg.partition == "huge" for cfg in params.runs())


def test_all_problems_are_reported_at_once():
    def two_problems(p):
        p["training"]["tiny"]["rounds"] = 0
        p["partitions"]["dir0.5"]["beta"] = -1

    message = str(pytest.raises(ConfigError, load_params, _with(two_problems)).value)
    assert "training.tiny.rounds" in message and "partitions.dir0.5.beta" in message


def test_the_shipped_params_yaml_is_valid_and_expands_the_default_suite():
    params = load_params(REPO / "params.yaml")
    runs = params.runs()
    assert params.default_suites == ["default"]
    # digits x {D(0.1), D(0.5), Q(2)} + synthetic(1,1) x natural, x 3 methods x 3 seeds
    assert len(runs) == 4 * 3 * 3
    assert {r.method for r in runs} == {"fedavg", "fedprox", "fedlc"}


def test_an_option_added_later_changes_the_run_id_only_when_set_to_another_value():
    """missing_classes came after published FedLC runs: at its default ('mask', what they did) the
    run id is the one those runs have; any other value is a different run."""
    params = load_params(copy.deepcopy(TINY_PARAMS))
    plain = params.run("tiny", "digits", "q2", "fedlc", 0)
    legacy = {k: v for k, v in plain.to_dict().items() if k != "suite"}
    legacy["method_spec"] = {"algorithm": "fedlc", "tau": 1.0}
    legacy["training"] = {k: v for k, v in plain.training.items() if k not in ("threads", "on_divergence")}
    legacy["cpu_kernel_recipe"] = 2  # the tiny suite's MLP is on the portable recipe 2 (tests/unit/test_gemm.py)
    expected = hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:16]
    assert plain.run_id == expected
    for treatment in ("floor", "global"):
        changed = _with(lambda p: p["methods"].update(fedlc={"algorithm": "fedlc", "tau": 1.0,
                                                              "missing_classes": treatment}))
        other = load_params(changed).run("tiny", "digits", "q2", "fedlc", 0)
        assert other.method_spec["missing_classes"] == treatment
        assert other.run_id != plain.run_id
    # FedED's logit_form came later too: "paper" (what every earlier FedED run computed) leaves ids alone
    feded = {"algorithm": "feded", "lam": 0.1}
    ids = {form: load_params(_with(lambda p: p["methods"].update(
        fedlc=feded if form is None else {**feded, "logit_form": form}))).run("tiny", "digits", "q2", "fedlc", 0).run_id
        for form in (None, "paper", "authors_code")}
    assert ids[None] == ids["paper"] != ids["authors_code"]


def test_run_id_is_a_hash_of_the_resolved_config():
    params = load_params(copy.deepcopy(TINY_PARAMS))
    a = params.run("tiny", "digits", "q2", "fedlc", 0)
    assert a.method_spec == {"algorithm": "fedlc", "tau": 1.0, "missing_classes": "mask"}
    assert a.training["momentum"] == 0.0  # defaults are filled in
    changed = _with(lambda p: p["training"]["tiny"].update(lr=0.01))
    b = load_params(changed).run("tiny", "digits", "q2", "fedlc", 0)
    assert a.run_id != b.run_id
    assert a.run_id == load_params(copy.deepcopy(TINY_PARAMS)).run("tiny", "digits", "q2", "fedlc", 0).run_id


def test_schema_knows_exactly_the_registered_algorithms_and_hyperparameters():
    from fedskew.algorithms import ALGORITHMS
    from fedskew.config_schema import params_schema

    method = params_schema()["$defs"]["method"]
    assert method["properties"]["algorithm"]["enum"] == list(ALGORITHMS)
    for branch in method["allOf"]:
        name = branch["if"]["properties"]["algorithm"]["const"]
        assert set(branch["then"]["properties"]) - {"algorithm"} == set(ALGORITHMS[name].hyperparameters), name
    assert len(method["allOf"]) == len(ALGORITHMS)


def test_cli_validate_fails_cleanly_on_a_bad_file(tmp_path, capsys):
    from fedskew.cli import main

    bad = _with(lambda p: p["training"]["tiny"].update(rounds=-1))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    assert main(["--params", str(tmp_path / "params.yaml"), "validate"]) == 2
    err = capsys.readouterr().err
    assert "training.tiny.rounds" in err and "Traceback" not in err


def test_cli_methods_lists_every_method_with_family_and_defaults(capsys):
    from fedskew.algorithms import ALGORITHMS
    from fedskew.cli import main

    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line for line in lines if line and not line.startswith(" ")}
    assert set(listed) == set(ALGORITHMS)
    assert "[federated] mu=0.01" in listed["fedprox"]
    assert "[split] local_iterations=5, server_batch=320" in listed["scala"]
    assert "lam=0.1, logit_weight=0.005" in listed["feded"]


def test_cli_models_lists_split_points_and_defaults(capsys):
    from fedskew.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "alexnet          split points: S2 (after relu4), S1 (after pool2)" in out and "default S2" in out
    assert "cnn              split points: pool, relu1, relu3; default pool" in out
    assert "resnet18         split points:" in out


def test_schema_knows_exactly_the_registered_models_and_dataset_sources():
    from fedskew.config_schema import params_schema
    from fedskew.data.datasets import dataset_sources
    from fedskew.models import MODELS

    schema = params_schema()["$defs"]
    assert set(schema["training_fields"]["properties"]["model"]["enum"]) == set(MODELS)
    assert schema["dataset"]["properties"]["source"]["enum"] == list(dataset_sources())
    for clause in schema["dataset"]["allOf"]:
        source = dataset_sources()[clause["if"]["properties"]["source"]["const"]]
        assert set(clause["then"]["properties"]) == {"source", *source.options}


def test_a_non_finite_value_is_reported_once_beside_the_other_problems():
    def problems(p):
        p["training"]["tiny"].update(lr=-float("inf"), rounds=0)
        p["partitions"]["dir0.5"]["beta"] = float("nan")

    message = str(pytest.raises(ConfigError, load_params, _with(problems)).value)
    assert "(3 problem(s))" in message, message
    assert "training.tiny.lr: -.inf is not a finite number" in message and "partitions.dir0.5.beta: .nan" in message
    assert "training.tiny.rounds: 0 is out of range" in message
    assert "training.tiny.lr: -Infinity" not in message  # not also reported as out of the schema's range


def test_values_at_their_defaults_or_switched_on_are_accepted():
    """What the rules leave alone: an option at its default beside a switch at 0 (the id is the default's), the
    shipped `flfcr_loss_only` form, a written eval_every of exactly `rounds`, and `rounds` below the
    default checkpoint_every."""
    def fine(p):
        p["methods"].update(off={"algorithm": "flfcr", "retrain_epochs": 0},
                            off_at_defaults={"algorithm": "flfcr", "retrain_epochs": 0, "samples_per_class": 200},
                            on={"algorithm": "flfcr", "samples_per_class": 5, "retrain_lr": 0.1},
                            ntd={"algorithm": "fedntd", "beta": 0, "tau": 1.0})
        p["training"]["tiny"].update(eval_every=4, checkpoint_every=4)
        p["training"]["other"] = {"rounds": 5}  # checkpoint_every defaults to 10
        p["suites"]["other"] = {"settings": [{"dataset": "digits", "partitions": ["q2"]}], "methods": ["fedavg"],
                                "seeds": [0]}

    params = load_params(_with(fine))
    assert params.training("other", "digits")["checkpoint_every"] == 10


def _walk_schema(node, path=""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk_schema(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk_schema(value, f"{path}/{i}")


def test_every_integer_in_the_schema_has_a_maximum():
    from fedskew.config_schema import params_schema

    schema = params_schema()  # the file with the clauses derived from the classes (methods, sources, schemes)
    unbounded = []
    for path, node in _walk_schema(schema):
        types = node.get("type")
        if "integer" in (types if isinstance(types, list) else [types]) and "maximum" not in node:
            unbounded.append(path)
    assert not unbounded, f"integers without a maximum: {unbounded}"


def _tiny_run():
    return load_params(copy.deepcopy(TINY_PARAMS)).run("tiny", "digits", "q2", "fedlc", 0)


def test_native_kernels_give_another_run_id_only_where_the_pin_applies(monkeypatch):
    from fedskew.numerics import cpu_pin

    monkeypatch.delenv("FEDSKEW_CPU_KERNELS", raising=False)
    monkeypatch.setattr(cpu_pin.platform, "machine", lambda: "x86_64")
    portable = _tiny_run()
    content = {k: v for k, v in portable.to_dict().items() if k != "suite"}
    content["method_spec"] = {"algorithm": "fedlc", "tau": 1.0}
    content["training"] = {k: v for k, v in portable.training.items() if k not in ("threads", "on_divergence")}
    content["cpu_kernel_recipe"] = 2
    assert portable.run_id == hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    monkeypatch.setenv("FEDSKEW_CPU_KERNELS", "portable")
    assert _tiny_run().run_id == portable.run_id  # written out, the default is the default
    monkeypatch.setenv("FEDSKEW_CPU_KERNELS", "native")
    native = _tiny_run()
    content["cpu_kernels"] = "native"
    assert native.run_id == hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
    assert native.run_id != portable.run_id
    monkeypatch.setattr(cpu_pin.platform, "machine", lambda: "aarch64")  # nothing to pin: native is all there is
    assert _tiny_run().run_id == portable.run_id


def test_an_unknown_kernel_choice_is_a_config_error_when_an_id_is_computed(monkeypatch):
    monkeypatch.setenv("FEDSKEW_CPU_KERNELS", "bogus")
    params = load_params(copy.deepcopy(TINY_PARAMS))  # reading params.yaml needs no kernels
    with pytest.raises(ConfigError, match="FEDSKEW_CPU_KERNELS='bogus' is not one of portable, native"):
        params.run("tiny", "digits", "q2", "fedlc", 0).run_id  # noqa: B018


def _committed_configs():
    import tarfile

    for archive in sorted([*(REPO / "results" / "committed-runs").glob("*/*.tar.gz"),
                           *(REPO / "results" / "imported").glob("*/*.tar.gz")]):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.name.endswith("/config.yaml"):
                    yield yaml.safe_load(tar.extractfile(member))


def test_every_committed_run_keeps_its_id_under_portable_kernels_and_a_native_run_has_another(monkeypatch):
    from fedskew.config import RunConfig
    from fedskew.numerics import cpu_pin

    monkeypatch.delenv("FEDSKEW_CPU_KERNELS", raising=False)
    monkeypatch.setattr(cpu_pin.platform, "machine", lambda: "x86_64")
    params = load_params(REPO / "params.yaml")
    configs = list(_committed_configs())
    assert len(configs) > 100
    for stored in configs:
        fields = {k: v for k, v in stored.items() if k != "run_id"}
        cfg = params.run(fields["suite"], fields["dataset"], fields["partition"], fields["method"], fields["seed"])
        assert RunConfig(**fields).run_id == cfg.run_id == stored["run_id"], fields
    monkeypatch.setenv("FEDSKEW_CPU_KERNELS", "native")
    for stored in configs:
        assert RunConfig(**{k: v for k, v in stored.items() if k != "run_id"}).run_id != stored["run_id"]
