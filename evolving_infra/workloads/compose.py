"""Compositions of Putnam and OSWorld agents: a fixed mix, and the section 6.3 shift from math to computer use.

`mixed` interleaves the two workloads at a fixed ratio in file order. `shift` cuts time into periods (Putnam, then
the mix, then OSWorld over three hours after a warmup, paper section 6.1); each period owns one block of agents in
file order, whose `start_s` lie inside the period and whose counts follow the period's concurrency. The header tells
a closed-loop replayer how to realize the periods (`shift_notes`).

Boundary: plans of `(workload, start_s)` per agent; pure, randomness only from the generators passed in.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from evolving_infra.workloads.dist import apportion, interleave
from evolving_infra.workloads.osworld import OSWorldParams
from evolving_infra.workloads.params import param
from evolving_infra.workloads.putnam import PutnamParams

LABELS = ("putnam", "osworld")


@dataclass(frozen=True)
class MixedParams:
    """A fixed ratio of Putnam and OSWorld agents (the middle period of the shift)."""

    putnam: PutnamParams = param(PutnamParams(), "the putnam kind's parameters")
    osworld: OSWorldParams = param(OSWorldParams(), "the osworld kind's parameters")
    putnam_weight: int = param(144, "section 6.1: the mixed period serves 144 Putnam agents ...")
    osworld_weight: int = param(72, "section 6.1: ... and 72 OSWorld agents")
    arrival_rate_per_min: float = param(1.0, "assumption (as for the single kinds); ignored by closed-loop replay")

    def __post_init__(self) -> None:
        if self.putnam_weight < 0 or self.osworld_weight < 0 or self.putnam_weight + self.osworld_weight == 0:
            raise ValueError("putnam_weight and osworld_weight must be >= 0 and not both 0")
        if not self.arrival_rate_per_min > 0:
            raise ValueError(f"arrival_rate_per_min must be > 0, got {self.arrival_rate_per_min}")

    def counts(self, agents: int) -> dict[str, int]:
        n = apportion(agents, [self.putnam_weight, self.osworld_weight])
        return {"putnam": n[0], "osworld": n[1]}


@dataclass(frozen=True)
class Period:
    """A span of the shift: how long it lasts and how many agents of each workload run concurrently."""

    name: str
    duration_s: float
    concurrency: dict[str, int]

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a period needs a name")
        if not self.duration_s > 0:
            raise ValueError(f"period {self.name!r}: duration_s must be > 0, got {self.duration_s}")
        unknown = sorted(set(self.concurrency) - set(LABELS))
        if unknown:
            raise ValueError(f"period {self.name!r}: unknown workloads {unknown}; allowed: {', '.join(LABELS)}")
        if any(not isinstance(c, int) or c < 0 for c in self.concurrency.values()) or not any(
            self.concurrency.values()
        ):
            raise ValueError(f"period {self.name!r}: concurrency must be integers >= 0, at least one > 0")


@dataclass(frozen=True)
class ShiftParams:
    """The shifting composition of section 6.3: periods in order, and how to size each period's block."""

    putnam: PutnamParams = param(PutnamParams(), "the putnam kind's parameters")
    osworld: OSWorldParams = param(OSWorldParams(), "the osworld kind's parameters")
    periods: tuple[Period, ...] = param(
        (
            Period("putnam", 5_400.0, {"putnam": 288}),
            Period("mixed", 3_600.0, {"putnam": 144, "osworld": 72}),
            Period("osworld", 3_600.0, {"osworld": 144}),
        ),
        "section 6.1: 288 Putnam, then 144 Putnam + 72 OSWorld, then 144 OSWorld agents in three consecutive "
        "hours after a 30-minute warmup (the first period includes the warmup)",
    )
    e2e_estimate_s: dict[str, float] = param(
        {"putnam": 14.0, "osworld": 24.2},
        "table D.1 (Evolving Infra rows): mean E2E latency per request, used only to size each period's block",
    )

    def __post_init__(self) -> None:
        if not self.periods:
            raise ValueError("shift needs at least one period")
        for label in LABELS:
            if any(label in p.concurrency for p in self.periods) and not self.e2e_estimate_s.get(label, 0) > 0:
                raise ValueError(f"e2e_estimate_s needs a value > 0 for {label!r}")

    def task_seconds(self, label: str) -> float:
        """Expected duration of one task: mean steps x (estimated E2E + mean pause)."""
        p = self.putnam if label == "putnam" else self.osworld
        return p.steps.mean * (self.e2e_estimate_s[label] + p.pause_s.mean)

    def closed_loop_agents(self) -> int:
        """About how many agents keep every period busy in closed loop at the estimated task durations."""
        return sum(
            math.ceil(c * period.duration_s / self.task_seconds(label))
            for period in self.periods
            for label, c in period.concurrency.items()
            if c > 0
        )

    def blocks(self, agents: int) -> list[tuple[Period, float, dict[str, int]]]:
        """`(period, start_s, agents per workload)` in order; counts follow concurrency x duration / task time."""
        keys: list[tuple[int, str]] = []
        demand: list[float] = []
        for i, period in enumerate(self.periods):
            for label in LABELS:
                c = period.concurrency.get(label, 0)
                if c > 0:
                    keys.append((i, label))
                    demand.append(c * period.duration_s / self.task_seconds(label))
        if agents < len(keys):
            raise ValueError(f"shift needs at least {len(keys)} agents (one per period and workload), got {agents}")
        counts = apportion(agents - len(keys), demand)
        out: list[tuple[Period, float, dict[str, int]]] = []
        start = 0.0
        for i, period in enumerate(self.periods):
            block = {label: counts[k] + 1 for k, (j, label) in enumerate(keys) if j == i}
            out.append((period, start, block))
            start += period.duration_s
        return out


