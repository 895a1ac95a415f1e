"""`snakemake --report` on a tiny suite: every table, figure and partition heatmap is in the report."""

from __future__ import annotations

import base64
import sys
import zipfile
from pathlib import Path

import pytest

from fedskew.reproduce.paper_tables import paper_table_ids
from tests.helpers import make_copy, run, venv_bin

pytestmark = pytest.mark.slow

# What the paper_table and claims rules run, in one process (25 jobs would each start Python and torch).
WRITE_REPRODUCTION = """
from fedskew.cli import cmd_claims, cmd_paper_table
from fedskew.config import load_params
from fedskew.reproduce.paper_tables import paper_table_ids
import argparse
params = load_params("params.yaml")
for table in paper_table_ids():
    cmd_paper_table(params, argparse.Namespace(table=table))
cmd_claims(params, argparse.Namespace())
"""


def embedded(html: str, path: Path) -> bool:
    """Whether the self-contained HTML report carries the file, byte for byte, under its name."""
    return f"filename={path.name};base64,{base64.b64encode(path.read_bytes()).decode()}" in html


def test_the_report_holds_every_table_figure_heatmap_and_the_reproduction(tmp_path, tiny_params) -> None:
    tiny_params["suites"]["tiny"]["seeds"] = [0]
    tiny_params["reproduce"] = {"suites": ["tiny"]}
    root = make_copy(tmp_path, tiny_params)
    built = run([venv_bin("snakemake"), "--cores", "2"], root, FEDSKEW_TRACKING="0")
    assert built.returncode == 0, built.stderr[-4000:]

    tables = sorted((root / "results/tables").glob("tiny.*"))
    shown_tables = [p for p in tables if p.suffix in (".md", ".csv")]
    figures = sorted((root / "results/figures/tiny").glob("*.png"))
    heatmaps = sorted((root / "data/partitions").glob("*/*/seed*.png"))
    assert [p.name for p in shown_tables] == ["tiny.csv", "tiny.md"]
    assert [p.name for p in figures] == ["digits_dir0.5.png", "digits_dir0.5_final.png", "digits_q2.png",
                                         "digits_q2_final.png"]
    assert len(heatmaps) == 2

    # The default target (`all`): the suites of run.suites with their tables, figures and heatmaps.
    report = run([venv_bin("snakemake"), "--report", "report.html"], root)
    assert report.returncode == 0, report.stderr[-4000:]
    html = (root / "report.html").read_text()
    for path in [*shown_tables, *figures, *heatmaps]:
        assert embedded(html, path), path
    assert "fedskew: federated and split-federated learning under label skew" in html  # workflow description
    assert '"suite tiny"' in html and '"final accuracy (dot plots)"' in html and '"partitions"' in html
    assert "best round is never reported" in html.replace("<strong>", "").replace("</strong>", "")
    assert "claims.md" not in html  # not built yet: report_all leaves it out rather than failing

    # The paper tables and the ledger, then `report_all` as a zip: every file under its own name.
    written = run([sys.executable, "-c", WRITE_REPRODUCTION], root, FEDSKEW_TRACKING="0")
    assert written.returncode == 0, written.stderr[-3000:]
    papers = sorted((root / "results/papers").glob("*.md"))
    assert len(papers) == len(paper_table_ids())
    claims = root / "results/claims.md"
    report = run([venv_bin("snakemake"), "--report", "report.zip", "report_all"], root)
    assert report.returncode == 0, report.stderr[-4000:]
    with zipfile.ZipFile(root / "report.zip") as archive:
        files = [(Path(name).name, archive.read(name)) for name in archive.namelist()
                 if not name.endswith("report.html")]
        page = archive.read(next(n for n in archive.namelist() if n.endswith("report.html"))).decode()
    members, by_content = dict(files), {content for _, content in files}
    for path in [*shown_tables, *figures, *papers, claims]:
        assert members.get(path.name) == path.read_bytes(), path
    for path in heatmaps:  # every heatmap is named seed0.png: check them by content
        assert path.read_bytes() in by_content, path
    assert '"papers"' in page and '"claims ledger"' in page and '"paper tables"' in page
