"""Random draws for the workload generators: a clamped log-normal, apportioning and interleaving.

Boundary: pure functions of a `random.Random` passed in; no global random state. Normal draws use an explicit
Box-Muller transform of `rng.random()`, so a seed gives the same numbers on every Python version.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def normal(rng: random.Random) -> float:
    """A standard normal draw from two uniforms (Box-Muller; no cached second value)."""
    u1 = rng.random()
    u2 = rng.random()
    return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)


@dataclass(frozen=True)
class LogNormal:
    """A log-normal draw given by its `mean` and the standard deviation `sigma` of its logarithm.

    `sigma == 0` gives the constant `mean`. Draws are clamped to `[lo, hi]` (`hi=None`: unbounded), which moves
    the mean of the draws slightly when the clamp bites. Integer draws round to the nearest integer.
    """

    mean: float
    sigma: float = 0.0
    lo: float = 0.0
    hi: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean) and self.mean > 0):
            raise ValueError(f"LogNormal mean must be a finite number > 0, got {self.mean!r}")
        if not (math.isfinite(self.sigma) and 0 <= self.sigma <= 5):
            raise ValueError(f"LogNormal sigma must be in [0, 5], got {self.sigma!r}")
        if not (math.isfinite(self.lo) and self.lo >= 0):
            raise ValueError(f"LogNormal lo must be a finite number >= 0, got {self.lo!r}")
        if self.hi is not None and not (math.isfinite(self.hi) and self.hi >= self.lo):
            raise ValueError(f"LogNormal hi must be a finite number >= lo ({self.lo}), got {self.hi!r}")

    @property
    def median(self) -> float:
        return self.mean * math.exp(-0.5 * self.sigma**2)

    def sample(self, rng: random.Random) -> float:
        if self.sigma == 0:
            x = self.mean
        else:
            mu = math.log(self.mean) - 0.5 * self.sigma**2
            x = math.exp(mu + self.sigma * normal(rng))
        x = max(x, self.lo)
        return x if self.hi is None else min(x, self.hi)

    def sample_int(self, rng: random.Random) -> int:
        return int(round(self.sample(rng)))


def bernoulli(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def choose_weighted(rng: random.Random, weights: Mapping[int, float]) -> int:
    """A key of `weights` drawn with probability proportional to its weight (keys in sorted order)."""
    keys = sorted(weights)
    total = sum(weights[k] for k in keys)
    u = rng.random() * total
    acc = 0.0
    for k in keys:
        acc += weights[k]
        if u < acc:
            return k
    return keys[-1]


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split `total` into integers proportional to `weights` (largest remainder; ties to the earlier one)."""
    if total < 0:
        raise ValueError(f"cannot apportion a negative total {total}")
    s = float(sum(weights))
    if s <= 0:
        raise ValueError("apportion needs at least one positive weight")
    exact = [total * w / s for w in weights]
    counts = [int(math.floor(x)) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def interleave(counts: Mapping[str, int]) -> list[str]:
    """Labels with the given counts, spread evenly: each next label is the one furthest behind its share."""
    total = sum(counts.values())
    done = dict.fromkeys(counts, 0)
    out: list[str] = []
    for i in range(total):
        label = max(counts, key=lambda k: ((i + 1) * counts[k] / total - done[k], -list(counts).index(k)))
        done[label] += 1
        out.append(label)
    return out


def poisson_arrivals(rng: random.Random, count: int, rate_per_s: float, start_s: float = 0.0) -> list[float]:
    """`count` arrival times of a Poisson process of `rate_per_s` that starts at `start_s` (first one there)."""
    times: list[float] = []
    t = start_s
    for i in range(count):
        if i > 0:
            t += -math.log(1.0 - rng.random()) / rate_per_s
        times.append(t)
    return times
