"""What each piece computes on the fingerprints' tiny fixed problem, as one digest: a method's run, the engine,
a model, a dataset source's scaling, a partition scheme's draw (the tests in this folder check them against
fingerprints.json through record.py)."""

from __future__ import annotations

import copy
import functools

import numpy as np
import torch

from fedskew import catalog, engine, models, paths
from fedskew.data import registry
from fedskew.data.datasets import dataset_source, dataset_sources
from fedskew.data.datasets.base import GeneratedSource
from fedskew.data.partitions import make_partition
from fedskew.data.partitions.registry import SCHEME_CLASSES
from fedskew.engine.checkpoint import CHECKPOINT_NAME, read_checkpoint
from fedskew.engine.simulation import run_training
from fedskew.models import MIN_IMAGE_SIDE, NEEDS, build_model
from tests.fingerprints import record
from tests.helpers import TINY_PARAMS, method_config, single_setting

# The offline digits, Dirichlet(0.5) over 4 clients, seed 0 (the tiny suite of tests/helpers.py, one setting).
PARAMS = single_setting(copy.deepcopy(TINY_PARAMS))

TRAINING = {"rounds": 2, "checkpoint_every": 2, "eval_every": 1, "participation": 0.5, "batch_size": 16}


def run_digest(method: str, path: str, label: str = "") -> str:
    """The sha256 of a method's history and final weights on the tiny problem (the working folder is the project,
    tests/fingerprints/conftest.py); `label` names the run's folder."""
    cfg = method_config(PARAMS, method, training={**TRAINING, "execution": path}, label=label or f"{method}-{path}")
    result = run_training(cfg)
    assert result.execution == path, f"{method} trained {result.execution}, not {path}"
    state = read_checkpoint(cfg.path(paths.CHECKPOINT_DIR) / CHECKPOINT_NAME)["global_state"]
    return record.Digest().add("history", result.history).add_state("weights", state).hex()


def engine_digest() -> str:
    """The round loop on both federated paths (FedAvg, the round every federated method refines) and a split
    round (SplitFedV1, the plainest split method) on the tiny problem."""
    digest = record.Digest()
    for method, path in (("fedavg", "sequential"), ("fedavg", "vectorised"), ("splitfed_v1", "sequential")):
        digest.add(f"{method}-{path}", run_digest(method, path, label=f"engine-{method}-{path}"))
    return digest.hex()


def _small_info(name: str) -> registry.DatasetInfo:
    """The smallest input model `name` takes: its own shape, the smallest image it allows, or 64-vectors."""
    needs = NEEDS[name]
    if needs.shapes:
        return registry.DatasetInfo(needs.shapes[0], 10, True, False)
    if needs.image:
        return registry.DatasetInfo((3, MIN_IMAGE_SIDE[name], MIN_IMAGE_SIDE[name]), 10, True, False)
    return registry.DatasetInfo((64,), 10, False, False)


def model_digest(name: str) -> str:
    """A model's initial weights (seeded as the engine seeds them), its outputs on a fixed batch and their
    gradients, in training mode."""
    info = _small_info(name)
    torch.manual_seed(0)
    model = build_model(name, info)
    inputs = torch.randn((2, *info.input_shape), generator=torch.Generator().manual_seed(1))
    digest = record.Digest().add_state("initial", model.state_dict())
    model.train()
    outputs = model(inputs)
    outputs.square().sum().backward()
    digest.add("outputs", outputs)
    return digest.add_state("gradients", {k: p.grad for k, p in model.named_parameters()}).hex()


def source_digest(name: str) -> str:
    """What a source gives at load from fixed inputs: a generated source's tensors from its default spec, any
    source's scaling (fedskew.data.registry's normalisation with its pixel_max or as tabular data) of fixed raw
    tensors of its shape."""
    digest = record.Digest()
    source = dataset_source(name)
    spec = {"source": name, **catalog.dataset_defaults(name)}
    if isinstance(source, GeneratedSource):
        tensors = source.generate(spec)
        digest.add_state("generated", {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)})
        x_train, x_test = tensors["x_train"], tensors["x_test"]
    else:
        shape = catalog.sources()[name].input_shape
        rng = np.random.default_rng(0)
        if len(shape) == 1:
            x_train, x_test = (torch.from_numpy(rng.standard_normal((n, *shape)).astype(np.float32)) for n in (6, 3))
        else:
            x_train, x_test = (torch.from_numpy(rng.integers(0, 256, (n, *shape), dtype=np.uint8)) for n in (6, 3))
    scaled = registry._normalise(x_train.clone(), x_test.clone(), name)
    return digest.add_state("scaled", {f"{i}": t for i, t in enumerate(scaled) if t is not None}).hex()


# The parameters each scheme draws with here: a new scheme needs an entry (the test below says so).
SCHEME_PARAMS = {"iid": {"clients": 5}, "dirichlet": {"clients": 5, "beta": 0.5}, "quantity": {"clients": 5, "alpha": 2},
                 "quantity_per_label": {"clients": 5, "alpha": 2}, "shards": {"clients": 5, "shards_per_client": 2},
                 "natural": {}, "extended_dirichlet": {"clients": 5, "classes_per_client": 2, "beta": 0.5},
                 "iid_mixture": {"clients": 5, "rho": 0.5, "beta": 0.5},
                 "longtail_dirichlet": {"clients": 5, "imbalance_ratio": 2.0, "beta": 0.5, "min_size": 5}}


def scheme_digest(name: str) -> str:
    """A scheme's draw on 200 fixed labels of 10 classes, seed 0 (natural: 5 writers of 40 samples)."""
    labels = np.random.default_rng(0).integers(0, 10, 200)
    groups = np.arange(200) % 5 if name == "natural" else None
    partition = make_partition(labels, 10, name, SCHEME_PARAMS[name], seed=0, natural_groups=groups)
    digest = record.Digest().add("label_counts", np.asarray(partition.label_counts))
    for k, indices in enumerate(partition.client_indices):
        digest.add(f"client{k}", np.asarray(indices))
    return digest.hex()


@functools.cache
def shared_fingerprints() -> dict[str, tuple[int, str]]:
    """piece -> (its version, its digest now) for the pieces the methods' tiny problem runs on: the engine, the
    MLP, the digits, the Dirichlet draw (the working folder is the fingerprints' project)."""
    return {"engine": (engine.VERSION, engine_digest()), "model/mlp": (models.VERSIONS["mlp"], model_digest("mlp")),
            "source/digits": (dataset_sources()["digits"].version, source_digest("digits")),
            "scheme/dirichlet": (SCHEME_CLASSES["dirichlet"].version, scheme_digest("dirichlet"))}
