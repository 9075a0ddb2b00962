"""How far each running partition is, in a small file beside the fleet's stored results.

A partition runs in a worker process (or on a Ray node) for up to hours; it reports nothing until it ends. With
a progress file (`PartitionTask.progress_path`) its run writes, every `EVERY` kernel events and at most every
`MIN_INTERVAL_S` seconds of wall time, a JSON object: the simulated time reached and the run's end, kernel events,
wall seconds so far, process id, host and the time written (to a temporary file, then renamed, so a reader never
sees half of it); the file is removed when the run ends. The driver reads these files to print progress while it
waits, and `simulate --fleet --stored-only` to show the partitions still running. Watching never changes a run:
the kernel's progress hook only reads its clock and counters.

Boundary: writing and reading progress files; what runs is `fleet.sim`'s.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evolving_infra.sim.kernel import Progress

EVERY = 20_000
"""Kernel events between two looks at the clock (the kernel's `progress_every`)."""
MIN_INTERVAL_S = 10.0
"""Least wall time between two writes of a progress file."""
SUFFIX = ".progress"


def writer(path: Path, end_s: float | None) -> Callable[[Progress], None]:
    """The kernel's progress hook for one partition run: writes `path` (see the module's docstring)."""
    start = time.perf_counter()
    last = -MIN_INTERVAL_S
    host, pid = socket.gethostname(), os.getpid()

    def report(p: Progress) -> None:
        nonlocal last
        wall = time.perf_counter() - start
        if wall - last < MIN_INTERVAL_S:
            return
        last = wall
        body = {"sim_s": p.now, "end_s": end_s, "events": p.processed, "wall_s": wall, "pid": pid, "host": host,
                "written": time.time()}
        temporary = path.with_name(f"{path.name}.{pid}.tmp")
        try:
            temporary.write_text(json.dumps(body))
            temporary.replace(path)
        except OSError:
            pass  # progress is best effort: a full disk or a removed folder must not stop the run

    return report


def done(path: Path) -> None:
    """The run ended: its progress file goes."""
    path.unlink(missing_ok=True)


def read(path: Path) -> dict[str, Any] | None:
    """The last progress `path` holds, or None (no file, or one that cannot be read)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def describe(value: dict[str, Any], now: float | None = None) -> str:
    """One line: `3,100 / 7,320 simulated s, 1,234,567 events, 25.0 min wall (written 4 s ago by host:pid)`."""
    now = time.time() if now is None else now
    end = value.get("end_s")
    reach = f"{value.get('sim_s', 0.0):,.0f}" + (f" / {end:,.0f}" if isinstance(end, (int, float)) else "")
    age = max(0.0, now - float(value.get("written", now)))
    return (f"{reach} simulated s, {int(value.get('events', 0)):,} events, {float(value.get('wall_s', 0.0)) / 60:.1f} "
            f"min wall (written {age:,.0f} s ago by {value.get('host')}:{value.get('pid')})")
