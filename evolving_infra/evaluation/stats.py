"""Means over seeds with a two-sided Student-t confidence interval.

Boundary: pure arithmetic on lists of floats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as _stats


@dataclass(frozen=True, slots=True)
class Interval:
    """The mean of `n` values and the half-width of its `level` confidence interval (None below two values)."""

    mean: float
    half: float | None
    n: int
    level: float = 0.95

    def text(self, digits: int = 2) -> str:
        if self.half is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half:.{digits}f}"


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and t-interval half-width of `values` (seeds are independent runs; the spread is their sample
    standard deviation). Raises ValueError on no values, a non-finite value or a level outside (0, 1)."""
    if not values:
        raise ValueError("mean_interval needs at least one value")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"values must be finite numbers, got {list(values)}")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return Interval(mean, None, n, level)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    t = float(_stats.t.ppf(0.5 + level / 2, n - 1))
    return Interval(mean, t * math.sqrt(var / n), n, level)
