"""The packed runner on CPU at small scale: pieces of several worker processes, pauses and resumes,
archives of bounded size, and the import, all giving the run files a single run gives."""

from __future__ import annotations

import io
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from fedskew import paths
from fedskew.config import ConfigError, load_params
from fedskew.engine.simulation import run_training
from fedskew.packed.archive import ArchiveError, import_archives, ship
from fedskew.packed.plan import order_runs, run_state, select_runs
from fedskew.packed.runner import PieceSummary, RunEvent, peak_tflops, run_piece
from fedskew.runfiles import write_run_files

pytestmark = pytest.mark.slow


def _files(root: Path, cfg) -> dict[str, bytes]:
    return {name: (root / cfg.path(paths.RUN_DIR) / name).read_bytes()
            for name in ("config.yaml", "history.csv", "metrics.json")}


def _without_provenance(metrics: bytes) -> dict:
    record = json.loads(metrics)
    record.pop("integrity")
    record.pop("provenance", None)
    return record


def _single_runs(project: Path, runs) -> dict[str, dict[str, bytes]]:
    """Each run as a training job trains it (run_training, then its run files); the results moved aside."""
    out = {}
    for cfg in runs:
        result = run_training(cfg, root=project)
        write_run_files(cfg, result.history, result.final, project)
        out[cfg.run_id] = _files(project, cfg)
    shutil.rmtree(project / "results")
    return out


def _assert_same_runs(project: Path, runs, reference: dict[str, dict[str, bytes]]) -> None:
    for cfg in runs:
        files = _files(project, cfg)
        assert files["config.yaml"] == reference[cfg.run_id]["config.yaml"], cfg.run_id
        assert files["history.csv"] == reference[cfg.run_id]["history.csv"], cfg.run_id
        assert _without_provenance(files["metrics.json"]) == _without_provenance(reference[cfg.run_id]["metrics.json"])
        provenance = json.loads(files["metrics.json"])["provenance"]
        assert provenance["device"] == "cpu" and provenance["precision"] == "fp32" and provenance["torch"]


def test_selection_names_what_is_missing_and_puts_the_first_methods_first(tiny_params) -> None:
    params = load_params(tiny_params)
    runs = select_runs(params, ["tiny"], partitions=["q2"], seeds=[1])
    assert [(c.partition, c.method, c.seed) for c in runs] == [("q2", "fedavg", 1), ("q2", "fedlc", 1)]
    assert [c.method for c in order_runs(select_runs(params, ["tiny"]), ["fedlc"])][:4] == ["fedlc"] * 4
    with pytest.raises(ConfigError, match=r"--method fedporx: no run of suite\(s\) tiny has it; they have: fedavg, fedlc"):
        select_runs(params, ["tiny"], methods=["fedporx"])
    with pytest.raises(ConfigError, match="--suite nope: not a suite"):
        select_runs(params, ["nope"])
    assert select_runs(params, ["tiny"], run_ids=[runs[0].run_id]) == [runs[0]]


def test_pieces_of_several_workers_pause_resume_and_give_single_run_files(project, tiny_params) -> None:
    runs = select_runs(load_params(project / "params.yaml"), ["tiny"])
    reference = _single_runs(project, runs)

    first = run_piece(runs, workers=2, time_limit_s=600, threads=1, max_rounds=1,
                      log_path=project / "logs/packed/pieces.jsonl")
    assert first.count("paused") == len(runs) and {e.last_round for e in first.events} == {1}
    assert {e.worker for e in first.events} == {0, 1}  # both workers took runs
    assert all(run_state(cfg, project) == "started" for cfg in runs)

    second = run_piece(runs, workers=2, time_limit_s=600, threads=1, log_path=project / "logs/packed/pieces.jsonl")
    assert second.count("finished") == len(runs) and all(e.rounds_done == 3 for e in second.events)
    _assert_same_runs(project, runs, reference)  # paused and resumed: the files of uninterrupted single runs

    lines = [json.loads(line) for line in (project / "logs/packed/pieces.jsonl").read_text().splitlines()]
    pieces = [line for line in lines if line["event"] == "piece"]
    assert len(pieces) == 2 and pieces[1]["finished"] == len(runs) and pieces[1]["rounds"] == 3 * len(runs)
    assert pieces[1]["tflops"] > 0 and pieces[1]["mfu"] is None  # a CPU has no listed peak


def test_a_piece_near_its_time_limit_starts_no_run_and_keeps_the_rest_for_later(project, tiny_params) -> None:
    runs = select_runs(load_params(project / "params.yaml"), ["tiny"])
    summary = run_piece(runs, workers=1, time_limit_s=5, threads=1, log_path=project / "pieces.jsonl")
    assert summary.count("skipped") == len(runs)  # under MIN_START_S left: nothing is begun
    assert all(run_state(cfg, project) == "not started" for cfg in runs)


