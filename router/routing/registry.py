"""Registries: build a prefill router or a decode binder from its name and keyword settings.

`make_prefill_router("cache-aware", cache_threshold=0.5)` or with a `PrefillPolicyName`; the keywords are
the fields of the policy's settings dataclass (plus `rng` where a policy draws random tie-breaks). An
unknown name or keyword raises ValueError naming what is allowed.

Boundary: construction only.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Callable
from typing import Any, TypeVar

from evolving_infra.router.routing.base import DecodeBinder, DecodePolicyName, PrefillPolicyName, PrefillRouter
from evolving_infra.router.routing.cache_aware import CacheAwareRouter, CacheAwareSettings
from evolving_infra.router.routing.decode import (
    BaselineBinderSettings,
    FewestRequestsBinder,
    PowerOfTwoBinder,
    RoundRobinBinder,
)
from evolving_infra.router.routing.dynamo_kv import DynamoKvRouter, DynamoKvSettings
from evolving_infra.router.routing.least_loaded import LeastLoadedRouter
from evolving_infra.router.routing.round_robin import RoundRobinRouter
from evolving_infra.router.routing.sticky import StickyRouter, StickySettings
from evolving_infra.router.routing.ttft import TtftRouter, TtftSettings, WaitModel

S = TypeVar("S")
E = TypeVar("E", bound=enum.Enum)


def _settings(cls: type[S], policy: str, cfg: dict[str, Any]) -> S:
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(cfg) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "none"
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} for policy {policy}; allowed: {allowed}")
    return cls(**cfg)


def _name(kind: type[E], name: E | str) -> E:
    if isinstance(name, kind):
        return name
    try:
        return kind(name)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ValueError(f"unknown {kind.__name__} {name!r}; allowed: {allowed}") from None


def _ttft(cfg: dict[str, Any]) -> PrefillRouter:
    if isinstance(cfg.get("wait_model"), str):
        cfg["wait_model"] = _name(WaitModel, cfg["wait_model"])
    return TtftRouter(_settings(TtftSettings, "ttft", cfg))


def _dynamo(pool: bool) -> Callable[[dict[str, Any]], PrefillRouter]:
    def build(cfg: dict[str, Any]) -> PrefillRouter:
        rng = cfg.pop("rng", None)
        if rng is not None and not isinstance(rng, random.Random):
            raise ValueError(f"rng must be a random.Random, got {type(rng).__name__}")
        name = "dynamo-kv-pool" if pool else "dynamo-kv"
        if "with_memory_pool" in cfg and cfg["with_memory_pool"] != pool:
            raise ValueError(f"policy {name} fixes with_memory_pool={pool}")
        cfg["with_memory_pool"] = pool
        return DynamoKvRouter(_settings(DynamoKvSettings, name, cfg), rng)

    return build


def _round_robin(cfg: dict[str, Any]) -> PrefillRouter:
    _settings(_NoSettings, "round-robin", cfg)
    return RoundRobinRouter()


def _least_loaded(cfg: dict[str, Any]) -> PrefillRouter:
    _settings(_NoSettings, "least-loaded", cfg)
    return LeastLoadedRouter()


@dataclasses.dataclass(frozen=True)
class _NoSettings:
    pass


PREFILL_ROUTERS: dict[PrefillPolicyName, Callable[[dict[str, Any]], PrefillRouter]] = {
    PrefillPolicyName.TTFT: _ttft,
    PrefillPolicyName.CACHE_AWARE: lambda cfg: CacheAwareRouter(_settings(CacheAwareSettings, "cache-aware", cfg)),
    PrefillPolicyName.STICKY: lambda cfg: StickyRouter(_settings(StickySettings, "sticky", cfg)),
    PrefillPolicyName.DYNAMO_KV: _dynamo(False),
    PrefillPolicyName.DYNAMO_KV_POOL: _dynamo(True),
    PrefillPolicyName.ROUND_ROBIN: _round_robin,
    PrefillPolicyName.LEAST_LOADED: _least_loaded,
}


def make_prefill_router(name: PrefillPolicyName | str, **cfg: Any) -> PrefillRouter:
    """A fresh prefill router of policy `name` configured by `cfg` (its settings' fields)."""
    return PREFILL_ROUTERS[_name(PrefillPolicyName, name)](dict(cfg))


def make_decode_binder(name: DecodePolicyName | str, rng: random.Random, **cfg: Any) -> DecodeBinder:
    """A fresh decode binder of policy `name`; `rng` feeds power-of-two's draws (others ignore it)."""
    policy = _name(DecodePolicyName, name)
    if policy is DecodePolicyName.FEWEST_REQUESTS:
        _settings(_NoSettings, policy.value, cfg)
        return FewestRequestsBinder()
    settings = _settings(BaselineBinderSettings, policy.value, cfg)
    if policy is DecodePolicyName.ROUND_ROBIN:
        return RoundRobinBinder(settings)
    return PowerOfTwoBinder(rng, settings)
