"""Claims of one's own: a researcher's sentences about their own suites, in the ledger's claim format.

A claims file, `experiments/claims/<name>.yaml` (the ledger `results/claims/<name>.md` is built from it):

    suite: focal                    # the suite the claims are about: its grid is their table
    protocols:                      # optional: the same grid under other protocols, each run by another suite
      5 local epochs: focal_e5      #   label: suite (or a list of suites, each labelled by its name)
    claims:
      - id: focal-01
        statement: FedFocal beats FedAvg under strong label skew
        word: beats                 # a word of the policy (policy.yaml): its threshold and tie rule
        subject: fedfocal           # rows: the suite's methods
        against: [fedavg]
        columns: [digits / dir0.1]  # columns: the suite's settings, "<dataset> / <partition>"

The suite's grid is the table: rows its methods, columns its settings, each cell the final-round value of the
file's `metric` (optional; the reported accuracy by default) of each seed's run, read from the run files as the
papers' tables read theirs (`tables.read_cell`). A protocol is another suite run on the same grid (more local
epochs, another learning rate): its cells are matched by dataset, partition and method, as a paper layout's
protocols move cells to other suites (`layouts`), and a cell it does not run is not part of it. A claim may name
its own `suite:` and `protocols:` (they replace the file's; `protocols: {}` names none). Every other field means
what it means in a paper's claim (`claim`: word, x, subject, against, columns, pairs, order, for_each, along,
direction, better, quantifier, reading); `kind` may be left out (it is the word's), and `quote`, `section` and
`note` are optional. A file that does not fit (an unknown suite, method, setting, word or key; a field of the
wrong shape) is refused with the file, each claim's problem and what to write instead, before any run is read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from fedskew import metrics, paths, user_files
from fedskew.config import ConfigError, Params, RunConfig
from fedskew.config_errors import suggestion
from fedskew.reproduce.claim import Claim, ClaimError, check_claim
from fedskew.reproduce.layouts import Layout, paper_table_metrics
from fedskew.reproduce.policy import load_policy, magnitude_problem
from fedskew.reproduce.tables import cell_runs

CLAIMS_FOLDER = Path("experiments/claims")
LEDGER = "results/claims/{name}.{ext}"
FILE_KEYS = ("suite", "protocols", "metric", "claims")
CLAIM_KEYS = ("id", "statement", "quote", "section", "note", "kind", "word", "x", "subject", "against", "columns",
              "pairs", "order", "for_each", "along", "direction", "better", "quantifier", "reading", "reading_note",
              "suite", "protocols")
PRINTED_DECIMALS = 2   # a suite's numbers print as its tables print them (fedskew.report)


@dataclass(frozen=True)
class SuiteGrid:
    """A suite's grid as a claim's table (what a `Layout` reads of a paper table): rows its methods, columns its
    settings; no printed numbers."""

    id: str
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    decimals: int = PRINTED_DECIMALS
    cells: dict = field(default_factory=dict)
    notes: tuple = ()


@dataclass(frozen=True)
class OwnClaims:
    """A claims file, checked: its claims and, for each, the layout of its suite's grid and protocols."""

    shown: str                       # the file as messages and the ledger name it
    name: str                        # the ledger's: results/claims/<name>.md
    claims: tuple[Claim, ...]
    layouts: dict[str, Layout]       # claim id -> its grid, with its protocols
    protocols: dict[str, dict[str, str]]  # claim id -> protocol label -> suite

    @property
    def suites(self) -> list[str]:
        """Every suite the ledger reads: each claim's and each of its protocols'."""
        named = [s for c in self.claims for s in (c.table, *self.protocols[c.id].values())]
        return list(dict.fromkeys(named))

    def runs(self, params: Params) -> list[RunConfig]:
        """The runs whose files the ledger reads: every cell of each grid, under every protocol."""
        runs: dict[str, RunConfig] = {}
        for layout in {id(v): v for v in self.layouts.values()}.values():
            for row in layout.table.rows:
                for column in layout.table.columns:
                    for protocol in (None, *layout.protocols):
                        spec = layout.cell(row, column, protocol)
                        if not spec.not_run:
                            runs.update((cfg.path(paths.RUN_DIR).as_posix(), cfg) for cfg in cell_runs(params, spec))
        return list(runs.values())


def claims_files(folder: Path = CLAIMS_FOLDER) -> list[Path]:
    """The claims files of a folder, by name (none if it does not exist): its `*.yaml`, without hidden files and
    editors' lock and backup files (fedskew.user_files.yaml_files)."""
    return user_files.yaml_files(folder, (".yaml",))


def ledger_path(path: Path, ext: str) -> str:
    """Where the ledger of a claims file goes: results/claims/<its name>.<ext>."""
    return LEDGER.format(name=Path(path).stem, ext=ext)


