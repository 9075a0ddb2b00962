"""The share of a closed-loop replay's running agents that each workload label should have over time (`AgentMix`).

A value with its validation and its interpolation; the replayer (`sim.replay`) decides which agent a freed slot
starts. Boundary: pure data, no replay state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AgentMix:
    """Closed loop: the target share of the active agents per workload label over time since the run's start.

    `shares[label][i]` is the label's share at `i * step_s`, linear in between, the last value after the last point.
    At every point the named labels' shares add up to 1."""

    step_s: float
    shares: tuple[tuple[str, tuple[float, ...]], ...]

    def __post_init__(self) -> None:
        if isinstance(self.step_s, bool) or not isinstance(self.step_s, int | float) or not (
            math.isfinite(self.step_s) and self.step_s > 0
        ):
            raise ValueError(f"mix step_s must be a finite number > 0 s, got {self.step_s!r}")
        if not self.shares:
            raise ValueError("a mix needs at least one workload label")
        labels = [label for label, _ in self.shares]
        if len(set(labels)) != len(labels):
            raise ValueError(f"mix labels must be unique, got {labels}")
        points = {len(values) for _, values in self.shares}
        if len(points) != 1 or min(points) < 1:
            raise ValueError("every label of a mix needs the same number (>= 1) of points")
        for label, values in self.shares:
            bad = [v for v in values if not (isinstance(v, int | float) and math.isfinite(v) and 0.0 <= v <= 1.0)]
            if bad:
                raise ValueError(f"mix share of {label!r} must be in [0, 1], got {bad[0]!r}")
        for i in range(points.pop()):
            total = sum(values[i] for _, values in self.shares)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"mix shares at point {i} add up to {total:.6g}, not 1")

    @staticmethod
    def of(step_s: float, shares: Mapping[str, Sequence[float]]) -> AgentMix:
        return AgentMix(float(step_s), tuple((label, tuple(float(v) for v in values))
                                             for label, values in sorted(shares.items())))

    def at(self, t: float) -> dict[str, float]:
        """Each named label's target share `t` seconds after the start."""
        n = len(self.shares[0][1])
        x = max(0.0, t) / self.step_s
        i = min(n - 1, int(x))
        frac = x - i if i < n - 1 else 0.0
        return {label: v[i] + frac * (v[i + 1] - v[i]) if frac else v[i] for label, v in self.shares}
