"""Seeded random streams for simulations: one independent numpy Generator per named purpose.

Invariant: `RandomStreams(seed).get(name)` yields the same sequence for the same `(seed, name)`, whatever
other streams were drawn from and in whatever order; adding a stream never changes the draws of another.
Nothing here touches global random state.

Boundary: making generators; the draws are the caller's.
"""

from __future__ import annotations

import numpy as np
import xxhash


class RandomStreams:
    """Named, independent generators derived from one seed (numpy SeedSequence with a per-name spawn key)."""

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self._seed = seed
        self._streams: dict[str, np.random.Generator] = {}

    @property
    def seed(self) -> int:
        return self._seed

    def get(self, name: str) -> np.random.Generator:
        """The generator for `name` (made on first use, then the same object)."""
        stream = self._streams.get(name)
        if stream is None:
            key = xxhash.xxh64_intdigest(name.encode("utf-8"))
            stream = np.random.Generator(np.random.PCG64(np.random.SeedSequence(self._seed, spawn_key=(key,))))
            self._streams[name] = stream
        return stream


def poisson_arrivals(count: int, rate_per_s: float, rng: np.random.Generator, start: float = 0.0) -> list[float]:
    """`count` arrival times of a Poisson process of `rate_per_s` starting at `start` (sorted)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not rate_per_s > 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s!r}")
    gaps = rng.exponential(1.0 / rate_per_s, size=count)
    return [float(t) for t in start + np.cumsum(gaps)]