def suite_layout(params: Params, suite: str, protocols: dict[str, str], metric: str) -> Layout:
    """A suite's grid as a layout: rows its methods, columns its settings, each protocol moving every cell to
    another suite (`Layout.cell`: a cell that suite does not run is not part of it)."""
    body = params.raw["suites"][suite]
    settings = {f"{s['dataset']} / {p}": {"dataset": s["dataset"], "partition": p}
                for s in body["settings"] for p in s["partitions"]}
    grid = SuiteGrid(suite, tuple(body["methods"]), tuple(settings))
    return Layout(table=grid, defaults={"suite": suite}, rows={m: {"method": m} for m in body["methods"]},
                  columns=settings, protocols={label: {"suite": {suite: other}} for label, other in protocols.items()},
                  metric=metric)


def _read(path: Path, shown: str) -> user_files.Document:
    """A claims file, read strictly (fedskew.user_files), in the shape of one, its numbers checked."""
    if not os.path.lexists(path):
        raise ConfigError(f"{shown}: no such claims file; claims of your own go in {CLAIMS_FOLDER}/<name>.yaml "
                          "(docs/reproducing-papers.md, \"Claims of your own\")")
    parsed = user_files.load(path, user_files.project_of(path), shown)
    doc = parsed.data
    if not isinstance(doc, dict):
        raise ConfigError(f"{shown}: a claims file is a mapping of {', '.join(FILE_KEYS)}, not a "
                          f"{type(doc).__name__}")
    problems = [f"`{key}` is not a key of a claims file{suggestion(key, FILE_KEYS)}; its keys: {', '.join(FILE_KEYS)}"
                for key in doc if key not in FILE_KEYS]
    if not isinstance(doc.get("claims"), list) or not doc["claims"]:
        problems.append("it lists no claims: write `claims:` with a list of them, each with an id, a statement "
                        "and a word")
    metric = doc.get("metric", metrics.reported_key())
    if metric not in paper_table_metrics():
        problems.append(f"metric {metric!r} is not a final-round metric{suggestion(metric, paper_table_metrics())}; "
                        f"allowed: {', '.join(paper_table_metrics())}")
    problems += _number_problems(parsed)
    if problems:
        raise ConfigError(f"{shown} is invalid ({len(problems)} problem(s)):\n  - " + "\n  - ".join(problems))
    return parsed


