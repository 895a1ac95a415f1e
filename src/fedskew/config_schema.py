"""params.yaml as a document: read strictly, checked against its JSON schema, each problem one line.

Reading is fedskew.user_files' (a key written twice, an alias bomb, a file that is not a regular UTF-8 file of
the project: refused naming the file and the line). Then every float must be finite
(YAML's .nan and .inf are floats, which JSON Schema's range checks let through), then the schema in
workflow/schemas/params.schema.yaml, with the methods and dataset sources of fedskew.catalog filled in, checks
types, ranges, known names and known keys. Each violation becomes one line naming the key, the bad value and what
is allowed.
The checks that relate sections to each other follow in fedskew.config_checks; fedskew.config runs both.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from fedskew import catalog, user_files
from fedskew.config_errors import short_value, suggestion
from fedskew.declarations import method_schema, source_schema

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = PROJECT_ROOT / "workflow" / "schemas" / "params.schema.yaml"


_where = user_files.key_path  # a key path as params.yaml's readers name it: `suites.tiny.seeds[1]`


def _describe(error, root_schema: dict) -> str:
    """One line per schema violation: key, bad value, what is allowed."""
    where, value, schema, kind = _where(error.absolute_path), error.instance, error.schema, error.validator
    if kind == "type":
        return f"{where}: {short_value(value)} has the wrong type; expected {error.validator_value}"
    if kind in ("enum", "const"):
        allowed = error.validator_value if kind == "enum" else [error.validator_value]
        return (f"{where}: {short_value(value)} is not allowed{suggestion(value, allowed)}; "
                f"allowed: {', '.join(map(str, allowed))}")
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[kind]
        return f"{where}: {short_value(value)} is out of range; must be {op} {error.validator_value}"
    if kind in ("additionalProperties", "unevaluatedProperties"):
        allowed = set(schema.get("properties", {}))
        if "$ref" in schema:  # training sections: the fields live in a referenced definition
            allowed |= set(root_schema["$defs"][schema["$ref"].split("/")[-1]].get("properties", {}))
        extra = ", ".join(re.findall(r"'([^']+)'", error.message.split("(")[-1]))
        return f"{where}: unknown key(s) {extra}; allowed: {', '.join(sorted(allowed)) or 'none'}"
    if kind == "required":
        return f"{where}: {error.message}"
    if kind == "pattern":
        return f"{where}: {short_value(value)} is not a valid name; use letters, digits, '_', '.', '-'"
    if kind in ("minItems", "minProperties"):
        return f"{where}: must not be empty"
    if kind == "uniqueItems":
        return f"{where}: {_twice(value) or short_value(value) + ' has duplicates'}; keep one"
    return f"{where}: {error.message}"


def _twice(items: list) -> str:
    """The items of a list that repeat an earlier one, with both positions: "'fedavg' is listed twice (items 0, 2)"."""
    first: dict[str, int] = {}
    repeats = []
    for i, item in enumerate(items):
        key = json.dumps(item, sort_keys=True, default=str)
        if key in first:
            repeats.append(f"{short_value(item)} is listed twice (items {first[key]}, {i})")
        else:
            first[key] = i
    return "; ".join(repeats)


def _non_finite(node: Any, path: tuple = ()) -> list[tuple[str, float]]:
    """(key path, value) of every float in a parsed document that is NaN or ±inf."""
    if isinstance(node, float):
        return [] if math.isfinite(node) else [(_where(path), node)]
    if isinstance(node, dict):
        return [found for key, value in node.items() for found in _non_finite(value, (*path, key))]
    if isinstance(node, list):
        return [found for i, value in enumerate(node) for found in _non_finite(value, (*path, i))]
    return []


def _yaml_spelling(value: float) -> str:
    """NaN and ±inf as params.yaml writes them."""
    return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"


def read_params_file(path: Path) -> Any:
    """Parse params.yaml strictly (fedskew.user_files: a key written twice, an alias that expands too far, a file
    that is not a regular UTF-8 file inside the project, each refused naming the file and the line)."""
    return user_files.load(Path(path), Path(path).parent, str(path)).data


@cache
def params_schema() -> dict:
    """The schema of params.yaml (workflow/schemas/params.schema.yaml) with the methods and the dataset sources of
    fedskew.catalog and the partition schemes of fedskew.data.partitions filled in.

    `algorithm` takes the name of every method (built-in or a plugin's), and each method's clause its declared
    hyperparameters (fedskew.declarations.method_schema).

    Likewise `source` takes the name of every dataset source, and each source's clause its declared options
    (fedskew.declarations.source_schema), and `scheme` the name of every partition scheme, each scheme's clause
    its declared parameters (fedskew.data.partitions.parameters.scheme_schema), and a training section's `model`
    the name of every model (fedskew.catalog.models): the schema file names no method, no source, no scheme and
    no model. Parsed once per process (about 0.1 s; tests validate hundreds of files).
    """
    schema = yaml.load(SCHEMA_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    method = schema["$defs"]["method"]
    method["properties"]["algorithm"] = {"enum": list(catalog.methods())}
    method["allOf"] = [method_schema(name, record) for name, record in catalog.methods().items()]
    dataset = schema["$defs"]["dataset"]
    dataset["properties"]["source"] = {"enum": list(catalog.sources())}
    dataset["allOf"] = [source_schema(name, source.schemas) for name, source in catalog.sources().items()]
    schema["$defs"]["training_fields"]["properties"]["model"] = {"enum": list(catalog.models())}
    # The schemes import numpy only, so their clauses come from the classes (built-in and plugins'), with no
    # derived file; imported here, not with this module, so that a broken plugin fails validation, not imports.
    from fedskew.data.partitions.parameters import scheme_schema
    from fedskew.data.partitions.registry import SCHEME_CLASSES

    partition = schema["$defs"]["partition"]
    partition["properties"]["scheme"] = {"enum": list(SCHEME_CLASSES)}
    partition["allOf"] = [scheme_schema(name, cls.parameters) for name, cls in SCHEME_CLASSES.items()]
    return schema


@cache
def _schema_validator():
    import jsonschema

    schema = params_schema()
    # JSON Schema counts 10.0 as an integer; training would then crash on range(10.0). Here an
    # integer must be written as one.
    strict_types = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=strict_types)(schema)


def _schema_errors(raw: Any) -> list[str]:
    validator = _schema_validator()
    schema = validator.schema
    messages = []
    for error in validator.iter_errors(raw):
        # if/then branches report through their leaf errors; skip the wrapper messages.
        leaves = [e for e in (error.context or [])] or [error]
        messages.extend(_describe(e, schema) for e in leaves)
    return sorted(set(messages))


def schema_problems(raw: Any) -> list[str]:
    """The problems of a parsed params.yaml that need no second section: each non-finite number, then each schema
    violation (a NaN or ±inf that also breaks a range is reported once, as not finite)."""
    non_finite = _non_finite(raw)
    problems = [f"{where}: {_yaml_spelling(value)} is not a finite number; write a finite number"
                for where, value in non_finite]
    reported = tuple(f"{where}: " for where, _ in non_finite)
    return problems + [line for line in _schema_errors(raw) if not line.startswith(reported)]
