"""Dynamo-style load planner, as the paper configures it (throughput target, fixed node budget).

Rule followed (/work/shared/baselines.md, "Planners" / "Dynamo planner, as configured in the paper"):
- every load interval (5 s) read per engine: prefill ratio = queued prefill tokens / context length, and decode
  utilization = (scheduled + queued decode KV tokens) / KV capacity in tokens;
- prefill wants +1 if any prefill engine's ratio >= 1.0 and -1 if all are < 0.1; decode wants +1 if any decode
  engine's utilization > 1.0 and -1 only if all are < 0.6;
- decisions are ±1 per tick, and no new decision while a change is in flight;
- the node count is fixed, so a change is a rebalance of one node from one role to the other, applied as a
  RELAUNCH: the worker is terminated without waiting for in-flight requests, the node serves nothing until
  its new worker is ready (paper: 666-831 s, mean 754 s), and its KV starts empty.

Combining the two wishes under the fixed budget: a node moves toward prefill when prefill wants +1 and decode
does not also want +1, or when decode wants -1 and prefill does not also want -1; symmetrically toward decode.
Opposed wishes of the same sign (both +1 or both -1) cancel: the budget has no spare node and no pool to
receive one.

Boundary: pure apart from the seeded generator passed in for relaunch durations.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.planner.base import (
    Outcome,
    PlannerDecision,
    PlannerName,
    PlannerObservation,
    SwitchMode,
)
from evolving_infra.router.planner.diagnostics import DynamoDiagnostics, Want
from evolving_infra.router.planner.split import (
    decode_nodes,
    fewest_changes_split,
    format_split,
    nodes_to_move,
    prefill_nodes,
)


@dataclass(frozen=True, slots=True)
class DynamoSettings:
    """Thresholds of the load rule, the tick, the pool bounds and the relaunch duration.

    relaunch_s is used when no generator is given; with one, each relaunch draws uniformly from
    [relaunch_min_s, relaunch_max_s] (paper: 666-831 s, mean 754 s).
    """

    interval_s: float = 5.0
    prefill_grow_ratio: float = 1.0
    prefill_shrink_ratio: float = 0.1
    decode_grow_utilization: float = 1.0
    decode_shrink_utilization: float = 0.6
    min_prefill: int = 1
    min_decode: int = 1
    relaunch_s: float = 754.0
    relaunch_min_s: float = 666.0
    relaunch_max_s: float = 831.0

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if not 0 <= self.prefill_shrink_ratio <= self.prefill_grow_ratio:
            raise ValueError(
                f"need 0 <= prefill_shrink_ratio <= prefill_grow_ratio, got {self.prefill_shrink_ratio}, "
                f"{self.prefill_grow_ratio}"
            )
        if not 0 <= self.decode_shrink_utilization <= self.decode_grow_utilization:
            raise ValueError(
                f"need 0 <= decode_shrink_utilization <= decode_grow_utilization, got "
                f"{self.decode_shrink_utilization}, {self.decode_grow_utilization}"
            )
        if self.min_prefill < 1 or self.min_decode < 1:
            raise ValueError(f"min_prefill and min_decode must be >= 1, got {self.min_prefill}, {self.min_decode}")
        if not 0 < self.relaunch_min_s <= self.relaunch_s <= self.relaunch_max_s:
            raise ValueError(
                f"need 0 < relaunch_min_s <= relaunch_s <= relaunch_max_s, got {self.relaunch_min_s}, "
                f"{self.relaunch_s}, {self.relaunch_max_s}"
            )


class DynamoPlanner:
    """Dynamo's load planner under a fixed node budget. See the module docstring for the rule."""

    def __init__(self, settings: DynamoSettings | None = None, rng: random.Random | None = None) -> None:
        self._settings = settings or DynamoSettings()
        self._rng = rng

    @property
    def name(self) -> PlannerName:
        return PlannerName.DYNAMO

    @property
    def settings(self) -> DynamoSettings:
        return self._settings

    @property
    def interval_s(self) -> float:
        return self._settings.interval_s

    def decide(self, observation: PlannerObservation, now: float) -> PlannerDecision:
        cfg = self._settings
        phases = observation.phases
        current = format_split(phases)
        switching = observation.switching
        prefill = prefill_nodes(phases)
        decode = decode_nodes(phases)
        ratios = {n: observation.load_of(n).prefill_ratio for n in prefill}
        utils = {n: observation.load_of(n).kv_utilization for n in decode}
        p_want = _want(
            list(ratios.values()),
            grow=lambda r: r >= cfg.prefill_grow_ratio,
            shrink=lambda r: r < cfg.prefill_shrink_ratio,
        )
        d_want = _want(
            list(utils.values()),
            grow=lambda u: u > cfg.decode_grow_utilization,
            shrink=lambda u: u < cfg.decode_shrink_utilization,
        )

        def diag(moved: tuple[NodeId, ...] = ()) -> DynamoDiagnostics:
            return DynamoDiagnostics(current, switching, ratios, utils, p_want, d_want, moved)

        if switching:
            reason = f"no decision: relaunch of {list(switching)} still in flight"
            return PlannerDecision(None, SwitchMode.RELAUNCH, Outcome.SKIPPED_SWITCH_IN_FLIGHT, reason, diag())

        to_prefill = (p_want is Want.GROW and d_want is not Want.GROW) or (
            d_want is Want.SHRINK and p_want is not Want.SHRINK
        )
        to_decode = (d_want is Want.GROW and p_want is not Want.GROW) or (
            p_want is Want.SHRINK and d_want is not Want.SHRINK
        )
        wishes = f"prefill wants {p_want.value:+d}, decode wants {d_want.value:+d}"
        if not (to_prefill or to_decode):
            return PlannerDecision(None, SwitchMode.RELAUNCH, Outcome.HOLD, f"hold {current}: {wishes}", diag())
        target_p = len(prefill) + (1 if to_prefill else -1)
        if target_p < cfg.min_prefill or len(phases) - target_p < cfg.min_decode:
            reason = f"hold {current}: {wishes}, but the move would break min_prefill/min_decode"
            return PlannerDecision(None, SwitchMode.RELAUNCH, Outcome.HOLD, reason, diag())
        moved = nodes_to_move(phases, target_p, observation.move_costs)
        target = fewest_changes_split(phases, target_p, observation.move_costs)
        duration = (
            self._rng.uniform(cfg.relaunch_min_s, cfg.relaunch_max_s) if self._rng is not None else cfg.relaunch_s
        )
        role = Phase.PREFILL if to_prefill else Phase.DECODE
        reason = (
            f"relaunch {list(moved)} as {role.value} ({current} -> {format_split(target)}, "
            f"{duration:.0f} s down): {wishes}"
        )
        return PlannerDecision(target, SwitchMode.RELAUNCH, Outcome.SWITCH, reason, diag(moved), duration)


def _want(values: list[float], grow: Callable[[float], bool], shrink: Callable[[float], bool]) -> Want:
    """GROW if any engine crosses the grow threshold, SHRINK if all are below the shrink one."""
    if any(grow(v) for v in values):
        return Want.GROW
    if values and all(shrink(v) for v in values):
        return Want.SHRINK
    return Want.KEEP
