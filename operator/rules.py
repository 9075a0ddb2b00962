"""Cross-field rules of the CRD, written once as a CEL expression and once as the same check in Python.

A `Rule` carries the CEL text that the API server evaluates (`x-kubernetes-validations` in the CRD) and a
Python predicate that pydantic evaluates when the operator parses a spec, with one message for both. Tests
evaluate the CEL text with a CEL library and check that both sides agree on the same objects.

Rules see the object after defaulting, as the API server does: defaulted fields are always present, and
optional fields without a default are tested with `has()`.

Boundary: the rule record and the pydantic base class that applies rules and writes them into the JSON
schema; the rules themselves live next to the models they constrain.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel


@dataclass(frozen=True, slots=True)
class Rule:
    """One cross-field rule: `cel` for the API server, `check` for pydantic, `message` for both.

    field_path: where the API server reports a failure (a JSONPath below the object, e.g. `.initialSplit`),
    or "" for the object itself. detail: optional Python-side suffix with the offending values.
    """

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str = ""
    detail: Callable[[Any], str] | None = None

    def to_schema(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _add_rules(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_schema() for rule in rules]


class KubeModel(BaseModel):
    """Base of every CRD model: camelCase aliases, unknown fields rejected, `RULES` applied and exported."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        use_enum_values=False,
        json_schema_extra=_add_rules,
    )
    RULES: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _apply_rules(self) -> Any:
        failures = []
        for rule in type(self).RULES:
            if not rule.check(self):
                suffix = f" ({rule.detail(self)})" if rule.detail is not None else ""
                failures.append(rule.message + suffix)
        if failures:
            raise ValueError("; ".join(failures))
        return self

    @classmethod
    def from_kube(cls, data: Mapping[str, Any]) -> Self:
        """Parse an object as the API server holds it (JSON types, camelCase keys), strictly: a number
        written as a string is refused, as the CRD's schema refuses it."""
        return cls.model_validate_json(json.dumps(data), strict=True)

    def to_kube(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, enum values, unset optionals omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