def test_a_worker_whose_piece_is_gone_checkpoints_and_takes_no_other_run(project, tiny_params, monkeypatch) -> None:
    """All tasks are queued when a piece begins, so a worker must notice that its parent died (killed)."""
    import queue

    from fedskew.packed import runner

    monkeypatch.chdir(project)
    runs = select_runs(load_params(project / "params.yaml"), ["tiny"])
    gone = -1  # never a parent's pid: the worker is an orphan from the start
    event = runner._train_one(runs[0], 0, time.time() + 600, 1, None, parent=gone)
    assert event.event == "paused" and event.last_round == 1  # one round, then its checkpoint
    assert run_state(runs[0], project) == "started"

    tasks, events = queue.Queue(), queue.Queue()
    for cfg in [*runs[1:], None]:
        tasks.put(cfg)
    runner._worker(0, tasks, events, time.time() + 600, 1, None, parent=gone)
    assert events.empty() and all(run_state(cfg, project) == "not started" for cfg in runs[1:])


def test_shipped_archives_are_bounded_verified_and_import_once(project, tiny_params, tmp_path_factory,
                                                              migrated_store, monkeypatch) -> None:
    params = load_params(project / "params.yaml")
    runs = select_runs(params, ["tiny"])
    run_piece(runs, workers=2, time_limit_s=600, threads=1, log_path=project / "pieces.jsonl")
    shipped = {cfg.run_id: _files(project, cfg) for cfg in runs}
    largest_run = max(sum(len(b) for b in files.values()) for files in shipped.values())
    archives = ship(runs, project / "out", root=project, max_bytes=2 * largest_run + 2 * 64 * 1024)
    assert len(archives) >= 3 and all(a.stat().st_size <= 2 * largest_run + 2 * 64 * 1024 for a in archives)

    home = tmp_path_factory.mktemp("home")
    (home / "params.yaml").write_text((project / "params.yaml").read_text())
    shutil.copy(migrated_store, home / "mlflow.db")
    monkeypatch.chdir(home)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("FEDSKEW_TRACKING", "1")
    done = subprocess.run([sys.executable, "-m", "fedskew", "packed", "import", *map(str, archives)],
                          capture_output=True, text=True, cwd=home)
    assert done.returncode == 0, done.stderr
    assert f"{len(runs)} run(s) added to results/runs, 0 already there" in done.stdout
    for cfg in runs:
        assert _files(home, cfg) == shipped[cfg.run_id]
    with sqlite3.connect(home / "mlflow.db") as db:
        finished = db.execute("select count(*) from runs where status = 'FINISHED'").fetchone()[0]
        device = db.execute("select distinct value from tags where key = 'fedskew.provenance.device'").fetchall()
    assert finished == len(runs) and device == [("cpu",)]
    again = import_archives(load_params(home / "params.yaml"), archives, home)
    assert not again.imported and len(again.already) == len(runs)


def _tampered(archive: Path, target: Path, edit) -> Path:
    """A copy of `archive` whose members went through `edit(name, data) -> (name, data)`."""
    with tarfile.open(archive, "r:gz") as tar, tarfile.open(target, "w:gz") as out:
        for member in tar.getmembers():
            member.name, data = edit(member.name, tar.extractfile(member).read())
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    return target


def test_a_damaged_or_stale_archive_is_refused_and_nothing_is_written(project, tiny_params, tmp_path) -> None:
    params = load_params(project / "params.yaml")
    runs = select_runs(params, ["tiny"], partitions=["dir0.5"], seeds=[0])
    run_piece(runs, workers=1, time_limit_s=600, threads=1, log_path=project / "pieces.jsonl")
    [archive] = ship(runs, tmp_path / "out", root=project)
    home = tmp_path / "home"
    home.mkdir()

    flipped = _tampered(archive, tmp_path / "flipped.tar.gz", lambda name, data: (
        name, data.replace(b"round", b"rounD", 1) if name.endswith("history.csv") else data))
    with pytest.raises(ArchiveError, match="does not match its digest"):
        import_archives(params, [flipped], home)
    outside = _tampered(archive, tmp_path / "outside.tar.gz", lambda name, data: (
        name.replace("results/runs/", "../../etc/"), data.replace(b'"results/runs/', b'"../../etc/')))
    with pytest.raises(ArchiveError, match="is not a run file under results/runs/"):
        import_archives(params, [outside], home)
    unlisted = _tampered(archive, tmp_path / "unlisted.tar.gz", lambda name, data: (
        name, data.replace(b'"results/runs/', b'"results/other/', 1) if name == "MANIFEST.json" else data))
    with pytest.raises(ArchiveError, match="members and manifest disagree"):
        import_archives(params, [unlisted], home)
    changed = yaml.safe_load((project / "params.yaml").read_text())
    changed["training"]["tiny"]["lr"] = 0.5
    with pytest.raises(ArchiveError, match="its configuration changed since; train it again"):
        import_archives(load_params(changed), [archive], home)
    assert not (home / "results").exists()

    import_archives(params, [archive], home)
    metrics = home / runs[0].path(paths.RUN_METRICS)
    metrics.write_text(metrics.read_text().replace('"final_round"', '"final_round" '))
    with pytest.raises(ArchiveError, match="never overwrites a result"):
        import_archives(params, [archive], home)


