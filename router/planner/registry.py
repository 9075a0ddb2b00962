"""Planner registry: each planner's declaration (`PolicySpec`: name, settings type, factory taking settings and
a seeded generator, what its switches need), listed once (`PLANNERS`). `make_planner(name, **settings)` builds
any planner through its declaration; a planner from another module registers itself with
`PLANNERS.register(spec)` when imported (`evolving_infra.core.plugins.load_plugins`).

Boundary: declarations, construction and validation of settings only. Unknown names or settings raise
`PolicyError` (a ValueError) listing what is allowed.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from evolving_infra.core.plugins import PolicyKind, PolicyNeed, PolicyRegistry, PolicySpec
from evolving_infra.router.planner.active_kv import ActiveKv
from evolving_infra.router.planner.arrow import ArrowPlanner, ArrowSettings
from evolving_infra.router.planner.base import Planner, PlannerName
from evolving_infra.router.planner.dynamo import DynamoPlanner, DynamoSettings
from evolving_infra.router.planner.ours import DecodeDemand, OursPlanner, OursSettings
from evolving_infra.router.planner.static import StaticPlanner, StaticSettings
from evolving_infra.router.planner.window import WindowConfig


@dataclass(frozen=True)
class OursPolicySettings:
    """`OursSettings` with the window given as `window_s` and `slices` (or as a `window`, not both)."""

    window_s: float | None = None
    slices: int | None = None
    window: WindowConfig | None = None
    cooldown_s: float = 120.0
    min_prefill: int = 1
    min_decode: int = 1
    significance: float = 2.0
    decode_demand: DecodeDemand = DecodeDemand.WITH_PREFILL_BACKLOG
    history_s: float = 3600.0
    active_kv: ActiveKv = ActiveKv.REFUSE
    kv_short_utilization: float = 0.5

    def __post_init__(self) -> None:
        if self.window is not None and (self.window_s is not None or self.slices is not None):
            raise ValueError("give either window or window_s/slices for planner 'ours', not both")
        self.settings()  # the planner's own checks

    def settings(self) -> OursSettings:
        window = self.window
        if window is None:
            default = WindowConfig()
            window = WindowConfig(default.window_s if self.window_s is None else float(self.window_s),
                                  default.slices if self.slices is None else int(self.slices))  # fmt: skip
        return OursSettings(window, self.cooldown_s, self.min_prefill, self.min_decode, self.significance,
                            self.decode_demand, self.history_s, self.active_kv,
                            self.kv_short_utilization)  # fmt: skip


_M = __name__
PLANNERS: PolicyRegistry[Planner] = PolicyRegistry(PolicyKind.PLANNER, [
    PolicySpec(PolicyKind.PLANNER, PlannerName.OURS.value, "ours (eq. 5/6): throughput gain over the window's slices",
               OursPolicySettings, lambda s, rng: OursPlanner(s.settings()), frozenset({PolicyNeed.IN_PLACE_SWITCH}), _M),
    PolicySpec(PolicyKind.PLANNER, PlannerName.DYNAMO.value, "Dynamo load planner: relaunches workers",
               DynamoSettings, lambda s, rng: DynamoPlanner(s, rng=rng),
               frozenset({PolicyNeed.RELAUNCH, PolicyNeed.RANDOM}), _M),
    PolicySpec(PolicyKind.PLANNER, PlannerName.ARROW.value, "Arrow-style TTFT/TPOT planner: in place, strands KV",
               ArrowSettings, lambda s, rng: ArrowPlanner(s), frozenset({PolicyNeed.STRAND_KV}), _M),
    PolicySpec(PolicyKind.PLANNER, PlannerName.STATIC.value, "static split (no switch)", StaticSettings,
               lambda s, rng: StaticPlanner(s), frozenset(), _M),
])  # fmt: skip


def planner_name(name: PlannerName | str) -> PlannerName:
    """Parse a built-in planner name, e.g. from a CR or a command line."""
    if isinstance(name, PlannerName):
        return name
    try:
        return PlannerName(name)
    except ValueError:
        allowed = ", ".join(p.value for p in PlannerName)
        raise ValueError(f"unknown planner {name!r}; allowed: {allowed}") from None


def allowed_settings(name: PlannerName | str) -> tuple[str, ...]:
    """The keyword settings `make_planner` accepts for a planner."""
    spec = PLANNERS.get(name)
    return tuple(f.name for f in dataclasses.fields(spec.settings))


def make_planner(name: PlannerName | str, *, rng: random.Random | None = None, **settings: Any) -> Planner:
    """Build a planner with its default settings overridden by `settings`; `rng` feeds its random draws (a
    relaunch's duration; without one Dynamo's relaunches last `relaunch_s`)."""
    spec = PLANNERS.get(name)
    if rng is not None and not isinstance(rng, random.Random):
        raise ValueError(f"rng for planner {spec.name!r} must be a random.Random, got {type(rng).__name__}")
    if spec.name == PlannerName.DYNAMO.value and rng is None:
        return DynamoPlanner(spec.validate(settings), rng=None)
    return spec.build(settings, rng)