def mixed_plan(p: MixedParams, agents: int) -> list[str]:
    """Workload labels of the agents in file order, interleaved at the mix ratio."""
    return interleave({k: v for k, v in p.counts(agents).items() if v > 0})


def shift_plan(p: ShiftParams, agents: int, rng: random.Random) -> list[tuple[str, float]]:
    """`(workload, start_s)` per agent in file order: one block per period, start times sorted within it."""
    plan: list[tuple[str, float]] = []
    for period, start, block in p.blocks(agents):
        labels = interleave({k: v for k, v in block.items() if v > 0})
        times = sorted(start + rng.random() * period.duration_s for _ in labels)
        plan.extend(zip(labels, times, strict=True))
    return plan


def shift_periods(p: ShiftParams, agents: int) -> list[dict[str, object]]:
    """The header's `periods`: each period's span, concurrency targets and agent block."""
    out: list[dict[str, object]] = []
    first = 0
    for period, start, block in p.blocks(agents):
        n = sum(block.values())
        out.append(
            {
                "name": period.name,
                "start_s": start,
                "end_s": start + period.duration_s,
                "concurrency": dict(period.concurrency),
                "agents": block,
                "first_agent": f"a{first}",
                "last_agent": f"a{first + n - 1}",
            }
        )
        first += n
    return out


def shift_notes(periods: list[dict[str, object]], enough: int) -> str:
    spans = "; ".join(
        f"{q['name']}: [{q['start_s']:g}, {q['end_s']:g}) s, concurrency {q['concurrency']}, "
        f"agents {q['first_agent']}..{q['last_agent']}"
        for q in periods
    )
    return (
        "Shifting workload composition (paper section 6.3). Periods, in order: " + spans + ". "
        "Each period owns one contiguous block of agents in file order, and every agent's start_s lies inside its "
        "period (uniform arrivals), so open-loop replay follows the shift as is. "
        "Closed-loop replay realizes the periods with per-workload concurrency: while the replay clock is in a "
        "period, keep that period's concurrency of agents of each workload running; whenever one finishes (or the "
        "target rises), start the next not-yet-started agent of that workload from the current period's block, in "
        "file order; at a period boundary, agents still running finish normally and are not replaced beyond the new "
        f"targets; if a block runs out, that workload's slots stay idle (about {enough} agents in all fill "
        "every period at the estimated task durations). "
        "A replayer that only keeps a fixed number of agents in file order still sees the periods in order, "
        "with each period lasting as long as its block does. The same data is in the header's 'periods' key."
    )