def _number_problems(parsed: user_files.Document) -> list[str]:
    """Each number of a claims file that cannot be what it says, at its line and key: a magnitude `x` must be a
    finite number >= 0 (fedskew.reproduce.policy.magnitude_problem), and no number anywhere may be NaN or ±inf."""
    found: list[tuple[int, str]] = []
    stack: list[tuple[tuple, object]] = [((), parsed.data)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            stack += [((*path, key), value) for key, value in node.items()]
        elif isinstance(node, list):
            stack += [((*path, index), value) for index, value in enumerate(node)]
        if len(path) == 3 and path[0] == "claims" and path[2] == "x":
            problem = magnitude_problem(node)
        elif isinstance(node, float) and not math.isfinite(node):
            problem = f"{'.nan' if math.isnan(node) else '.inf' if node > 0 else '-.inf'} is not a finite number"
        else:
            continue
        if problem is not None:
            found.append((parsed.line(path), f"line {parsed.line(path)}: {user_files.key_path(path)}: {problem}"))
    return [text for _, text in sorted(found)]


def _grid_points(params: Params, suite: str) -> set[tuple[str, str, str]]:
    body = params.raw["suites"][suite]
    return {(s["dataset"], p, m) for s in body["settings"] for p in s["partitions"] for m in body["methods"]}


def _suite_problem(params: Params, suite: object, what: str) -> str | None:
    if isinstance(suite, str) and suite in params.raw["suites"]:
        return None
    return (f"{what} {suite!r} is not a suite of params.yaml or experiments/{suggestion(suite, params.raw['suites'])}; "
            "`python -m fedskew suites` lists them")


def _protocols(raw: object, params: Params, suite: str, prefix: str = "") -> tuple[dict[str, str], list[str]]:
    """The protocols of a claim (or of the file) on `suite`'s grid, label -> suite, and the problems with them
    (each message after `prefix`)."""
    if raw is None:
        return {}, []
    if isinstance(raw, list):
        raw = {str(other): other for other in raw}
    if not isinstance(raw, dict):
        return {}, [f"{prefix}protocols must map a label to a suite ({{5 local epochs: focal_e5}}) or list suites, "
                    f"not {raw!r}"]
    protocols, problems = {}, []
    for label, other in raw.items():
        if problem := _suite_problem(params, other, f"{prefix}protocol {label!r}: suite"):
            problems.append(problem)
        elif other == suite:
            problems.append(f"{prefix}protocol {label!r} is suite {suite!r} itself: a protocol is another suite that "
                            "runs the same grid under another protocol")
        elif not _grid_points(params, suite) & _grid_points(params, other):
            problems.append(f"{prefix}protocol {label!r}: suite {other!r} runs none of suite {suite!r}'s grid points "
                            "(dataset, partition, method): a protocol runs the same grid under another protocol")
        else:
            protocols[str(label)] = other
    return protocols, problems


def _claim_problems(raw: dict, who: str, doc: dict, params: Params) -> list[str]:
    """What a claim's keys, statement, word and suite lack (its fields are `check_claim`'s)."""
    problems = [f"{who}: `{key}` is not a key of a claim{suggestion(key, CLAIM_KEYS)}; a claim's keys: "
                f"{', '.join(CLAIM_KEYS)}" for key in raw if key not in CLAIM_KEYS]
    if not isinstance(raw.get("statement"), str):
        problems.append(f"{who}: it has no statement: write the sentence it checks (`statement:`)")
    words = load_policy().words
    word = raw.get("word")
    if word is None:
        problems.append(f"{who}: it names no word: write `word:`, one of: {', '.join(words)} (policy.yaml)")
    elif word not in words:
        problems.append(f"{who}: word {word!r} is not in policy.yaml{suggestion(word, words)}; its words: "
                        f"{', '.join(words)}")
    if "suite" in raw:  # the file's own suite is checked once, for the file
        if problem := _suite_problem(params, raw["suite"], f"{who}: suite"):
            problems.append(problem)
    elif doc.get("suite") is None:
        problems.append(f"{who}: it names no suite: write `suite:` at the top of the file (or in the claim)")
    return problems


def _claim(raw: object, index: int, doc: dict, params: Params, shown: str) -> tuple[Claim | None, dict, list[str]]:
    """One claim of the file (None where it has problems), its protocols, and its problems."""
    if not isinstance(raw, dict):
        return None, {}, [f"claim #{index}: a claim is a mapping (id, statement, word, ...), not {raw!r}"]
    if not isinstance(raw.get("id"), str) or not raw["id"]:
        return None, {}, [f"claim #{index}: it has no id: write `id: {Path(shown).stem}-{index:02d}`"]
    who = f"claim {raw['id']}"
    problems = _claim_problems(raw, who, doc, params)
    suite = raw.get("suite", doc.get("suite"))
    if problems or not isinstance(suite, str) or suite not in params.raw["suites"]:  # reported for the file
        return None, {}, problems
    if "protocols" in raw or suite != doc.get("suite"):  # the file's protocols on the file's suite: checked once
        protocols, problems = _protocols(raw.get("protocols", doc.get("protocols")), params, suite, f"{who}: ")
    else:
        protocols, problems = _protocols(doc.get("protocols"), params, suite)
        problems = []
    kind = raw.get("kind", load_policy().word(raw["word"]).kind)
    claim = Claim(id=raw["id"], paper=shown, section=str(raw.get("section", "")), quote=str(raw.get("quote", "")),
                  statement=raw["statement"], kind=kind, table=suite, word=raw["word"], raw={**raw, "kind": kind})
    body = params.raw["suites"][suite]
    try:
        check_claim(claim, body["methods"], suite_layout(params, suite, {}, metrics.reported_key()).table.columns,
                    table_name=f"suite {suite!r}", listed=True, nouns=("methods", "settings"))
    except ClaimError as error:
        problems.append(str(error))
    return (None if problems else claim), protocols, problems


def load_own_claims(path: Path, params: Params) -> OwnClaims:
    """A claims file, checked against params.yaml (with experiments/) and the policy: a ConfigError naming the
    file and listing every claim's problem with what to write instead."""
    shown = Path(path).as_posix()
    doc = _read(Path(path), shown).data
    metric = doc.get("metric", metrics.reported_key())
    claims, layouts, protocols, problems = [], {}, {}, []
    if doc.get("suite") is not None and (problem := _suite_problem(params, doc["suite"], "suite")):
        problems.append(problem)
    elif doc.get("suite") is not None:
        problems += _protocols(doc.get("protocols"), params, doc["suite"])[1]
    for index, raw in enumerate(doc["claims"], start=1):
        claim, named, found = _claim(raw, index, doc, params, shown)
        problems += [p for p in found if p not in problems]
        if claim is None:
            continue
        if claim.id in protocols:
            problems.append(f"claim {claim.id}: the id is given twice; give each claim an id of its own")
            continue
        claims.append(claim)
        protocols[claim.id] = named
    if problems:
        raise ConfigError(f"{shown} is invalid ({len(problems)} problem(s)):\n  - " + "\n  - ".join(problems))
    cache: dict[tuple, Layout] = {}
    for claim in claims:
        key = (claim.table, tuple(protocols[claim.id].items()))
        if key not in cache:
            cache[key] = suite_layout(params, claim.table, protocols[claim.id], metric)
        layouts[claim.id] = cache[key]
    return OwnClaims(shown, Path(path).stem, tuple(claims), layouts, protocols)
