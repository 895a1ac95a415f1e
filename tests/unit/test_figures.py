"""The figures of a suite, drawn from hand-made run files (no training): bands, panels, dot plots."""

from __future__ import annotations

import copy
import statistics

import matplotlib
import numpy as np
import pytest

from fedskew.algorithms import ALGORITHMS
from fedskew.config import load_params
from fedskew.report import method_families as mf
from fedskew.report.figures import (accuracy_curve_figure, clipped_band, final_accuracy_figure, final_stats, load_runs,
                                    paper_values, write_figures)
from fedskew.report.method_families import PANEL_MAX, panels
from fedskew.runfiles import RunFileError, write_run_files
from tests.helpers import REPO, TINY_PARAMS

matplotlib.use("Agg")

MANY = ["fedavg", "fedprox", "fedlc", "scaffold", "fednova", "fedadam", "moon", "feded", "scala", "splitfed_v1",
        "fedrs", "fedntd"]

# Algorithms deliberately left in the "other" panel, each with its reason (none today).
EXPLICITLY_OTHER: dict[str, str] = {}


def tiny(methods: list[str], seeds=(0, 1, 2)):
    raw = copy.deepcopy(TINY_PARAMS)
    raw["suites"]["tiny"].update(methods=list(methods), seeds=list(seeds))
    raw["suites"]["tiny"]["settings"][0]["partitions"] = ["dir0.5"]
    return load_params(raw)


def write_runs(params, root, suite, acc, diverged=lambda cfg: False, rounds=(2, 4, 6)):
    """Run files whose accuracy at round r is acc(cfg, r) (a fraction); final = the last round's."""
    for cfg in params.runs([suite]):
        if diverged(cfg):
            write_run_files(cfg, [{"round": 1, "train_loss": float("nan")}],
                            {"status": "diverged", "final_acc": None, "final_loss": None}, root)
            continue
        history = [{"round": r, "test_acc": acc(cfg, r), "test_loss": 1.0} for r in rounds]
        write_run_files(cfg, history, {"status": "finished", "final_acc": acc(cfg, rounds[-1]), "final_loss": 1.0},
                        root)


def band_y_values(fig) -> np.ndarray:
    from matplotlib.collections import PolyCollection

    ys = [path.vertices[:, 1] for ax in fig.axes for coll in ax.collections if isinstance(coll, PolyCollection)
          for path in coll.get_paths()]
    assert ys, "no band drawn"
    return np.concatenate(ys)


def test_clipped_band_never_leaves_0_100() -> None:
    lo, hi = clipped_band([99.0, 1.0, 50.0, 70.0], [5.0, 5.0, 60.0, float("nan")])
    assert list(lo) == [94.0, 0.0, 0.0, 70.0] and list(hi) == [100.0, 6.0, 100.0, 70.0]


def test_plotted_bands_stay_within_0_and_100_percent(tmp_path) -> None:
    # Seeds spread widely near both ends: mean ± std would pass 100 % for one method and 0 % for the other.
    params = tiny(["fedavg", "fedlc"])
    spread = {0: -1, 1: 0, 2: 1}
    write_runs(params, tmp_path, "tiny",
               lambda cfg, r: (0.97 + 0.03 * spread[cfg.seed] if cfg.method == "fedavg"
                               else 0.03 + 0.03 * spread[cfg.seed]))
    runs = load_runs(params, "tiny", tmp_path)[("digits", "dir0.5")]
    fig = accuracy_curve_figure(params, "tiny", "digits", "dir0.5", runs)
    ys = band_y_values(fig)
    assert ys.min() == pytest.approx(0.0) and ys.max() == pytest.approx(100.0)  # reached, never passed
    assert ys.min() >= 0.0 and ys.max() <= 100.0
    low, high = fig.axes[0].get_ylim()
    assert 0.0 <= low and high <= 100.0
    line = next(line for line in fig.axes[0].lines if line.get_gid() != "reference")
    assert max(line.get_ydata()) <= 100.0 and min(line.get_ydata()) > 1.0  # plotted in %


