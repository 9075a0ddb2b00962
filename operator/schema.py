"""Turn pydantic's JSON schema into a Kubernetes structural schema, check it, default and walk objects with it.

Kubernetes accepts only structural schemas in a CRD: every node has a `type` (or is int-or-string), no
`$ref`, no `anyOf` that carries types (except the int-or-string pair), no `additionalProperties: false`,
and `exclusiveMinimum`/`exclusiveMaximum` in the OpenAPI v3.0 (boolean) form. `to_structural` inlines
pydantic's definitions, folds `X | None` into `X`, and rewrites the rest; `structural_problems` reports
what would still be refused; `apply_defaults` defaults an object the way the API server does before it
validates; `iter_rules` yields each CEL rule with the value it applies to, for tests that evaluate them.

Boundary: pure functions on plain dicts.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

Schema = dict[str, Any]

_KEY_ORDER = (
    "description", "type", "format", "enum", "default", "minimum", "exclusiveMinimum", "maximum",
    "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "maxProperties",
    "x-kubernetes-int-or-string", "anyOf", "required", "properties", "additionalProperties", "items",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-validations",
)  # fmt: skip
_DROPPED = ("title", "$defs")
_NULL = {"type": "null"}


JSON_SCHEMA_PROPS = frozenset(
    {
        "description", "type", "format", "title", "default", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
        "multipleOf", "enum", "maxProperties", "minProperties", "required", "items", "allOf", "oneOf",
        "anyOf", "not", "properties", "additionalProperties", "nullable", "example", "externalDocs",
        "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
        "x-kubernetes-list-map-keys", "x-kubernetes-list-type", "x-kubernetes-map-type", "x-kubernetes-validations",
    }
)  # fmt: skip
"""The keywords of apiextensions.k8s.io/v1 JSONSchemaProps; the API server refuses any other."""


class SchemaError(ValueError):
    """The model's JSON schema has a shape this converter cannot express structurally."""


def to_structural(schema: Schema) -> Schema:
    """A structural OpenAPI v3 schema equivalent to pydantic's JSON schema `schema`."""
    defs: dict[str, Schema] = schema.get("$defs", {})
    return _convert(schema, defs, "")


