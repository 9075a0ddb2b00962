"""Parameter plumbing shared by the generators: documented fields, listing them, and overriding them by path.

Every generator parameter is a dataclass field declared with `param(default, source)`, where `source` says
where the default comes from in the paper or marks it as an assumption. `describe` flattens a parameter object
into `(path, value, source)` rows; `with_overrides` returns a copy with fields replaced by dotted path
(`"pause_s.mean"`, `"putnam.steps"`), re-running each dataclass's validation.

Boundary: pure functions over frozen dataclasses; no I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, TypeVar

from evolving_infra.workloads.dist import LogNormal

T = TypeVar("T")


class OverrideError(ValueError):
    """An override names no parameter, or gives a value of the wrong type or out of bounds."""


def param(default: Any, source: str) -> Any:
    """A dataclass field with a default and the documented origin of that default."""
    if isinstance(default, dict | list):
        frozen = default
        return dataclasses.field(default_factory=lambda: json.loads(json.dumps(frozen)), metadata={"source": source})
    if isinstance(default, tuple):
        return dataclasses.field(default_factory=lambda: default, metadata={"source": source})
    return dataclasses.field(default=default, metadata={"source": source})


def describe(params: object, prefix: str = "") -> list[tuple[str, object, str]]:
    """`(path, value, source)` for every parameter, nested parameter objects flattened with dotted paths."""
    rows: list[tuple[str, object, str]] = []
    for f in dataclasses.fields(params):  # type: ignore[arg-type]  # a parameter dataclass, typed object
        value = getattr(params, f.name)
        path = f"{prefix}{f.name}"
        source = str(f.metadata.get("source", ""))
        if dataclasses.is_dataclass(value) and not isinstance(value, LogNormal):
            rows.extend(describe(value, f"{path}."))
        else:
            rows.append((path, value, source))
    return rows


def to_jsonable(value: object) -> object:
    """Parameters as plain JSON values (dataclasses become objects, tuples lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


def format_value(value: object) -> str:
    if isinstance(value, LogNormal):
        hi = "" if value.hi is None else f", hi={value.hi:g}"
        lo = f", lo={value.lo:g}" if value.lo else ""
        return f"lognormal(mean={value.mean:g}, sigma={value.sigma:g}{lo}{hi})"
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(to_jsonable(value), sort_keys=False)


def with_overrides(params: T, overrides: Mapping[str, object]) -> T:
    """A copy of `params` with each dotted path in `overrides` set to its value.

    All overrides of one parameter object are applied together before it validates itself, so related bounds
    (say `compact_at_tokens` and `max_context_tokens`) may be changed in one call.
    """
    tree: dict[str, Any] = {}
    for path, value in overrides.items():
        parts = path.replace("__", ".").split(".")
        if not path or any(not p for p in parts):
            raise OverrideError(f"bad parameter path {path!r}: use dotted field names such as 'pause_s.mean'")
        node = tree
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, _Subtree):
                if child != {}:
                    raise OverrideError(f"{path!r} conflicts with an override of {'.'.join(parts[: i + 1])!r}")
                child = node[part] = _Subtree()
            node = child
        if parts[-1] in node:
            raise OverrideError(f"{path!r} is overridden twice")
        node[parts[-1]] = _Leaf(value, path)
    return _apply(params, tree, "")


class _Subtree(dict[str, Any]):
    pass


@dataclasses.dataclass(frozen=True)
class _Leaf:
    value: object
    path: str


def _apply(obj: T, tree: Mapping[str, Any], where: str) -> T:
    if not dataclasses.is_dataclass(obj):
        raise OverrideError(f"{where.rstrip('.')!r}: {type(obj).__name__} has no parameters to set")
    names = [f.name for f in dataclasses.fields(obj)]
    changes: dict[str, object] = {}
    for name, sub in tree.items():
        path = f"{where}{name}"
        if name not in names:
            raise OverrideError(f"{path!r}: no parameter {name!r} here; known: {', '.join(names)}")
        current = getattr(obj, name)
        if isinstance(sub, _Leaf):
            changes[name] = _coerce(current, sub.value, sub.path)
        else:
            changes[name] = _apply(current, sub, f"{path}.")
    try:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]  # a parameter dataclass, typed T
    except (TypeError, ValueError) as exc:
        shown = ", ".join(f"{where}{k}" for k in changes)
        raise OverrideError(f"setting {shown}: {exc}") from None


def _coerce(current: object, value: object, path: str) -> object:
    """`value` converted to the type of the parameter's current value, or an `OverrideError`."""
    if isinstance(value, str) and not isinstance(current, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise OverrideError(f"{path!r}: {value!r} is not a JSON value (a number, true/false, an object)") from None
    if isinstance(current, LogNormal):
        if isinstance(value, LogNormal):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return _build(LogNormal, {"mean": value, "sigma": current.sigma, "lo": current.lo, "hi": current.hi}, path)
        if isinstance(value, Mapping):
            return _build(LogNormal, {**to_jsonable(current), **value}, path)  # type: ignore[dict-item]  # to_jsonable of a LogNormal is a dict
        raise OverrideError(f"{path!r}: give a number (the mean) or an object with mean/sigma/lo/hi, got {value!r}")
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise OverrideError(f"{path!r}: expects true or false, got {value!r}")
        return value
    if isinstance(current, int):
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise OverrideError(f"{path!r}: expects an integer, got {value!r}")
        return int(value)
    if isinstance(current, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise OverrideError(f"{path!r}: expects a number, got {value!r}")
        return float(value)
    if isinstance(current, str):
        if not isinstance(value, str):
            raise OverrideError(f"{path!r}: expects a string, got {value!r}")
        return value
    if isinstance(current, Mapping):
        if not isinstance(value, Mapping):
            raise OverrideError(f"{path!r}: expects an object, got {value!r}")
        return dict(value)
    if isinstance(current, tuple) and current and dataclasses.is_dataclass(current[0]):
        item_type = type(current[0])
        if not isinstance(value, list | tuple):
            raise OverrideError(f"{path!r}: expects a list of objects, got {value!r}")
        return tuple(v if isinstance(v, item_type) else _build(item_type, v, path) for v in value)
    if dataclasses.is_dataclass(current) and isinstance(value, type(current)):
        return value
    raise OverrideError(f"{path!r}: cannot set a parameter of type {type(current).__name__} to {value!r}")


def _build(cls: type, fields: object, path: str) -> Any:
    if not isinstance(fields, Mapping):
        raise OverrideError(f"{path!r}: expects an object for {cls.__name__}, got {fields!r}")
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise OverrideError(f"{path!r}: {exc}") from None
