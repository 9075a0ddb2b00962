"""Seeded random streams: one independent numpy Generator per named purpose (the simulator's runs, the live
router's policies: both drivers seed a policy's generator from the same named stream).

Invariant: `RandomStreams(seed).get(name)` yields the same sequence for the same `(seed, name)`, whatever
other streams were drawn from and in whatever order; adding a stream never changes the draws of another.
Nothing here touches global random state.

Boundary: making generators; the draws are the caller's.
"""

from __future__ import annotations

import random

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

    def seeded(self, name: str) -> random.Random:
        """A `random.Random` seeded from stream `name` (for policies that draw with the standard library)."""
        return random.Random(int(self.get(name).integers(2**62)))
