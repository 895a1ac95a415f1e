"""`fedskew compare`: each method against the baseline, paired by seed, against an independent computation.

The run files are written with chosen final accuracies (fedskew.runfiles, as a training job writes them), so
the expected effects are worked out here with scipy's t quantile, apart from fedskew's own arithmetic.
"""

from __future__ import annotations

import copy
import json
import math
import statistics

import pytest
from scipy.stats import t

from fedskew.cli import main
from fedskew.config import ConfigError, load_params
from fedskew.report.compare import compare, write_comparison
from fedskew.runfiles import write_run_files
from tests.helpers import TINY_PARAMS

# final test accuracy (fraction) by method and seed, on every setting of the suite
ACCURACY = {"fedavg": [0.80, 0.70, 0.75], "fedprox": [0.82, 0.725, 0.77], "fedlc": [0.70, 0.72, 0.60]}


def _project(tmp_path, monkeypatch, diverged: tuple[str, int] | None = None):
    params = copy.deepcopy(TINY_PARAMS)
    params["suites"]["tiny"].update(methods=["fedavg", "fedprox", "fedlc"], seeds=[0, 1, 2])
    (tmp_path / "params.yaml").write_text(json.dumps(params))
    monkeypatch.chdir(tmp_path)
    loaded = load_params(tmp_path / "params.yaml")
    for cfg in loaded.suite_runs("tiny"):
        value = ACCURACY[cfg.method][cfg.seed]
        if (cfg.method, cfg.seed) == diverged:
            final = {"status": "diverged", "diverged_round": 2}
        else:
            final = {"status": "finished", "final_acc": value, "final_round": 4}
        write_run_files(cfg, [{"round": 4, "test_acc": value}], final, tmp_path)
    return loaded


def _expected(method: str) -> tuple[float, float, float]:
    differences = [100 * (a - b) for a, b in zip(ACCURACY[method], ACCURACY["fedavg"])]
    mean = statistics.fmean(differences)
    half = t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return mean, mean - half, mean + half


def test_each_method_against_fedavg_in_every_setting_is_the_paired_t_interval(tmp_path, monkeypatch) -> None:
    found = compare(_project(tmp_path, monkeypatch), "tiny")
    assert [(c.dataset, c.partition, c.method) for c in found] == [
        ("digits", "dir0.5", "fedprox"), ("digits", "dir0.5", "fedlc"),
        ("digits", "q2", "fedprox"), ("digits", "q2", "fedlc")]
    for c in found:
        mean, low, high = _expected(c.method)
        assert c.seeds == (0, 1, 2) and c.baseline == "fedavg"
        assert (c.effect.mean, c.effect.low, c.effect.high) == pytest.approx((mean, low, high), abs=1e-9)
    fedprox, fedlc = found[0], found[1]
    # fedprox: +2, +2.5, +2 points: the whole interval above 0
    assert fedprox.verdicts == {"beats": "holds", "at least as good": "holds"}
    # fedlc: -10, +2, -15 points: the interval straddles 0
    assert fedlc.verdicts == {"beats": "inconclusive", "at least as good": "inconclusive"}


def test_a_threshold_and_another_baseline(tmp_path, monkeypatch) -> None:
    params = _project(tmp_path, monkeypatch)
    high = compare(params, "tiny", threshold=5.0)[0]  # fedprox's interval, about [+1.4, +2.9], is below 5
    assert high.verdicts["beats"] == "does not hold" and high.threshold == 5.0
    against_lc = compare(params, "tiny", baseline="fedlc")
    assert [c.method for c in against_lc[:2]] == ["fedavg", "fedprox"]


def test_a_diverged_seed_fails_the_method_and_leaves_the_baselines_pairing(tmp_path, monkeypatch) -> None:
    params = _project(tmp_path, monkeypatch, diverged=("fedprox", 1))
    fedprox = compare(params, "tiny")[0]
    assert fedprox.verdicts == {"beats": "does not hold", "at least as good": "does not hold"}
    assert fedprox.diverged == {"fedprox": (1,)} and fedprox.seeds == (0, 2)
    other = tmp_path / "other"
    other.mkdir()
    params = _project(other, monkeypatch, diverged=("fedavg", 2))
    fedprox = compare(params, "tiny")[0]
    assert fedprox.seeds == (0, 1) and fedprox.diverged == {"fedavg": (2,)}
    # +2, +2.5 on the seeds left: two seeds, t(0.975, 1) = 12.7, an interval of ±3.2 around +2.25
    assert fedprox.verdicts["beats"] == "inconclusive" and fedprox.effect.low < 0 < fedprox.effect.high


def test_the_command_prints_writes_and_refuses_what_it_cannot_compare(tmp_path, monkeypatch, capsys) -> None:
    params = _project(tmp_path, monkeypatch)
    assert main(["compare", "--suite", "tiny"]) == 0
    page = capsys.readouterr().out
    mean, low, high = _expected("fedprox")
    assert f"| digits / dir0.5 | fedprox | 3 | {mean:+.2f} [{low:+.2f}, {high:+.2f}] | holds | holds |" in page
    assert main(["compare", "--suite", "tiny", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert records[0]["mean"] == pytest.approx(mean) and records[0]["verdicts"]["beats"] == "holds"
    written = write_comparison(compare(params, "tiny"), tmp_path)
    assert [p.name for p in written] == ["tiny.md", "tiny.csv", "tiny.json"]
    assert json.loads(written[2].read_text()) == records
    with pytest.raises(ConfigError, match="--baseline 'scaffold' is not a method of suite 'tiny'"):
        compare(params, "tiny", baseline="scaffold")
    assert main(["compare", "--suite", "nope"]) == 2
    assert "'nope' is not a suite" in capsys.readouterr().err
