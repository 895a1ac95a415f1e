"""The whole DAG through the `snakemake` command, on a tiny suite in a temporary copy."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.helpers import changed, make_copy, planned, run, venv_bin

pytestmark = pytest.mark.slow


def test_snakemake_builds_tables_runs_and_mlflow_records_with_parallel_jobs(tmp_path, tiny_params):
    # a split-federated method runs through the same DAG, tracking and tables as federated ones
    tiny_params["suites"]["tiny"]["methods"] = ["fedavg", "scala"]
    root = make_copy(tmp_path, tiny_params)
    # 4 cores, 1 thread per training job: four training jobs write to one MLflow store at once.
    result = run([venv_bin("snakemake"), "--cores", "4"], root)
    assert result.returncode == 0, result.stderr[-4000:]

    expected_runs = 2 * 2 * 2  # partitions x methods x seeds
    metrics = sorted((root / "results/runs/tiny").glob("digits/*/*/seed*/metrics.json"))
    assert len(metrics) == expected_runs
    for path in metrics:
        for name in ("config.yaml", "history.csv"):
            assert (path.parent / name).exists()
        assert 0.0 <= json.loads(path.read_text())["final_acc"] <= 1.0
    assert len(list((root / "data/partitions/digits").glob("*/seed*.npz"))) == 2 * 2
    assert len(list((root / "data/partitions/digits").glob("*/seed*.png"))) == 2 * 2

    table = (root / "results/tables/tiny.md").read_text()
    for method in ("fedavg", "scala"):
        assert f"| {method} |" in table
    assert "digits / dir0.5" in table and "(n=2)" in table
    assert "Traffic over the whole run, MB sent up / down" in table
    csv = pd.read_csv(root / "results/tables/tiny.csv")
    assert len(csv) == 2 * 2 and set(csv["seeds"]) == {2}
    assert any("best_round" in column and "not reported" in column for column in csv.columns)
    assert (root / "results/tables/tiny.tex").read_text().startswith("% fedskew suite tiny")
    assert sorted(p.name for p in (root / "results/figures/tiny").glob("*.png")) == [
        "digits_dir0.5.png", "digits_dir0.5_final.png", "digits_q2.png", "digits_q2_final.png"]
    # the comparison beside the table: scala against fedavg in both settings, two seeds each
    compared = json.loads((root / "results/tables/compare/tiny.json").read_text())
    assert sorted((c["partition"], c["method"], c["baseline"], len(c["seeds"])) for c in compared) == [
        ("dir0.5", "scala", "fedavg", 2), ("q2", "scala", "fedavg", 2)]

    # Every run and every metric point reached the one SQLite store.
    from fedskew.tracking import count_runs, tracking_uri

    uri = tracking_uri(root)
    assert count_runs(uri, "fedskew/tiny") == expected_runs
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("fedskew/tiny")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    rounds = tiny_params["training"]["tiny"]["rounds"]
    for mlflow_run in runs:
        assert mlflow_run.info.status == "FINISHED"
        assert len(client.get_metric_history(mlflow_run.info.run_id, "loss/train_loss")) == rounds
        evaluated = client.get_metric_history(mlflow_run.info.run_id, "accuracy/test_acc")
        assert [m.step for m in evaluated] == [2, 4]
        tags = mlflow_run.data.tags
        assert {"git.commit", "git.dirty", "fedskew.config_hash", "fedskew.partition_hash"} <= set(tags)
        assert mlflow_run.data.params["training.lr"] == "0.05"
        if mlflow_run.data.params["method_spec.algorithm"] == "scala":  # split traffic, per round
            assert len(client.get_metric_history(mlflow_run.info.run_id, "traffic/bytes_up_activations")) == rounds
        artifacts = {a.path for a in client.list_artifacts(mlflow_run.info.run_id)}
        assert {"history.csv", "metrics.json", "config.yaml"} <= artifacts
        assert any(a.endswith(".png") for a in artifacts)

    # Nothing left to do: a second invocation runs no job.
    again = run([venv_bin("snakemake"), "--cores", "2", "-n"], root)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr

    # The tables, figures and the comparison read all three files of every run: a change to any one re-runs
    # aggregate and compare, and only them.
    tables = {f"results/tables/tiny.{ext}" for ext in ("md", "csv", "tex", "json")} | {
        "results/figures/tiny", "results/tables/runs/tiny.csv"}
    comparison = {f"results/tables/compare/tiny.{ext}" for ext in ("md", "csv", "json", "png")}
    for name in ("metrics.json", "history.csv", "config.yaml"):
        with changed(metrics[0].parent / name):
            assert planned(root) == {"aggregate": tables, "compare": comparison}, name
    assert planned(root) == {}


def test_seeds_per_job_all_trains_each_grid_point_in_one_job(tmp_path, tiny_params):
    tiny_params["suites"]["tiny"]["seeds_per_job"] = "all"
    tiny_params["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    root = make_copy(tmp_path, tiny_params)
    result = run([venv_bin("snakemake"), "--cores", "2"], root)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "train_seeds_tiny" in result.stderr and "rule train:" not in result.stderr

    # one job, with one log, per (partition, method); every seed's run files as usual
    logs = sorted(p.relative_to(root / "logs/train/tiny").as_posix() for p in (root / "logs/train/tiny").rglob("*.log"))
    assert logs == [f"digits/dir0.5/{m}/seeds.log" for m in ("fedavg", "fedlc")]
    for log in (root / "logs/train/tiny").rglob("seeds.log"):
        assert log.read_text().count("timing: 4 rounds") == 2  # both seeds trained in that process
    assert len(list((root / "results/runs/tiny").glob("digits/*/*/seed*/metrics.json"))) == 2 * 2
    assert "(n=2)" in (root / "results/tables/tiny.md").read_text()
    from fedskew.tracking import count_runs, tracking_uri

    assert count_runs(tracking_uri(root), "fedskew/tiny") == 2 * 2
    again = run([venv_bin("snakemake"), "--cores", "2", "-n"], root)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_invalid_params_fail_before_any_job_runs(tmp_path, tiny_params):
    tiny_params["partitions"]["dir0.5"]["beta"] = 0
    root = make_copy(tmp_path, tiny_params)
    result = run([venv_bin("snakemake"), "--cores", "1"], root)
    assert result.returncode != 0
    assert "partitions.dir0.5.beta" in result.stderr and "> 0" in result.stderr
    assert not (root / "data").exists() and not (root / "results").exists()


def test_a_build_names_params_yaml_and_the_merged_experiment_files_once(tmp_path, tiny_params):
    # Snakemake's banner lists no config file ("Config file(s): []"): fedskew reads params.yaml and experiments/
    root = make_copy(tmp_path, tiny_params)
    (root / "experiments").mkdir()
    (root / "experiments" / "mine.yaml").write_text(yaml.safe_dump({"partitions": {"iid4": {"scheme": "iid",
                                                                                             "clients": 4}}}))
    result = run([venv_bin("snakemake"), "--cores", "1", "data/raw/digits/READY.json"], root)  # one job: a download
    assert result.returncode == 0, result.stderr[-4000:]
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("fedskew: configuration")]
    assert said == ["fedskew: configuration read from params.yaml, with experiments/mine.yaml merged in"]
    assert (root / "data/raw/digits/READY.json").is_file()  # its job ran, without saying it again
