"""The files derived from the pieces' classes, which nobody edits by hand.

- src/fedskew/catalog.json: what each built-in method declares (fedskew.declarations.describe_method), for
  validation, which must not import torch (fedskew.catalog reads it);
- the method table of docs/methods.md, between its `<!-- derived -->` markers.

`python -m fedskew catalog --write` writes both from the classes; `python -m fedskew catalog` says whether they
are current, and tests/unit/test_catalog.py fails while one is not. A plugin's method is described from its
class when it is loaded, so nothing here lists it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedskew.catalog import CATALOG_FILE, describe_model
from fedskew.declarations import describe_method, describe_source

DOCS_FILE = Path(__file__).resolve().parents[2] / "docs" / "methods.md"
BEGIN = "<!-- derived: python -m fedskew catalog --write -->"
END = "<!-- end of derived -->"


def catalog_text() -> str:
    """catalog.json as the built-in pieces describe themselves: one section a kind of piece."""
    document = {"written_by": "python -m fedskew catalog --write, from the classes; do not edit",
                "methods": _methods(), "sources": _sources(), "models": _models()}
    return json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def _sources() -> dict[str, dict]:
    """Each built-in dataset source's record (fedskew.declarations.describe_source), by name."""
    from fedskew.data.datasets import built_in_sources

    return {name: describe_source(cls) for name, cls in built_in_sources().items()}


def _models() -> dict[str, dict]:
    """Each built-in model's record (fedskew.catalog.describe_model), in fedskew.models' order."""
    from fedskew.models import BUILT_IN

    return {name: describe_model(model) for name, model in BUILT_IN.items()}


def _methods() -> dict[str, dict]:
    """Each built-in method's record (fedskew.declarations.describe_method), in fedskew.algorithms' order."""
    from fedskew.algorithms import BUILT_IN

    return {name: describe_method(cls) for name, cls in BUILT_IN.items()}


def _value(value: object) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _allowed(schema: dict) -> str:
    """A hyperparameter's allowed values in a few words ("≥ 0", "0 to 1", "paper, authors_code")."""
    if "$ref" in schema:
        return schema["$ref"].split("/")[-1].replace("_", " ")
    if "enum" in schema:
        return ", ".join(map(str, schema["enum"]))
    if "oneOf" in schema:
        return " or ".join(_allowed(part) for part in schema["oneOf"])
    if schema.get("type") == "boolean":
        return "true, false"
    low = (f"≥ {schema['minimum']}" if "minimum" in schema else
           f"> {schema['exclusiveMinimum']}" if "exclusiveMinimum" in schema else "")
    high = (f"≤ {schema['maximum']}" if "maximum" in schema else
            f"< {schema['exclusiveMaximum']}" if "exclusiveMaximum" in schema else "")
    return ", ".join(part for part in (low, high) if part) or schema.get("type", "any")


def method_table(records: dict[str, dict]) -> str:
    """The method table of docs/methods.md: each method's family, panel, hyperparameters and what it is."""
    rows = ["| method | family | figure panel | hyperparameters: default (allowed) | what it is |",
            "| --- | --- | --- | --- | --- |"]
    for name, record in records.items():
        hps = "; ".join(f"`{key}` {_value(h['default'])} ({_allowed(h['schema'])})"
                        + (" *" if h["status"] else "") for key, h in record["hyperparameters"].items())
        summary = record["summary"].replace("|", "\\|")
        rows.append(f"| `{name}` | {record['family']} | {record['panel']} | {hps or 'none'} | {summary} |")
    return "\n".join(rows) + "\n\n\\* not the paper's own value, or the paper is silent: `python -m fedskew methods` " \
                             "says where each one comes from.\n"


def docs_text() -> str:
    """docs/methods.md with its derived table as the classes describe themselves."""
    text = DOCS_FILE.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    records = json.loads(catalog_text())["methods"]
    return text[:start] + "\n" + method_table(records) + text[end:]


def stale() -> list[str]:
    """The derived files that are not what the classes give (repository paths), empty when all are current."""
    return [str(path.relative_to(DOCS_FILE.parents[1])) for path, text in
            ((CATALOG_FILE, catalog_text()), (DOCS_FILE, docs_text())) if path.read_text() != text]


def write() -> list[str]:
    """Write every derived file that is stale; the paths written."""
    written = []
    for path, text in ((CATALOG_FILE, catalog_text()), (DOCS_FILE, docs_text())):
        if path.read_text() != text:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
            written.append(str(path.relative_to(DOCS_FILE.parents[1])))
    return written


def cmd_catalog(params: object, args: argparse.Namespace) -> int:
    """`fedskew catalog`: the derived files written with --write, else checked (exit 1 while one is stale)."""
    if args.write:
        written = write()
        print(f"wrote {', '.join(written)}" if written else "the derived files are current")
        return 0
    outdated = stale()
    if outdated:
        print(f"stale: {', '.join(outdated)}; run `python -m fedskew catalog --write`")
        return 1
    print("the derived files are current")
    return 0
