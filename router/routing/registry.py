"""Registries of the routing policies: each policy's declaration (`PolicySpec`: name, settings type, factory
taking settings and a seeded generator, needs), listed once per kind (`PREFILL_ROUTING`, `DECODE_BINDING`).

`make_prefill_router("cache-aware", cache_threshold=0.5)` (or with a `PrefillPolicyName`) and
`make_decode_binder(name, rng, **settings)` build a policy through its declaration; an unknown name or setting
raises `PolicyError` (a ValueError) naming what is allowed. A policy from another module registers itself with
`PREFILL_ROUTING.register(spec)` when it is imported (`evolving_infra.core.plugins.load_plugins`).

Boundary: declarations and construction only.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from evolving_infra.core.plugins import PolicyKind, PolicyNeed, PolicyRegistry, PolicySpec
from evolving_infra.router.routing.base import DecodeBinder, DecodePolicyName, PrefillPolicyName, PrefillRouter
from evolving_infra.router.routing.cache_aware import CacheAwareRouter, CacheAwareSettings
from evolving_infra.router.routing.decode import (
    BaselineBinderSettings,
    FewestRequestsBinder,
    PowerOfTwoBinder,
    RoundRobinBinder,
)
from evolving_infra.router.routing.dynamo_kv import DynamoKvRouter, DynamoKvSettings, DynamoLoads
from evolving_infra.router.routing.least_loaded import LeastLoadedRouter
from evolving_infra.router.routing.round_robin import RoundRobinRouter
from evolving_infra.router.routing.sticky import StickyRouter, StickySettings
from evolving_infra.router.routing.ttft import TtftRouter, TtftSettings


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """A policy without settings."""


@dataclasses.dataclass(frozen=True)
class DynamoKvPolicySettings:
    """Dynamo's KV router cost (`DynamoKvSettings` without `with_memory_pool`, which the policy name fixes)."""

    gpu_credit: float = 1.0
    host_credit: float = 0.75
    disk_credit: float = 0.25
    pool_credit: float = 0.0
    loads: DynamoLoads = DynamoLoads.DYNAMO
    """`dynamo` (as Dynamo's router source: new blocks and distinct active pages) or `prompt-blocks` (the paper's
    appendix A.3 reading: whole prompts, no sharing)."""


def _dynamo(pool: bool) -> Any:
    def build(s: DynamoKvPolicySettings, rng: random.Random) -> PrefillRouter:
        return DynamoKvRouter(DynamoKvSettings(**dataclasses.asdict(s), with_memory_pool=pool), rng)

    return build


_M = __name__
PREFILL_ROUTING: PolicyRegistry[PrefillRouter] = PolicyRegistry(PolicyKind.PREFILL_ROUTING, [
    PolicySpec(PolicyKind.PREFILL_ROUTING, PrefillPolicyName.TTFT.value,
               "ours (eq. 7): shortest predicted TTFT (queue replay, exposed fetch, copy price)",
               TtftSettings, lambda s, rng: TtftRouter(s), frozenset({PolicyNeed.KV_MOVES}), _M),
    PolicySpec(PolicyKind.PREFILL_ROUTING, PrefillPolicyName.CACHE_AWARE.value,
               "SGLang gateway: cache-aware with load-balance thresholds", CacheAwareSettings,
               lambda s, rng: CacheAwareRouter(s), frozenset(), _M),
    PolicySpec(PolicyKind.PREFILL_ROUTING, PrefillPolicyName.STICKY.value, "a branch stays on its node",
               StickySettings, lambda s, rng: StickyRouter(s), frozenset(), _M),
    PolicySpec(PolicyKind.PREFILL_ROUTING, PrefillPolicyName.DYNAMO_KV.value,
               "Dynamo KV router cost, own KV only", DynamoKvPolicySettings, _dynamo(False),
               frozenset({PolicyNeed.RANDOM}), _M),
    PolicySpec(PolicyKind.PREFILL_ROUTING, PrefillPolicyName.DYNAMO_KV_POOL.value,
               "Dynamo KV router cost with the shared pool", DynamoKvPolicySettings, _dynamo(True),
               frozenset({PolicyNeed.RANDOM, PolicyNeed.KV_MOVES}), _M),
    PolicySpec(PolicyKind.PREFILL_ROUTING, PrefillPolicyName.ROUND_ROBIN.value, "round robin", NoSettings,
               lambda s, rng: RoundRobinRouter(), frozenset(), _M),
    PolicySpec(PolicyKind.PREFILL_ROUTING, PrefillPolicyName.LEAST_LOADED.value,
               "Arrow-style least-loaded (ignores where KV is)", NoSettings, lambda s, rng: LeastLoadedRouter(),
               frozenset(), _M),
])  # fmt: skip

DECODE_BINDING: PolicyRegistry[DecodeBinder] = PolicyRegistry(PolicyKind.DECODE_BINDING, [
    PolicySpec(PolicyKind.DECODE_BINDING, DecodePolicyName.FEWEST_REQUESTS.value,
               "ours: fewest requests among nodes with KV room", NoSettings,
               lambda s, rng: FewestRequestsBinder(), frozenset(), _M),
    PolicySpec(PolicyKind.DECODE_BINDING, DecodePolicyName.ROUND_ROBIN.value, "round robin (SGLang PD router)",
               BaselineBinderSettings, lambda s, rng: RoundRobinBinder(s), frozenset(), _M),
    PolicySpec(PolicyKind.DECODE_BINDING, DecodePolicyName.POWER_OF_TWO.value, "power of two choices",
               BaselineBinderSettings, lambda s, rng: PowerOfTwoBinder(rng, s), frozenset({PolicyNeed.RANDOM}), _M),
])  # fmt: skip


def make_prefill_router(name: PrefillPolicyName | str, *, rng: random.Random | None = None, **cfg: Any) -> PrefillRouter:
    """A fresh prefill router of policy `name` configured by `cfg` (its settings' fields)."""
    return PREFILL_ROUTING.build(name, cfg, rng)


def make_decode_binder(name: DecodePolicyName | str, rng: random.Random, **cfg: Any) -> DecodeBinder:
    """A fresh decode binder of policy `name`; `rng` feeds its random draws (power of two)."""
    return DECODE_BINDING.build(name, cfg, rng)
