"""Planner registry: `make_planner(name, **settings)` builds any planner by its `PlannerName`.

Boundary: construction and validation of settings only. Unknown names or settings raise ValueError listing
what is allowed.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from evolving_infra.router.planner.arrow import ArrowPlanner, ArrowSettings
from evolving_infra.router.planner.base import Planner, PlannerName
from evolving_infra.router.planner.dynamo import DynamoPlanner, DynamoSettings
from evolving_infra.router.planner.ours import OursPlanner, OursSettings
from evolving_infra.router.planner.static import StaticPlanner, StaticSettings
from evolving_infra.router.planner.window import WindowConfig

_SETTINGS: dict[PlannerName, type] = {
    PlannerName.OURS: OursSettings,
    PlannerName.DYNAMO: DynamoSettings,
    PlannerName.ARROW: ArrowSettings,
    PlannerName.STATIC: StaticSettings,
}
# Extra keyword arguments beyond the settings fields: ours takes window_s/slices (its WindowConfig),
# Dynamo takes rng (a seeded random.Random for relaunch durations).
_EXTRA: dict[PlannerName, tuple[str, ...]] = {
    PlannerName.OURS: ("window_s", "slices"),
    PlannerName.DYNAMO: ("rng",),
    PlannerName.ARROW: (),
    PlannerName.STATIC: (),
}


def planner_name(name: PlannerName | str) -> PlannerName:
    """Parse a planner name, e.g. from a CR or a command line."""
    if isinstance(name, PlannerName):
        return name
    try:
        return PlannerName(name)
    except ValueError:
        allowed = ", ".join(p.value for p in PlannerName)
        raise ValueError(f"unknown planner {name!r}; allowed: {allowed}") from None


def allowed_settings(name: PlannerName | str) -> tuple[str, ...]:
    """The keyword arguments `make_planner` accepts for a planner."""
    key = planner_name(name)
    fields = tuple(f.name for f in dataclasses.fields(_SETTINGS[key]))
    return fields + _EXTRA[key]


def make_planner(name: PlannerName | str, **settings: Any) -> Planner:
    """Build a planner with its default settings overridden by `settings`."""
    key = planner_name(name)
    allowed = allowed_settings(key)
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise ValueError(f"unknown settings {unknown} for planner {key.value!r}; allowed: {', '.join(allowed)}")
    if key is PlannerName.OURS:
        window_s = settings.pop("window_s", None)
        slices = settings.pop("slices", None)
        if window_s is not None or slices is not None:
            if "window" in settings:
                raise ValueError("give either window or window_s/slices for planner 'ours', not both")
            default = WindowConfig()
            settings["window"] = WindowConfig(
                window_s=default.window_s if window_s is None else float(window_s),
                slices=default.slices if slices is None else int(slices),
            )
        return OursPlanner(OursSettings(**settings))
    if key is PlannerName.DYNAMO:
        rng = settings.pop("rng", None)
        if rng is not None and not isinstance(rng, random.Random):
            raise ValueError(f"rng for planner 'dynamo' must be a random.Random, got {type(rng).__name__}")
        return DynamoPlanner(DynamoSettings(**settings), rng=rng)
    if key is PlannerName.ARROW:
        return ArrowPlanner(ArrowSettings(**settings))
    return StaticPlanner(StaticSettings(**settings))