def test_a_short_run_gets_whole_round_ticks(tmp_path) -> None:
    params = tiny(["fedavg"], seeds=(0,))
    write_runs(params, tmp_path, "tiny", lambda cfg, r: 0.5, rounds=(1, 2, 3, 4, 5))
    fig = accuracy_curve_figure(params, "tiny", "digits", "dir0.5", load_runs(params, "tiny", tmp_path)[
        ("digits", "dir0.5")])
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_xticks() if fig.axes[0].get_xlim()[0] <= t <= fig.axes[0].get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_up_to_8_methods_share_one_panel_with_fedavg_as_reference(tmp_path) -> None:
    params = tiny(MANY[:8], seeds=(0,))
    write_runs(params, tmp_path, "tiny", lambda cfg, r: 0.5)
    fig = accuracy_curve_figure(params, "tiny", "digits", "dir0.5", load_runs(params, "tiny", tmp_path)[
        ("digits", "dir0.5")])
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 1
    references = [line for line in visible[0].lines if line.get_gid() == "reference"]
    assert len(references) == 1 and references[0].get_linestyle() == "--"
    assert len(visible[0].lines) == 8  # the reference + 7 methods: FedAvg is not drawn twice


def test_more_than_8_methods_give_one_panel_per_family_each_with_fedavg(tmp_path) -> None:
    params = tiny(MANY, seeds=(0, 1))
    write_runs(params, tmp_path, "tiny", lambda cfg, r: 0.4 + MANY.index(cfg.method) / 100)
    runs = load_runs(params, "tiny", tmp_path)[("digits", "dir0.5")]
    groups = panels(params, MANY)
    assert [title for title, _ in groups] == [mf.PLAIN, mf.DRIFT, mf.CALIBRATION, mf.SPLIT]
    assert dict(groups) == {mf.PLAIN: ["fedprox", "fednova", "fedadam"], mf.DRIFT: ["scaffold", "moon", "fedntd"],
                            mf.CALIBRATION: ["fedlc", "feded", "fedrs"], mf.SPLIT: ["scala", "splitfed_v1"]}
    fig = accuracy_curve_figure(params, "tiny", "digits", "dir0.5", runs)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4
    for ax, (title, members) in zip(visible, groups):
        assert ax.get_title(loc="left") == title
        reference = [line for line in ax.lines if line.get_gid() == "reference"]
        assert len(reference) == 1 and reference[0].get_linestyle() == "--"
        assert reference[0].get_label().startswith("FedAvg reference")
        labels = [text.get_text() for text in ax.get_legend().get_texts()]
        assert labels[0].startswith("FedAvg reference") and len(labels) == 1 + len(members)
        assert all(label.startswith(m) for label, m in zip(labels[1:], members))


def test_a_large_family_is_split_into_panels_keeping_variants_together() -> None:
    params = load_params(REPO / "params.yaml")
    methods = params.raw["suites"]["methods"]["methods"]
    groups = panels(params, methods)
    assert sorted(m for _, members in groups for m in members) == sorted(set(methods) - {"fedavg"})
    assert all(len(members) <= PANEL_MAX for _, members in groups)
    calibration = [members for title, members in groups if title.startswith(mf.CALIBRATION)]
    assert len(calibration) == 2
    for variants in (["fedlc", "fedlc_floor", "fedlc_global", "fedlc_scaffold", "fedlc_fedprox"],
                     ["feded", "feded_dis", "feded_logit", "feded_floor", "feded_global"]):
        assert any(set(variants) <= set(members) for members in calibration), variants


def test_every_registered_algorithm_has_a_family() -> None:
    for name, algorithm in ALGORITHMS.items():
        family = mf.algorithm_family(name)
        assert family in mf.FAMILIES
        if family == mf.OTHER:
            assert name in EXPLICITLY_OTHER, f"file {name} under a family in fedskew/report/method_families.py"
        if algorithm.family == "split":
            assert family == mf.SPLIT
    assert mf.algorithm_family("not_a_method") == mf.OTHER
    assert set(mf.DESCRIPTIONS) == set(mf.FAMILIES)


def test_methods_of_the_catalogue_take_their_algorithms_family() -> None:
    params = load_params(REPO / "params.yaml")
    assert mf.method_family(params, "fedlc_floor") == mf.CALIBRATION
    assert mf.method_family(params, "moon_mu1") == mf.DRIFT
    assert mf.method_family(params, "scala_T10") == mf.SPLIT


def test_paper_values_are_the_main_protocol_cells_of_the_suite() -> None:
    values = paper_values("fedlc_t4_synthetic")
    (mark,) = values[("synthetic_1_1", "natural", "fedlc")]
    assert (mark.table, mark.row, mark.column, mark.value, mark.pm) == ("fedlc_t4", "Ours", "Synthetic(1,1)",
                                                                         75.46, 0.52)
    # a sensitivity protocol's suite gets no mark, and neither does a fedskew-only row
    assert paper_values("fedlc_t4_p1") == {}
    assert ("synthetic_1_1", "natural", "fedlc_floor") not in values
    # a run two tables print with different values gets both; with equal values, one
    assert sorted(m.value for m in paper_values("flfcr_mnist")[("mnist", "dir0.05", "flfcr")]) == [65.34, 74.16]
    assert len(paper_values("feded_table")[("cifar10", "dir0.05", "fedavg")]) == 1


