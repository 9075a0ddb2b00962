"""Best static split baseline: the split is fixed for the whole run and never changes.

Rule followed (/work/shared/baselines.md, "Planners" / "Best static split"): SGLang PD disaggregation at a
fixed split chosen offline (the split with the highest throughput over the run). Choosing that split is the
experiment's job (run every split, keep the best); the planner only guarantees it is never changed.

Boundary: pure; every decision is HOLD.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolving_infra.router.planner.base import (
    Outcome,
    PlannerDecision,
    PlannerName,
    PlannerObservation,
    SwitchMode,
)
from evolving_infra.router.planner.diagnostics import StaticDiagnostics
from evolving_infra.router.planner.split import format_split


@dataclass(frozen=True, slots=True)
class StaticSettings:
    """interval_s: how often the driver asks (the answer never changes)."""

    interval_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")


class StaticPlanner:
    """Never switches."""

    def __init__(self, settings: StaticSettings | None = None) -> None:
        self._settings = settings or StaticSettings()

    @property
    def name(self) -> PlannerName:
        return PlannerName.STATIC

    @property
    def interval_s(self) -> float:
        return self._settings.interval_s

    def decide(self, observation: PlannerObservation, now: float) -> PlannerDecision:
        current = format_split(observation.phases)
        diag = StaticDiagnostics(current)
        return PlannerDecision(None, SwitchMode.IN_PLACE, Outcome.HOLD, f"static split {current}", diag)
