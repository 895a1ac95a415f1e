"""The comparison behind `make run` / `make verify`, on hand-made tables (no training): each suite is compared with
what there is to compare it with (the committed tables, a previous build's, or nothing) and reported against it,
never against another suite's (fedskew.table_check)."""

from __future__ import annotations

import json
import subprocess

from fedskew import rebuild, table_check
from fedskew.table_check import Reference, table_files

COMMITTED = {"digits/q2/fedavg": {"final_acc_mean": 0.772222, "final_acc_std": 0.075615, "seeds": 3},
             "digits/q2/fedlc": {"final_acc_mean": 0.634259, "final_acc_std": 0.135927, "seeds": 3}}


def write_tables(root, suite, cells, text="| method |", compared=False):
    for name, path in table_files(suite, root, compared).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cells, indent=2) + "\n" if name.endswith(".json") else f"{text} {name}\n")


def references(root, suite, compared=False, label="the committed tables (HEAD abc)", kind=table_check.COMMITTED):
    """The table files under root as the reference of a build: committed ones, unless told otherwise."""
    files = {name: path.read_bytes() for name, path in table_files(suite, root, compared).items()}
    return Reference(kind, label, files)


def nothing(suite):
    """The reference of a suite built for the first time: no file to compare with."""
    return Reference(table_check.NOTHING, "nothing", dict.fromkeys(table_files(suite)))


def test_identical_tables_give_one_line_and_no_cells(tmp_path):
    write_tables(tmp_path / "a", "s", COMMITTED)
    write_tables(tmp_path / "b", "s", COMMITTED)
    check = table_check.compare("s", tmp_path / "b", references(tmp_path / "a", "s"))
    assert check.identical and not check.differs and check.cells == []
    assert table_check.report([check], "rebuilt") == ("fedskew: rebuilt s: all 4 tables are identical, byte for byte, "
                                                  "to the committed tables (HEAD abc).")


def test_a_moved_cell_is_named_with_both_values_and_the_difference_in_points(tmp_path):
    write_tables(tmp_path / "a", "s", COMMITTED)
    moved = json.loads(json.dumps(COMMITTED))
    moved["digits/q2/fedavg"].update(final_acc_mean=0.771296, final_acc_std=0.075)  # one test sample of 1080
    write_tables(tmp_path / "b", "s", moved, text="| method | moved")
    check = table_check.compare("s", tmp_path / "b", references(tmp_path / "a", "s", label="HEAD"))
    assert check.differs and check.differing_files == ["s.md", "s.csv", "s.tex", "s.json"]
    assert [c.text() for c in check.cells] == [
        "digits/q2/fedavg final_acc_mean: 77.2222 -> 77.1296 (-0.0926 points)",
        "digits/q2/fedavg final_acc_std: 7.5615 -> 7.5 (-0.0615 points)"]
    last = table_check.report([check], "rebuilt").splitlines()[-1]
    assert last == ("fedskew: rebuilt: 1 of 1 suite(s) differ: s: s.md, s.csv, s.tex, s.json differ from HEAD: "
                    "2 cell(s) differ")


def test_a_suites_comparison_is_checked_beside_its_tables(tmp_path):
    write_tables(tmp_path / "a", "s", COMMITTED, compared=True)
    write_tables(tmp_path / "b", "s", COMMITTED, compared=True)
    check = table_check.compare("s", tmp_path / "b", references(tmp_path / "a", "s", compared=True, label="HEAD"))
    assert check.identical and table_check.closing_line([check], "rebuilt") == (
        "fedskew: rebuilt s: all 7 tables are identical, byte for byte, to HEAD.")
    (tmp_path / "b" / "results/tables/compare/s.csv").write_text("dataset,moved\n")
    check = table_check.compare("s", tmp_path / "b", references(tmp_path / "a", "s", compared=True, label="HEAD"))
    assert check.differing_files == ["compare/s.csv"] and check.cells == []