def test_shipping_into_a_folder_adds_only_the_runs_its_archives_do_not_hold(project, tiny_params, tmp_path) -> None:
    # A suite trained in stretches (on one machine or several) ships into its committed folder after each one.
    params = load_params(project / "params.yaml")
    first, second = (select_runs(params, ["tiny"], partitions=["dir0.5"], seeds=[s]) for s in (0, 1))
    run_piece(first, workers=1, time_limit_s=600, threads=1, log_path=project / "pieces.jsonl")
    folder = tmp_path / "imported"
    [one] = ship(first + second, folder, root=project, stamp="1")
    assert ship(first + second, folder, root=project, stamp="2") == []  # nothing new: nothing written

    run_piece(second, workers=1, time_limit_s=600, threads=1, log_path=project / "pieces.jsonl")
    [two] = ship(first + second, folder, root=project, stamp="1")  # the same stamp: a name of its own
    assert two.name.endswith("1-02.tar.gz")
    manifest = json.loads(tarfile.open(two, "r:gz").extractfile("MANIFEST.json").read())
    assert [r["run_id"] for r in manifest["runs"]] == [cfg.run_id for cfg in second]
    report = import_archives(params, [one, two], tmp_path / "home")
    assert len(report.imported) == len(first + second)

    again = run_training(first[0], root=project)  # trained again on another machine: another provenance
    write_run_files(first[0], again.history, {**again.final, "provenance": {"device_name": "another"}}, project)
    with pytest.raises(ArchiveError, match=r"already shipped in .*1-01.tar.gz with other bytes .* packed import"):
        ship(first, folder, root=project, stamp="4")
    assert sorted(p.name for p in folder.iterdir()) == [one.name, two.name]


def test_the_command_line_runs_a_slice_and_reports_its_throughput(project, tiny_params) -> None:
    done = subprocess.run([sys.executable, "-m", "fedskew", "packed", "run", "--suite", "tiny", "--partition", "q2",
                           "--workers", "2", "--max-rounds", "2", "--first", "fedlc"],
                          capture_output=True, text=True, cwd=project)
    assert done.returncode == 0, done.stderr
    assert "0 of 4 selected runs finished; 4 to train with 2 worker(s)" in done.stdout
    assert "0 finished, 4 paused, 0 diverged, 0 failed, 0 left for the next piece; 8 rounds in" in done.stdout
    need = re.search(r"the paused runs need up to (\d+) s more at this pace", done.stdout)
    assert need and int(need.group(1)) > 0  # each run has rounds left after its 2 of this slice
    status = subprocess.run([sys.executable, "-m", "fedskew", "packed", "status", "--suite", "tiny"],
                            capture_output=True, text=True, cwd=project)
    assert "all     0 finished, 4 started, 4 not started of 8" in status.stdout


def test_a_piece_says_how_long_its_paused_runs_need_to_finish() -> None:
    # Two runs paused near their end (the 8-worker piece of docs/gpu.md), one resumed from round 100.
    events = [RunEvent("paused", "a", "runs/a", 0, rounds_done=450, last_round=450, seconds=414.0, rounds_total=500),
              RunEvent("paused", "b", "runs/b", 1, rounds_done=300, last_round=400, seconds=300.0, rounds_total=500),
              RunEvent("finished", "c", "runs/c", 2, rounds_done=500, last_round=500, seconds=460.0, rounds_total=500)]
    piece = PieceSummary(3, 440.0, 421.0, "NVIDIA H200", "fp32", events)
    assert piece.seconds_to_finish_paused() == pytest.approx(max(50 * 414 / 450, 100 * 300 / 300))
    assert PieceSummary(1, 60.0, 50.0, "cpu", "fp32", events[2:]).seconds_to_finish_paused() is None


def test_peak_throughput_is_known_for_the_lent_gpus_only() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "fp32") == 51.2
    assert peak_tflops("NVIDIA H200", "tf32") == 494.7
    assert peak_tflops("Intel(R) Xeon(R) Processor", "fp32") is None