def _convert(node: Schema, defs: dict[str, Schema], path: str) -> Schema:
    node = dict(node)
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        base = _convert(defs[name], defs, path)
        base.update({k: v for k, v in _convert(node, defs, path).items() if k != "type" or "type" not in base})
        return _ordered(base)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b != _NULL]
        nullable = "default" in node and node["default"] is None
        if nullable:
            node.pop("default")
        if len(branches) == 1:
            inner = _convert(branches[0], defs, path)
            inner.update(_convert(node, defs, path))
            return _ordered(inner)
        types = {b.get("type") for b in branches}
        if types == {"integer", "string"}:
            pattern = next((b["pattern"] for b in branches if b.get("type") == "string" and "pattern" in b), None)
            node.pop("x-kubernetes-int-or-string", None)
            out = _convert(node, defs, path)
            out["x-kubernetes-int-or-string"] = True
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            if pattern is not None:
                out["pattern"] = pattern
            return _ordered(out)
        raise SchemaError(f"{path or '<root>'}: cannot express anyOf with types {sorted(map(str, types))} structurally")
    out = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs, f"{path}[]")
        elif key == "x-kubernetes-validations":
            out[key] = [{k: rule[k] for k in ("rule", "message", "fieldPath") if k in rule} for rule in value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" in out:
        required = set(out.get("required", ()))
        for name, sub in out["properties"].items():
            # A nested object built by a default factory (pydantic writes no default for it, where an
            # optional field has `default: null`): `{}` lets the API server default its fields.
            factory = "default" not in node["properties"][name]
            if name not in required and factory and sub.get("type") == "object" and "properties" in sub:
                out["properties"][name] = _ordered({**sub, "default": {}})
    return _ordered(out)


def _ordered(node: Schema) -> Schema:
    if node.get("x-kubernetes-preserve-unknown-fields") and node.get("additionalProperties") is True:
        node = {k: v for k, v in node.items() if k != "additionalProperties"}  # a free-form object: the flag says it
    rank = {key: i for i, key in enumerate(_KEY_ORDER)}
    return dict(sorted(node.items(), key=lambda kv: rank.get(kv[0], len(rank))))


def structural_problems(schema: Schema, path: str = "", field: bool = False) -> list[str]:
    """Reasons the API server would refuse `schema` as structural, or leave a field undocumented.

    `field`: the node is a named property, which must have a description (array items and map values
    are described by their field)."""
    where = path or "<root>"
    problems: list[str] = []
    if "$ref" in schema:
        problems.append(f"{where}: $ref is not allowed")
    unknown = sorted(set(schema) - JSON_SCHEMA_PROPS)
    if unknown:
        problems.append(f"{where}: keywords {unknown} are not part of a CRD schema")
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    if int_or_string:
        if "type" in schema:
            problems.append(f"{where}: int-or-string must not set type")
        if schema.get("anyOf", [{"type": "integer"}, {"type": "string"}]) != [{"type": "integer"}, {"type": "string"}]:
            problems.append(f"{where}: int-or-string allows only anyOf [integer, string]")
    elif "type" not in schema:
        problems.append(f"{where}: no type")
    elif "anyOf" in schema or "oneOf" in schema:
        problems.append(f"{where}: anyOf/oneOf with types is not structural")
    if field and not schema.get("description"):
        problems.append(f"{where}: no description")
    if schema.get("additionalProperties") is False:
        problems.append(f"{where}: additionalProperties false is not allowed")
    if "properties" in schema and "additionalProperties" in schema:
        problems.append(f"{where}: properties and additionalProperties are exclusive")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in schema and not isinstance(schema[key], bool):
            problems.append(f"{where}: {key} must be a boolean in OpenAPI v3.0")
    if "enum" in schema and schema.get("type") == "string":
        bad = [v for v in schema["enum"] if not isinstance(v, str)]
        if bad:
            problems.append(f"{where}: enum values {bad} are not strings")
    if schema.get("x-kubernetes-list-type") == "map":
        items = schema.get("items", {})
        for key in schema.get("x-kubernetes-list-map-keys", ()):
            if key not in items.get("required", ()) and "default" not in items.get("properties", {}).get(key, {}):
                problems.append(f"{where}: list map key {key} must be required or defaulted")
    for name, sub in schema.get("properties", {}).items():
        problems.extend(structural_problems(sub, f"{path}.{name}", field=True))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            problems.extend(structural_problems(schema[key], f"{path}[]" if key == "items" else f"{path}{{}}"))
    return problems


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """A copy of `obj` defaulted as the API server does: missing properties with a default get it (nested
    objects defaulted to `{}` then get their own defaults); arrays and maps are defaulted element-wise."""
    obj = copy.deepcopy(obj)
    _default_in_place(schema, obj)
    return obj


def _default_in_place(schema: Schema, obj: Any) -> None:
    if isinstance(obj, dict):
        props = schema.get("properties")
        if props is not None:
            for name, sub in props.items():
                if name not in obj and "default" in sub:
                    obj[name] = copy.deepcopy(sub["default"])
                if name in obj:
                    _default_in_place(sub, obj[name])
        elif isinstance(schema.get("additionalProperties"), dict):
            for value in obj.values():
                _default_in_place(schema["additionalProperties"], value)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            _default_in_place(schema["items"], item)


def iter_rules(schema: Schema, obj: Any, path: str = "") -> Iterator[tuple[str, dict[str, str], Any]]:
    """Every CEL rule that applies to `obj` (already defaulted): (path, rule, the value bound to `self`)."""
    for rule in schema.get("x-kubernetes-validations", ()):
        yield path, rule, obj
    if isinstance(obj, dict):
        props = schema.get("properties")
        if props is not None:
            for name, sub in props.items():
                if name in obj:
                    yield from iter_rules(sub, obj[name], f"{path}.{name}")
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, value in obj.items():
                yield from iter_rules(schema["additionalProperties"], value, f"{path}[{key}]")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            yield from iter_rules(schema["items"], item, f"{path}[{i}]")
