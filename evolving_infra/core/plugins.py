"""Policies as plugins: one declaration per policy (`PolicySpec`), registries that are lists of declarations
(`PolicyRegistry`), and loading policy modules by name or file (`load_plugins`).

A declaration names the policy, says what kind it is (prefill routing, decode binding, planner, host
eviction), gives its settings type (a pydantic model or a dataclass: anything pydantic validates), a factory
taking validated settings and a seeded random generator, and what the policy needs from the system that runs
it (`PolicyNeed`: random numbers, KV moves between nodes, in-place switches, switches that strand KV,
relaunches). Drivers build every policy through its registry the same way (`PolicyRegistry.build`), so live and
simulated clusters wire a policy identically; settings files, the simulator's configuration and the CR name a
policy and carry its settings, checked with `PolicyRegistry.validate`, whose errors name the field at fault.

Adding a policy is one module that declares it and registers it (`REGISTRY.register(SPEC)` at import), its
test, and for a built-in policy one line in its registry's list. A module outside the package (a test, a user's
policy) is loaded with `load_plugins(["my_pkg.my_policy", "/path/to/policy.py"])` from the `plugins` setting of
the router or the simulator.

Boundary: declarations, validation and construction; no policy logic, no I/O beyond importing the modules named.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.util
import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")


class PolicyKind(enum.Enum):
    PREFILL_ROUTING = "prefill_routing"
    DECODE_BINDING = "decode_binding"
    PLANNER = "planner"
    EVICTION = "eviction"


class PolicyNeed(enum.Enum):
    """What a policy needs from the system that runs it."""

    RANDOM = "random"
    """Random draws: the driver passes a generator seeded from the run's or router's seed."""
    KV_MOVES = "kv_moves"
    """It plans KV moves between nodes (fetches from peers' host memory): needs the shared pool."""
    IN_PLACE_SWITCH = "in_place_switch"
    """Its switches are applied in place (the node drains and serves its new phase without a restart)."""
    STRAND_KV = "strand_kv"
    """Its switches drop the switched node's KV (each engine indexes its own KV)."""
    RELAUNCH = "relaunch"
    """Its switches relaunch the node (out of service for a downtime, KV empty)."""
    BRANCH_COUNTS = "branch_counts"
    """It orders pages by their branch counts: the router pushes count changes to the nodes (an eviction order)."""


class PolicyError(ValueError):
    """A policy name or its settings are not valid; the message names the field at fault."""


@dataclass(frozen=True)
class PolicySpec(Generic[T]):
    """One policy's declaration (see the module docstring)."""

    kind: PolicyKind
    name: str
    summary: str
    settings: Any
    """The settings type (a pydantic model or a dataclass); its defaults are the policy's defaults."""
    factory: Callable[[Any, random.Random], T]
    needs: frozenset[PolicyNeed] = frozenset()
    module: str = ""
    """The module that declared it (for errors and docs)."""

    def validate(self, raw: Mapping[str, Any] | Any | None, where: str = "settings") -> Any:
        """`raw` (a mapping, or an instance of the settings type) as validated settings."""
        if raw is not None and not isinstance(raw, Mapping):
            if isinstance(raw, self.settings):
                return raw
            raise PolicyError(f"{where}: settings of {self.kind.value} {self.name!r} must be a mapping, got {type(raw).__name__}")
        data = dict(raw or {})
        known = _field_names(self.settings)
        unknown = sorted(set(data) - known) if known is not None else []
        if unknown:
            allowed = ", ".join(sorted(known or ())) or "none"
            raise PolicyError(f"{where}: unknown setting(s) {', '.join(unknown)} for {self.kind.value} {self.name!r}; "
                              f"allowed: {allowed}")  # fmt: skip
        try:
            return TypeAdapter(self.settings).validate_python(data)
        except ValidationError as error:
            problems = "; ".join(
                f"{where}.{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()
            )
            raise PolicyError(f"{self.kind.value} {self.name!r}: {problems}") from None
        except (TypeError, ValueError) as error:  # a settings type's own __post_init__ checks
            raise PolicyError(f"{where} of {self.kind.value} {self.name!r}: {error}") from None

    def build(self, raw: Mapping[str, Any] | Any | None, rng: random.Random | None = None) -> T:
        """A fresh policy with `raw` settings; `rng` feeds its random draws (a fixed seed if None)."""
        return self.factory(self.validate(raw), rng if rng is not None else random.Random(0))


def _field_names(settings: Any) -> set[str] | None:
    fields = getattr(settings, "model_fields", None)
    if fields is not None:
        return set(fields)
    dataclass_fields = getattr(settings, "__dataclass_fields__", None)
    if dataclass_fields is not None:
        return {name for name, f in dataclass_fields.items() if f.init}
    return None


@dataclass
class PolicyRegistry(Generic[T]):
    """The policies of one kind, in declaration order (see the module docstring)."""

    kind: PolicyKind
    specs: list[PolicySpec[T]] = field(default_factory=list)

    def __post_init__(self) -> None:
        specs, self.specs = list(self.specs), []
        for spec in specs:
            self.register(spec)

    def register(self, spec: PolicySpec[T]) -> PolicySpec[T]:
        """Add a declaration (refused when its kind differs or its name is taken by another declaration)."""
        if spec.kind is not self.kind:
            raise PolicyError(f"policy {spec.name!r} is a {spec.kind.value} policy, not {self.kind.value}")
        for existing in self.specs:
            if existing.name == spec.name:
                if existing is spec or (existing.module and existing.module == spec.module):
                    self.specs[self.specs.index(existing)] = spec  # the same module imported again
                    return spec
                raise PolicyError(f"{self.kind.value} policy {spec.name!r} is declared twice "
                                  f"({existing.module or '?'} and {spec.module or '?'})")  # fmt: skip
        self.specs.append(spec)
        return spec

    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def __contains__(self, name: object) -> bool:
        return any(s.name == _text(name) for s in self.specs)

    def get(self, name: str | enum.Enum, where: str | None = None) -> PolicySpec[T]:
        """The declaration named `name`; an error naming `where` (the field) and the known names otherwise."""
        key = _text(name)
        for spec in self.specs:
            if spec.name == key:
                return spec
        field_name = where or self.kind.value
        raise PolicyError(f"{field_name}: unknown {self.kind.value.replace('_', ' ')} policy {key!r}; known: "
                          f"{', '.join(self.names())} (a policy from another module needs it listed in plugins)")  # fmt: skip

    def validate(self, name: str | enum.Enum, raw: Mapping[str, Any] | None, where: str) -> Any:
        """Validated settings of policy `name` (errors name `where`, the settings field)."""
        return self.get(name, where).validate(raw, where)

    def build(self, name: str | enum.Enum, raw: Mapping[str, Any] | Any | None = None,
              rng: random.Random | None = None) -> T:  # fmt: skip
        return self.get(name).build(raw, rng)


def _text(name: object) -> str:
    return str(name.value) if isinstance(name, enum.Enum) else str(name)


def load_plugins(refs: Iterable[str]) -> list[str]:
    """Import each policy module named (a dotted module name, or a path to a .py file); its declarations register
    themselves. Returns the module names loaded. Errors name the reference that failed."""
    loaded: list[str] = []
    for ref in refs:
        try:
            loaded.append(_load(ref))
        except PolicyError:
            raise
        except Exception as error:  # noqa: BLE001 - any import failure is reported with the plugin named
            raise PolicyError(f"plugins: cannot load {ref!r}: {type(error).__name__}: {error}") from None
    return loaded


def _load(ref: str) -> str:
    if ref.endswith(".py") or "/" in ref:
        path = Path(ref).resolve()
        if not path.is_file():
            raise PolicyError(f"plugins: {ref!r} is not a file")
        name = f"evolving_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return name
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PolicyError(f"plugins: cannot import {ref!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return name
    importlib.import_module(ref)
    return ref


def declared_in(specs: Sequence[PolicySpec[Any]]) -> dict[str, list[str]]:
    """Policy names per declaring module (docs)."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        out.setdefault(spec.module, []).append(spec.name)
    return out
