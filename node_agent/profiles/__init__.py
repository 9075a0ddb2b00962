"""Hardware profiles as data: load a built-in profile by name, or a user's YAML/JSON file, and validate it.

Built-in profiles live in `data/<name>.yaml` (shipped as package data); `docs/hardware-profiles.md` derives
every number in them from the paper or states the assumption behind it.

Boundary: reading and parsing profile files and turning validation failures into `ProfileError`s that name
the file and the field; the schema itself is `evolving_infra.node_agent.profile`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evolving_infra.node_agent.profile import HardwareProfile

DATA_PACKAGE = "evolving_infra.node_agent.profiles.data"
PROFILE_SUFFIXES = (".yaml", ".yml", ".json")


class ProfileError(ValueError):
    """A profile that cannot be used: unknown name, unreadable file, bad syntax or an invalid field.

    source: the file (or built-in name) it came from; problems: one `(field, reason)` per failure, field
    being a dotted path such as `decode.t_acc`, or `None` where the failure concerns the whole profile.
    """

    def __init__(self, source: str, problems: list[tuple[str | None, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"field '{field}': {reason}" if field else reason for field, reason in problems]
        super().__init__(f"{source}: " + "; ".join(lines))

    @property
    def fields(self) -> list[str]:
        """The dotted names of the invalid fields, in the order reported."""
        return [field for field, _ in self.problems if field]


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with the package, sorted."""
    root = resources.files(DATA_PACKAGE)
    return sorted(entry.name[: -len(".yaml")] for entry in root.iterdir() if entry.name.endswith(".yaml"))


def load_profile(name_or_path: str | os.PathLike[str]) -> HardwareProfile:
    """A built-in profile by name (see `builtin_profiles`), or the profile in a `.yaml`/`.yml`/`.json` file.

    Raises `ProfileError` naming the file and each invalid field.
    """
    text = os.fspath(name_or_path)
    if not isinstance(name_or_path, os.PathLike) and text in builtin_profiles():
        resource = resources.files(DATA_PACKAGE) / f"{text}.yaml"
        return parse_profile(_parse_text(resource.read_text(encoding="utf-8"), ".yaml", text), f"built-in {text}")
    path = Path(text)
    if not path.is_file():
        raise ProfileError(
            text,
            [(None, f"no such profile: not a built-in name (one of {', '.join(builtin_profiles())}) nor a file")],
        )
    suffix = path.suffix.lower()
    if suffix not in PROFILE_SUFFIXES:
        reason = f"unsupported file type {suffix or '(none)'!r}; use one of {', '.join(PROFILE_SUFFIXES)}"
        raise ProfileError(text, [(None, reason)])
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(text, [(None, f"cannot read the file: {exc}")]) from exc
    return parse_profile(_parse_text(content, suffix, text), text)


def parse_profile(data: Any, source: str) -> HardwareProfile:
    """Validate already-parsed profile data (a mapping); `source` names it in errors."""
    if not isinstance(data, Mapping):
        raise ProfileError(source, [(None, f"a profile must be a mapping of fields, got {type(data).__name__}")])
    try:
        return HardwareProfile.model_validate(dict(data))
    except ValidationError as exc:
        raise ProfileError(source, [_describe(error) for error in exc.errors()]) from exc


def profile_to_data(profile: HardwareProfile) -> dict[str, Any]:
    """The profile as plain data (JSON-ready), in schema field order."""
    return profile.model_dump(mode="json")


def _parse_text(content: str, suffix: str, source: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(content)
        except json.JSONDecodeError as exc:
            reason = f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            raise ProfileError(source, [(None, reason)]) from exc
    try:
        return yaml.safe_load(content)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ProfileError(source, [(None, f"invalid YAML{where}: {problem}")]) from exc


def _field_named_by(loc: list[str], message: str) -> str | None:
    """The schema's cross-field checks start their message with the field at fault (`k (9) cannot ...`)."""
    model: Any = HardwareProfile
    for part in loc:
        model = getattr(model.model_fields.get(part), "annotation", None)
        if not isinstance(model, type):
            return None
    match = re.match(r"(\w+)\b", message)
    if match is None or match.group(1) not in getattr(model, "model_fields", {}):
        return None
    return ".".join([*loc, match.group(1)])


def _describe(error: Mapping[str, Any]) -> tuple[str | None, str]:
    loc = [str(part) for part in error.get("loc", ())]
    field = ".".join(loc) if loc else None
    kind = error.get("type", "")
    if kind == "missing":
        return field, "required field is missing"
    if kind == "extra_forbidden":
        parent = HardwareProfile
        allowed: list[str] = list(parent.model_fields)
        if len(loc) == 2 and loc[0] in parent.model_fields:
            sub = parent.model_fields[loc[0]].annotation
            allowed = list(getattr(sub, "model_fields", {}))
        return field, f"unknown field; allowed fields here: {', '.join(allowed)}"
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "value_error":
        field = _field_named_by(loc, message) or field
    if "input" in error and kind not in ("model_type", "dict_type") and not isinstance(error["input"], Mapping):
        message = f"{message} (got {error['input']!r})"
    return field, message
