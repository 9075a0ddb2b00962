"""`evolving-infra bench machine`: a fixed reference workload that says how fast this machine runs Python today.

The development machines are shared virtual machines whose speed moves by 2x and more from day to day (the same
tree's `bench router` gave 1,367 and 5,600 decisions per second a few days apart), so a figure from one day does not
compare with a figure from another. `bench router` and `bench sim` print this reference beside their figures
(`machine` in their JSON): a figure divided by the reference of the same run compares across days; a ratio of two
trees measured in one run needs no reference.

The reference: a fixed loop of the operations the router and the simulator spend their time on (dict probes and
updates keyed by ints, small tuples, float arithmetic, list appends), timed in thread CPU time (so preemption by
other processes is left out), best of `repeats` runs (a slower run is interference, not the machine). Reported as
reference operations per CPU second, in millions.

Boundary: timing only; nothing here is asserted in tests beyond its shape.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Any

from rich.console import Console

LOOP = 200_000
"""Iterations of the reference loop (each a handful of operations; about 0.05 s of CPU on the development machine)."""


def _reference_loop(n: int) -> float:
    table: dict[int, float] = {}
    out: list[tuple[int, float]] = []
    acc = 0.0
    for i in range(n):
        key = (i * 7919) & 4095
        value = table.get(key, 0.0) + i * 0.5
        table[key] = value
        acc += value * 1e-9 - (acc * 0.25)
        if i & 7 == 0:
            out.append((key, acc))
    return acc + len(out)


def machine_reference(repeats: int = 5, loop: int = LOOP) -> dict[str, Any]:
    """The reference figure of this process on this machine now (see the module docstring)."""
    if repeats < 1 or loop < 1:
        raise ValueError(f"repeats and loop must be >= 1, got {repeats}, {loop}")
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        _reference_loop(loop)
        best = min(best, time.thread_time() - start)
    best = max(best, 1e-9)
    return {
        "reference_mops_per_cpu_s": loop / best / 1e6,
        "reference_loop": loop,
        "repeats": repeats,
        "python": platform.python_version(),
        "processor": _processor(),
    }


def _processor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("machine", help="a fixed reference workload: how fast this machine runs Python now")
    parser.add_argument("--repeats", type=int, default=5, help="runs of the reference loop; the best counts")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from evolving_infra.cli.errors import USAGE_ERROR, CliError

    if args.repeats < 1:
        raise CliError("--repeats must be >= 1", USAGE_ERROR)
    figures = machine_reference(args.repeats)
    if args.json:
        print(json.dumps({"machine": figures}, indent=2))
    else:
        Console().print(f"reference: {figures['reference_mops_per_cpu_s']:.2f} M loop iterations per CPU second "
                        f"(best of {figures['repeats']}; Python {figures['python']}, {figures['processor']})")
    return 0
