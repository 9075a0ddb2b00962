"""Seeded random streams for simulations (`RandomStreams`, from the pure core) and arrival processes.

Boundary: making generators and arrival times; the draws are the caller's.
"""

from __future__ import annotations

import numpy as np

from evolving_infra.core.rng import RandomStreams

__all__ = ["RandomStreams", "poisson_arrivals"]


def poisson_arrivals(count: int, rate_per_s: float, rng: np.random.Generator, start: float = 0.0) -> list[float]:
    """`count` arrival times of a Poisson process of `rate_per_s` starting at `start` (sorted)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s!r}")
    gaps = rng.exponential(1.0 / rate_per_s, size=count)
    return [float(t) for t in start + np.cumsum(gaps)]
