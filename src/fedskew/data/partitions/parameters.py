"""What a partition scheme declares about its parameters, as plain data: each `Parameter`'s type, the values
params.yaml may give it and its default (none: params.yaml must give it).

The JSON schema of a partition's entry in params.yaml is derived from these declarations (`scheme_schema`,
filled in by fedskew.config_schema.params_schema), so workflow/schemas/params.schema.yaml names no scheme and
no parameter. Range checks that need the dataset (clients against its samples, alpha against its classes) are
the scheme's `check`, which fedskew.config runs before any job.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedskew.declarations import numbers_problem

# The shared definitions of params.schema.yaml a parameter may name instead of a range (`ref`), with the type
# of value each holds (tests/unit/test_partition_plugins.py compares them with the file).
SCHEMA_REFS: dict[str, type] = {"sample_count": int, "round_count": int, "epoch_count": int, "seed": int,
                                "fraction": float}

_BOUNDS = ("minimum", "maximum", "exclusive_minimum", "exclusive_maximum")


@dataclass(frozen=True)
class Parameter:
    """One parameter of a scheme: its type (int or float), the values params.yaml may give it, its default.

    Without a default (None) params.yaml must give it. An int needs a `maximum` (params.yaml bounds every
    integer), unless `ref` names a definition of params.schema.yaml that bounds it (SCHEMA_REFS): a count of
    clients or samples is `Parameter(int, ref="sample_count")`.
    """

    type: type
    default: int | float | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    ref: str = ""

    @property
    def required(self) -> bool:
        return self.default is None

    def problem(self) -> str | None:
        """What makes this declaration unusable, or None."""
        if self.type not in (int, float):
            return f"its type is {self.type!r}; declare int or float"
        bounds = {key: getattr(self, key) for key in _BOUNDS if getattr(self, key) is not None}
        if self.ref:
            if self.ref not in SCHEMA_REFS:
                return f"ref {self.ref!r} is not one of {', '.join(SCHEMA_REFS)}"
            if SCHEMA_REFS[self.ref] is not self.type:
                return f"ref {self.ref!r} holds {SCHEMA_REFS[self.ref].__name__} values, not {self.type.__name__}"
            if bounds:
                return "give a ref or bounds, not both (the ref's definition holds the bounds)"
        elif self.type is int and self.maximum is None:
            return "an int needs a `maximum` (params.yaml bounds every integer) or a ref such as 'sample_count'"
        if self.default is not None and (isinstance(self.default, bool) or
                                         not isinstance(self.default, int if self.type is int else (int, float))):
            return f"the default {self.default!r} is not of its type, {self.type.__name__}"
        # finite bounds that leave a value, and a finite default that keeps them (as a method's hyperparameters)
        return numbers_problem(self.default, bounds)

    def schema(self) -> dict:
        """The JSON schema of the values params.yaml may give it."""
        if self.ref:
            return {"$ref": f"#/$defs/{self.ref}"}
        names = {"minimum": "minimum", "maximum": "maximum", "exclusive_minimum": "exclusiveMinimum",
                 "exclusive_maximum": "exclusiveMaximum"}
        return {"type": "integer" if self.type is int else "number",
                **{names[key]: getattr(self, key) for key in _BOUNDS if getattr(self, key) is not None}}


def scheme_schema(name: str, parameters: dict[str, Parameter]) -> dict:
    """The if/then clause of params.schema.yaml's `partition` for scheme `name`: exactly its parameters, the
    ones without a default required."""
    required = [key for key, declared in parameters.items() if declared.required]
    then = {"additionalProperties": False, **({"required": required} if required else {}),
            "properties": {"scheme": True, **{key: declared.schema() for key, declared in parameters.items()}}}
    return {"if": {"properties": {"scheme": {"const": name}}}, "then": then}