def test_dot_plot_sorts_by_mean_notes_divergence_and_marks_paper_values(tmp_path) -> None:
    params = load_params(REPO / "params.yaml")
    suite = "fedlc_t4_synthetic"
    methods = params.raw["suites"][suite]["methods"]
    order = {"scaffold": 0.80, "fedlc": 0.70, "fedavg": 0.60}  # others lower, by their position in the suite

    def acc(cfg, r):
        return order.get(cfg.method, 0.5 - methods.index(cfg.method) / 100) + cfg.seed / 1000

    def diverged(cfg):  # fedprox loses one seed, fedyogi all of them
        return (cfg.method == "fedprox" and cfg.seed == 0) or cfg.method == "fedyogi"

    write_runs(params, tmp_path, suite, acc, diverged)
    written = write_figures(params, suite, tmp_path)
    settings = [(s["dataset"], p) for s in params.raw["suites"][suite]["settings"] for p in s["partitions"]]
    assert sorted(p.name for p in written) == sorted(
        name for d, p in settings for name in (f"{d}_{p}.png", f"{d}_{p}_final.png"))

    runs = load_runs(params, suite, tmp_path)[("synthetic_1_1", "natural")]
    stats = final_stats(params, runs)
    assert [s.method for s in stats[:3]] == ["scaffold", "fedlc", "fedavg"]
    assert stats[-1].method == "fedyogi" and stats[-1].n == 0 and stats[-1].diverged == 5
    means = [s.mean for s in stats if s.mean is not None]
    assert means == sorted(means, reverse=True)
    fedprox = next(s for s in stats if s.method == "fedprox")
    assert fedprox.n == 4 and fedprox.diverged == 1
    seeds = [100 * acc(cfg, 0) for cfg in params.runs([suite])
             if (cfg.dataset, cfg.method) == ("synthetic_1_1", "fedlc")]
    fedlc = next(s for s in stats if s.method == "fedlc")
    assert fedlc.mean == pytest.approx(statistics.fmean(seeds)) and fedlc.std == pytest.approx(statistics.stdev(seeds))

    fig = final_accuracy_figure(params, suite, "synthetic_1_1", "natural", runs, paper_values(suite))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    ticks = list(ax.get_yticks())
    assert labels[ticks.index(max(ticks))].startswith("scaffold")  # best on top
    assert "(n=4, 1 diverged)" in next(label for label in labels if label.startswith("fedprox "))
    assert "diverged: 5/5 seeds" in next(label for label in labels if label.startswith("fedyogi"))
    fedlc_y = ticks[labels.index(next(label for label in labels if label.startswith("fedlc ")))]
    paper = {c.get_gid().split(":", 1)[1]: c for c in ax.collections if (c.get_gid() or "").startswith("paper:")}
    assert set(paper) <= set(methods) and "fedlc" in paper
    assert tuple(paper["fedlc"].get_offsets()[0]) == pytest.approx((75.46, fedlc_y))
    assert len(paper["fedlc"].get_facecolor()) == 0 or paper["fedlc"].get_facecolor()[0][3] == 0  # hollow
    assert "paper (main protocol)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert 0.0 <= ax.get_xlim()[0] and ax.get_xlim()[1] <= 100.0


def test_a_setting_whose_runs_all_diverged_still_gets_both_figures(tmp_path) -> None:
    params = tiny(["fedavg", "fedlc"], seeds=(0,))
    write_runs(params, tmp_path, "tiny", lambda cfg, r: 0.5, diverged=lambda cfg: True)
    written = write_figures(params, "tiny", tmp_path)
    assert sorted(p.name for p in written) == ["digits_dir0.5.png", "digits_dir0.5_final.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_an_altered_history_is_refused(tmp_path) -> None:
    params = tiny(["fedavg"], seeds=(0,))
    write_runs(params, tmp_path, "tiny", lambda cfg, r: 0.5)
    history = next(tmp_path.glob("results/runs/tiny/**/history.csv"))
    history.write_text(history.read_text().replace("0.5", "0.9"))
    with pytest.raises(RunFileError, match="history.csv"):
        write_figures(params, "tiny", tmp_path)
