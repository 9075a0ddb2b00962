"""Admission of open-loop agents (appendix D.3): of the agents arriving in the scored window, how many a run
admitted by the window's end and how long they waited, from the (arrival, start) pairs the driver records and
the arrivals still waiting when the run stopped (`AgentReplayer.admissions`).

D.3 counts a rate as sustained only if at least 90 % of the arriving agents are admitted (at most 258 active).
An agent counts as admitted when it started by the window's end; one still waiting then, or started after it,
does not. Waits are start - arrival of the admitted ones.

Boundary: pure arithmetic over the recorded pairs; recording them is the replayer's, the targets are
`evaluation.search`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def admission_summary(admitted: Iterable[tuple[float, float]], waiting: Iterable[float], start: float,
                      end: float) -> dict[str, Any]:  # fmt: skip
    """D.3's admission figures over the window [start, end): `admitted` are (arrival, start) pairs of agents
    that started, `waiting` the arrival times of agents never started."""
    if end < start:
        raise ValueError(f"window ends before it starts: [{start}, {end})")
    arrived = 0
    waits: list[float] = []
    for arrival, began in admitted:
        if began < arrival:
            raise ValueError(f"an agent started at {began} before it arrived at {arrival}")
        if start <= arrival < end:
            arrived += 1
            if began < end:
                waits.append(began - arrival)
    arrived += sum(1 for arrival in waiting if start <= arrival < end)
    w = np.asarray(waits, dtype=float)
    return {
        "arrived": arrived,
        "admitted": len(waits),
        "admitted_fraction": len(waits) / arrived if arrived else None,
        "wait_mean_s": float(w.mean()) if len(w) else None,
        "wait_p95_s": float(np.percentile(w, 95)) if len(w) else None,
    }
