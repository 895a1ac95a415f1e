"""The typed training settings (fedskew.training_config): the schema's fields, the defaults run ids rest on, and
the refusal of a key or value they do not know."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from fedskew.config import ConfigError, identity, load_params, run_config_yaml
from fedskew.config_schema import SCHEMA_PATH
from fedskew.training_config import (
    EXECUTION_SETTINGS,
    LATER_TRAINING_OPTIONS,
    TRAINING_DEFAULTS,
    TRAINING_KEYS,
    TrainingConfig,
)


def _schema_fields() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())["$defs"]["training_fields"]["properties"]


def test_the_fields_are_the_schema_s_training_settings():
    assert sorted(TRAINING_KEYS) == sorted(_schema_fields())


def test_a_field_with_named_values_allows_what_the_schema_allows():
    hints = typing.get_type_hints(TrainingConfig)
    named = {name: typing.get_args(hint) for name, hint in hints.items() if typing.get_origin(hint) is typing.Literal}
    assert set(named) == {"device", "on_divergence", "execution", "precision", "optimizer", "augmentation"}
    for name, values in named.items():
        assert list(values) == _schema_fields()[name]["enum"], name


def test_the_defaults_are_those_the_published_run_ids_were_computed_with():
    # Written out here, not derived: a default changed by mistake would change every run id that relies on it.
    assert TRAINING_DEFAULTS == {"model": "mlp", "rounds": 50, "participation": 1.0, "local_epochs": 1,
                                 "batch_size": 32, "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0,
                                 "eval_every": 1, "checkpoint_every": 10, "threads": 1, "device": "cpu",
                                 "on_divergence": "fail"}
    assert list(TRAINING_DEFAULTS) == ["model", "rounds", "participation", "local_epochs", "batch_size", "lr",
                                       "momentum", "weight_decay", "eval_every", "checkpoint_every", "threads",
                                       "device", "on_divergence"]  # config.yaml's order
    assert EXECUTION_SETTINGS == ("threads", "on_divergence")
    assert LATER_TRAINING_OPTIONS == {"execution": "sequential", "precision": "fp32", "optimizer": "sgd"}
    written_only = TrainingConfig()
    assert (written_only.augmentation, written_only.split_point, written_only.local_diagnostics) == ("none", None,
                                                                                                      False)


def test_a_run_reads_its_settings_typed_and_records_only_what_was_written(tiny_params):
    tiny_params["training"]["tiny"]["precision"] = "fp32"
    cfg = load_params(tiny_params).run("tiny", "digits", "dir0.5", "fedavg", 0)
    assert cfg.train == TrainingConfig(**cfg.training)
    assert (cfg.train.rounds, cfg.train.eval_every, cfg.train.participation) == (4, 2, 0.5)
    assert cfg.train.optimizer == "sgd" and cfg.train.split_point is None and cfg.train.augmentation == "none"
    recorded = yaml.safe_load(run_config_yaml(cfg))["training"]
    assert "precision" in recorded and not {"optimizer", "execution", "augmentation", "split_point"} & set(recorded)
    assert "precision" not in identity(cfg.to_dict())["training"]  # fp32 written is the published behaviour


def test_overrides_reach_the_typed_settings_of_their_dataset_only(tiny_params):
    tiny_params["suites"]["tiny"]["settings"].append({"dataset": "synth", "partitions": ["q2"]})
    tiny_params["training"]["tiny"]["overrides"] = {"synth": {"rounds": 3, "model": "logreg"}}
    params = load_params(tiny_params)
    digits, synth = params.run("tiny", "digits", "q2", "fedavg", 0), params.run("tiny", "synth", "q2", "fedavg", 0)
    assert (digits.train.rounds, digits.train.model) == (4, "mlp")
    assert (synth.train.rounds, synth.train.model) == (3, "logreg")


def test_an_unknown_key_is_refused_in_one_line_naming_it_the_allowed_keys_and_the_likely_one(tiny_params):
    cfg = load_params(tiny_params).run("tiny", "digits", "dir0.5", "fedavg", 0)
    with pytest.raises(ConfigError) as raised:
        dataclasses.replace(cfg, training={**cfg.training, "roudns": 3})
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("training.tiny: unknown key 'roudns' (did you mean 'rounds'?); allowed: ")
    assert message.endswith(", ".join(sorted(TRAINING_KEYS)))


def test_several_unknown_keys_are_named_together():
    with pytest.raises(ConfigError, match=r"^training: unknown keys 'batchsize' \(did you mean 'batch_size'\?\), "
                                          r"'zzz'; allowed: augmentation, batch_size, "):
        TrainingConfig.from_record({"batchsize": 32, "zzz": 1})


@pytest.mark.parametrize("key, value, says", [
    ("rounds", 10.0, "training.rounds: 10.0 has the wrong type; expected integer"),
    ("rounds", True, "training.rounds: true has the wrong type; expected integer"),
    ("lr", "0.1", "training.lr: '0.1' has the wrong type; expected number"),
    ("local_diagnostics", 1, "training.local_diagnostics: 1 has the wrong type; expected boolean"),
    ("split_point", 3, "training.split_point: 3 has the wrong type; expected string or null"),
    ("device", "gpu", "training.device: 'gpu' is not allowed (did you mean 'cpu'?); allowed: cpu, cuda, auto"),
    ("optimizer", "lbfgs", "training.optimizer: 'lbfgs' is not allowed; allowed: sgd, adam"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(key, value, says):
    with pytest.raises(ConfigError) as raised:
        TrainingConfig.from_record({key: value})
    assert str(raised.value) == says


def test_an_int_is_a_number_where_a_float_is_expected():
    assert TrainingConfig.from_record({"lr": 1, "momentum": 0}).lr == 1