def test_cells_that_appear_or_vanish_and_text_only_changes(tmp_path):
    fewer = {"digits/q2/fedavg": COMMITTED["digits/q2/fedavg"]}
    cells = table_check.cell_differences(json.dumps(COMMITTED).encode(), json.dumps(fewer).encode())
    assert {(c.key, c.field, c.rebuilt) for c in cells} == {("digits/q2/fedlc", f, None) for f in COMMITTED[
        "digits/q2/fedlc"]}
    assert "absent" in cells[0].text()
    write_tables(tmp_path / "a", "s", COMMITTED)
    write_tables(tmp_path / "b", "s", COMMITTED, text="| method | (protocol line changed)")
    check = table_check.compare("s", tmp_path / "b", references(tmp_path / "a", "s", label="HEAD"))
    assert check.differs and check.cells == [] and "the numbers agree, the text differs" in check.summary()


def test_a_new_suite_is_not_a_difference_and_is_said_to_have_nothing_to_compare_with(tmp_path):
    write_tables(tmp_path / "b", "new", COMMITTED)
    check = table_check.compare("new", tmp_path / "b", nothing("new"))
    assert not check.differs and not check.identical
    assert table_check.closing_line([check], "rebuilt") == (
        "fedskew: rebuilt new: built; no committed table to compare (4 tables written).")


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def test_references_are_the_committed_tables_else_the_previous_builds_else_nothing(tmp_path):
    git(tmp_path, "init", "-q")
    write_tables(tmp_path, "shipped", COMMITTED)
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tables")
    write_tables(tmp_path, "shipped", {}, text="| edited before the build |")  # HEAD's are the reference
    write_tables(tmp_path, "mine", COMMITTED)  # untracked: a researcher's suite built before

    shipped = table_check.read_references("shipped", tmp_path)
    head = git(tmp_path, "rev-parse", "--short", "HEAD").strip()
    assert (shipped.kind, shipped.label) == (table_check.COMMITTED, f"the committed tables (HEAD {head})")
    assert json.loads(shipped.files["shipped.json"]) == COMMITTED
    mine = table_check.read_references("mine", tmp_path)
    assert (mine.kind, mine.label) == (table_check.PREVIOUS, "the previous build's tables (not committed)")
    assert json.loads(mine.files["mine.json"]) == COMMITTED
    # committed tables without the comparison committed beside them: what is there is what the build is compared with
    assert table_check.read_references("shipped", tmp_path, compared=True).kind == table_check.PREVIOUS
    assert table_check.read_references("never", tmp_path).kind == table_check.NOTHING


def test_with_a_researchers_suite_beside_a_shipped_one_each_is_reported_against_its_own_reference(tmp_path):
    write_tables(tmp_path / "a", "default", COMMITTED)
    write_tables(tmp_path / "b", "default", COMMITTED)
    write_tables(tmp_path / "b", "focal", COMMITTED)
    default = table_check.compare("default", tmp_path / "b", references(tmp_path / "a", "default"))
    first = table_check.compare("focal", tmp_path / "b", nothing("focal"))
    line = table_check.closing_line([default, first], "rebuilt")
    assert line == ("fedskew: rebuilt: no table differs, but not every table had one to compare with: default: "
                    "identical, byte for byte, to the committed tables (HEAD abc) | focal: built; no committed table "
                    "to compare")
    assert "all 8 tables" not in line

    write_tables(tmp_path / "a", "focal", COMMITTED)  # focal's previous build
    again = table_check.compare("focal", tmp_path / "b", references(tmp_path / "a", "focal", kind=table_check.PREVIOUS,
                                                                     label=table_check.PREVIOUS_LABEL))
    assert table_check.closing_line([default, again], "rebuilt") == (
        "fedskew: rebuilt: every table is identical, byte for byte, to what it was compared with: default: identical, "
        "byte for byte, to the committed tables (HEAD abc) | focal: identical, byte for byte, to the previous build's "
        "tables (not committed)")

    moved = json.loads(json.dumps(COMMITTED))
    moved["digits/q2/fedlc"]["final_acc_mean"] = 0.65
    write_tables(tmp_path / "b", "focal", moved)
    changed = table_check.compare("focal", tmp_path / "b", again.reference)
    assert changed.differs and not changed.differs_from_committed  # news of the previous build, not a failed proof
    assert table_check.closing_line([default, changed], "rebuilt") == (
        "fedskew: rebuilt: 1 of 2 suite(s) differ: default: identical, byte for byte, to the committed tables "
        "(HEAD abc) | focal: focal.json differ from the previous build's tables (not committed): 1 cell(s) differ")


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
