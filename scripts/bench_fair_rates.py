"""Microbenchmark of the simulator's fair shares of concurrent KV flows (`sim.links.fair_rates`, issue #11):

    python scripts/bench_fair_rates.py [FLOWS ...]

For each count of flows (default 8 16 24 48 100 200 400), flows between random pairs of 96 nodes (half peer
fetches over four resources, half KV transfers over two; seeded), timed 200 times through the Python filling and
through the array filling (`_fair_rates_arrays`); prints microseconds per call for each and whether the rates are
equal bit for bit. `fair_rates` itself takes the arrays from `ARRAYS_FROM` flows on.

Boundary: a development tool; calls `sim.links` only.
"""

from __future__ import annotations

import random
import sys
import time

import evolving_infra.sim.links as links
from evolving_infra.sim.links import Resource, _fair_rates_arrays

CAPACITY = {Resource.NIC_OUT: 50e9, Resource.NIC_IN: 50e9, Resource.HOST_MEMORY: 120e9}
CALLS = 200


def flows(n: int, rng: random.Random) -> list[tuple[int, float, tuple[tuple[str, Resource], ...]]]:
    out = []
    for i in range(n):
        a, b = rng.sample(range(96), 2)
        if rng.random() < 0.5:
            res = ((f"n{a}", Resource.NIC_OUT), (f"n{b}", Resource.NIC_IN), (f"n{a}", Resource.HOST_MEMORY),
                   (f"n{b}", Resource.HOST_MEMORY))  # fmt: skip
            out.append((i, 52e9, res))
        else:
            out.append((i, 100e9, ((f"n{a}", Resource.NIC_OUT), (f"n{b}", Resource.NIC_IN))))
    return out


def main(argv: list[str]) -> int:
    rng = random.Random(1)
    for n in [int(a) for a in argv] or [8, 16, 24, 48, 100, 200, 400]:
        if n < 1:
            raise SystemExit(f"flows must be >= 1, got {n}")
        spec = flows(n, rng)
        pending = {key: (cap, res) for key, cap, res in spec}
        saved, links.ARRAYS_FROM = links.ARRAYS_FROM, 10**9  # the Python filling, whatever the count
        try:
            start = time.perf_counter()
            for _ in range(CALLS):
                python = links.fair_rates(spec, CAPACITY.__getitem__)
            python_us = 1e6 * (time.perf_counter() - start) / CALLS
        finally:
            links.ARRAYS_FROM = saved
        start = time.perf_counter()
        for _ in range(CALLS):
            arrays = _fair_rates_arrays(pending, CAPACITY.__getitem__)
        arrays_us = 1e6 * (time.perf_counter() - start) / CALLS
        print(f"{n} flows: python {python_us:.0f} us, arrays {arrays_us:.0f} us, equal: {python == arrays}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
