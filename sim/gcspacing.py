"""Cyclic garbage collection spaced out while a simulation runs (`spaced_collections`).

A simulation allocates millions of short-lived objects (events, tuples, small arrays) beside millions of long-lived
ones (the trace's requests, the engines' id dicts, the directory's runs). With CPython's default thresholds (700, 10,
10) the youngest generation is collected every 700 net allocations, so objects that live a few simulated seconds are
promoted before they die, and full collections rescan the whole heap again and again: on 9 nodes with 40 agents
each, 127 full collections of ~134 ms each took 13 % of 172 CPU s (measured with `gc.callbacks`), and 3.9 % of the
first 600 simulated s of the 9-node hour. With the first threshold at 50,000 the young objects die before they are
promoted: 1.3 % on the same run (docs/benchmarks.md, "Cyclic collections spaced out").

Boundary: the process's collection thresholds while a simulation runs, restored on exit (nested uses restore the
outer setting). Collection timing is invisible to the simulation: its results do not change (the reference runs are
byte-identical with and without it).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

THRESHOLDS = (50_000, 20, 20)
"""Collection thresholds during a simulation (youngest generation first; see `gc.set_threshold`)."""


@contextmanager
def spaced_collections(thresholds: tuple[int, int, int] = THRESHOLDS) -> Iterator[None]:
    """Collect with `thresholds` inside the block (also usable as a decorator), the previous ones after."""
    before = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*before)
