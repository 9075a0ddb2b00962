"""Layered settings for the services: defaults < YAML file < environment < command-line flags.

One loader for every pydantic-settings model of the services (node agent, router): the YAML file's values
enter as the lowest-priority source through `YamlFileSource`, validation errors become one `SettingsError`
that names the file and every bad field.

Boundary: reading one settings file and validating it; what the settings mean is each service's.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

_FILE_DATA: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("settings_file_data", default={})

S = TypeVar("S", bound=BaseSettings)


class SettingsError(ValueError):
    """Settings that cannot be used: `problems` holds one `(field, reason)` per failure."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(f"{field}: {reason}" for field, reason in problems))


class YamlFileSource(PydanticBaseSettingsSource):
    """The settings file's values, handed over by `load_layered` (list it after the environment source)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get())


MAX_SETTINGS_BYTES = 1 << 20
"""Largest settings file read."""


class NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases: a settings file never needs them, and an alias bomb (a few
    bytes expanding to gigabytes once walked) is refused at its first alias, with its position."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed here", mark)
        return super().compose_node(parent, index)


def read_settings_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML settings file (SettingsError naming the file, and the position where known,
    otherwise): at most MAX_SETTINGS_BYTES, UTF-8, safe YAML without aliases."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SETTINGS_BYTES + 1)
    except OSError as exc:
        raise SettingsError(str(path), [("file", f"cannot read it: {exc.strerror or exc}")]) from exc
    if len(raw) > MAX_SETTINGS_BYTES:
        raise SettingsError(str(path), [("file", f"larger than {MAX_SETTINGS_BYTES} bytes")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError(str(path), [("file", f"not UTF-8 (byte {exc.start})")]) from None
    try:
        data = yaml.load(text, Loader=NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SettingsError(str(path), [("file", f"invalid YAML: {exc}")]) from exc
    except RecursionError:
        raise SettingsError(str(path), [("file", "nested too deeply")]) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SettingsError(str(path), [("file", f"must hold a mapping of settings, got {type(data).__name__}")])
    return dict(data)


def describe_error(error: Mapping[str, Any], allowed: Iterable[str]) -> tuple[str, str]:
    """One validation error as (dotted field, reason); an unknown field lists the `allowed` ones."""
    field = ".".join(str(p) for p in error.get("loc", ())) or "settings"
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        message = "unknown setting; allowed here: " + ", ".join(allowed)
    elif "input" in error and not isinstance(error["input"], Mapping):
        message = f"{message} (got {error['input']!r})"
    return field, message


def load_layered(
    cls: type[S],
    file: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    allowed_for: Callable[[str], type[BaseModel]] | None = None,
) -> S:
    """Build `cls` from defaults < YAML `file` < its environment prefix < `flags` (None flags ignored).

    `allowed_for(dotted_field)` names the model whose fields an unknown setting at that place may be
    (default: `cls` itself), so the error lists what is allowed where the mistake is.
    """
    data = read_settings_file(file) if file is not None else {}
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    token = _FILE_DATA.set(data)
    try:
        return cls(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()))
            model = allowed_for(where) if allowed_for is not None else cls
            problems.append(describe_error(error, model.model_fields))
        raise SettingsError(str(file) if file is not None else "settings", problems) from exc
    finally:
        _FILE_DATA.reset(token)
