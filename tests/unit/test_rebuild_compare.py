"""The comparison behind `make run` / `make verify`, on hand-made tables (no training)."""

from __future__ import annotations

import json

from fedskew import rebuild

COMMITTED = {"digits/q2/fedavg": {"final_acc_mean": 0.772222, "final_acc_std": 0.075615, "seeds": 3},
             "digits/q2/fedlc": {"final_acc_mean": 0.634259, "final_acc_std": 0.135927, "seeds": 3}}


def write_tables(root, suite, cells, text="| method |", compared=False):
    for name, path in rebuild.table_files(suite, root, compared).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cells, indent=2) + "\n" if name.endswith(".json") else f"{text} {name}\n")


def references(root, suite, compared=False):
    return {name: path.read_bytes() for name, path in rebuild.table_files(suite, root, compared).items()}


def test_identical_tables_give_one_line_and_no_cells(tmp_path):
    write_tables(tmp_path / "a", "s", COMMITTED)
    write_tables(tmp_path / "b", "s", COMMITTED)
    check = rebuild.compare("s", tmp_path / "b", "the committed tables (HEAD abc)", references(tmp_path / "a", "s"))
    assert check.identical and not check.differs and check.cells == []
    assert rebuild.report([check], "rebuilt") == ("fedskew: rebuilt s: all 4 tables are identical, byte for byte, "
                                                  "to the committed tables (HEAD abc).")


def test_a_moved_cell_is_named_with_both_values_and_the_difference_in_points(tmp_path):
    write_tables(tmp_path / "a", "s", COMMITTED)
    moved = json.loads(json.dumps(COMMITTED))
    moved["digits/q2/fedavg"].update(final_acc_mean=0.771296, final_acc_std=0.075)  # one test sample of 1080
    write_tables(tmp_path / "b", "s", moved, text="| method | moved")
    check = rebuild.compare("s", tmp_path / "b", "HEAD", references(tmp_path / "a", "s"))
    assert check.differs and check.differing_files == ["s.md", "s.csv", "s.tex", "s.json"]
    assert [c.text() for c in check.cells] == [
        "digits/q2/fedavg final_acc_mean: 77.2222 -> 77.1296 (-0.0926 points)",
        "digits/q2/fedavg final_acc_std: 7.5615 -> 7.5 (-0.0615 points)"]
    last = rebuild.report([check], "rebuilt").splitlines()[-1]
    assert last == ("fedskew: rebuilt: 1 of 1 suite(s) differ: s: s.md, s.csv, s.tex, s.json differ from HEAD: "
                    "2 cell(s) differ")


def test_a_suites_comparison_is_checked_beside_its_tables(tmp_path):
    write_tables(tmp_path / "a", "s", COMMITTED, compared=True)
    write_tables(tmp_path / "b", "s", COMMITTED, compared=True)
    check = rebuild.compare("s", tmp_path / "b", "HEAD", references(tmp_path / "a", "s", compared=True))
    assert check.identical and rebuild.closing_line([check], "rebuilt") == (
        "fedskew: rebuilt s: all 7 tables are identical, byte for byte, to HEAD.")
    (tmp_path / "b" / "results/tables/compare/s.csv").write_text("dataset,moved\n")
    check = rebuild.compare("s", tmp_path / "b", "HEAD", references(tmp_path / "a", "s", compared=True))
    assert check.differing_files == ["compare/s.csv"] and check.cells == []


def test_cells_that_appear_or_vanish_and_text_only_changes(tmp_path):
    fewer = {"digits/q2/fedavg": COMMITTED["digits/q2/fedavg"]}
    cells = rebuild.cell_differences(json.dumps(COMMITTED).encode(), json.dumps(fewer).encode())
    assert {(c.key, c.field, c.rebuilt) for c in cells} == {("digits/q2/fedlc", f, None) for f in COMMITTED[
        "digits/q2/fedlc"]}
    assert "absent" in cells[0].text()
    write_tables(tmp_path / "a", "s", COMMITTED)
    write_tables(tmp_path / "b", "s", COMMITTED, text="| method | (protocol line changed)")
    check = rebuild.compare("s", tmp_path / "b", "HEAD", references(tmp_path / "a", "s"))
    assert check.differs and check.cells == [] and "the numbers agree, the text differs" in check.summary()


def test_a_new_suite_is_not_a_difference(tmp_path):
    write_tables(tmp_path / "b", "new", COMMITTED)
    check = rebuild.compare("new", tmp_path / "b", "nothing (no earlier tables)", dict.fromkeys(rebuild.table_files("new")))
    assert not check.differs and not check.identical
    assert "no table differs, but not every table had a committed one" in rebuild.closing_line([check], "rebuilt")


def test_references_come_from_the_files_outside_git(tmp_path):
    write_tables(tmp_path, "s", COMMITTED)
    label, found = rebuild.read_references("s", tmp_path)
    assert label == "the tables as they were before the build"
    assert json.loads(found["s.json"]) == COMMITTED


def write_run(folder, history="round,acc\n1,0.5\n", provenance="machine A", acc=0.5):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("method: fedavg\n")
    (folder / "history.csv").write_text(history)
    record = {"final_acc": acc, "provenance": {"commit": provenance}, "integrity": {"metrics": provenance}}
    (folder / "metrics.json").write_text(json.dumps(record))
    return folder


def test_a_retrained_run_differs_only_where_its_results_differ_not_in_its_provenance(tmp_path):
    committed = write_run(tmp_path / "committed")
    assert rebuild.run_file_differences(committed, write_run(tmp_path / "same", provenance="machine B")) == []
    moved = write_run(tmp_path / "acc", acc=0.51)
    assert rebuild.run_file_differences(committed, moved) == ["metrics.json (final_acc)"]
    assert rebuild.run_file_differences(committed, write_run(tmp_path / "hist", history="round,acc\n1,0.6\n")) == \
        ["history.csv"]
    missing = write_run(tmp_path / "missing")
    (missing / "history.csv").unlink()
    assert rebuild.run_file_differences(committed, missing) == ["history.csv (not written)"]


def test_retraining_some_runs_names_a_method_or_seed_the_suite_lacks(tmp_path):
    import pytest
    import yaml

    from fedskew.config import ConfigError, load_params
    from tests.helpers import TINY_PARAMS

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(TINY_PARAMS, sort_keys=False))
    params = load_params(tmp_path / "params.yaml")
    chosen = rebuild.select_runs(params, "tiny", ["fedlc"], [1])
    assert [(c.method, c.partition, c.seed) for c in chosen] == [("fedlc", "dir0.5", 1), ("fedlc", "q2", 1)]
    assert len(rebuild.select_runs(params, "tiny", None, [0])) == 4
    with pytest.raises(ConfigError, match=r"--method 'fedcl' is not a method of suite 'tiny' \(did you mean 'fedlc'"):
        rebuild.select_runs(params, "tiny", ["fedcl"], None)
    with pytest.raises(ConfigError, match="--seed 7 is not a seed of suite 'tiny'; its seeds: 0, 1"):
        rebuild.select_runs(params, "tiny", None, [7])
