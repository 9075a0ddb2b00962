"""`evolving-infra bench sim`: how fast the cluster simulator runs, in simulated requests per wall-clock second.

    evolving-infra bench sim                      # one simulated hour of CC, 90 agents, 9 nodes, our system
    evolving-infra bench sim --duration 600 --json

One run of `evolving_infra.sim.run.simulate` on the generated CC workload; printed are the wall time (trace
generation excluded), the simulated requests finished per wall-clock second, kernel events per second and
simulated seconds per wall-clock second. `--warmup 0` (the default) uses the profile's node models, as
`simulate --warmup 0` does; the whole simulated span is warmup + duration.

Boundary: measurement and printing only; the figures are never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.run import simulate, workload_trace
from evolving_infra.sim.systems import build_config


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("sim", help="simulator speed: simulated requests and events per wall-clock second")
    parser.add_argument("--workload", default="cc", choices=["cc", "putnam", "osworld"], help="default cc")
    parser.add_argument("--system", default="evolving", help="system preset (default evolving)")
    parser.add_argument("--agents", type=int, default=90, help="closed-loop concurrency (default 90)")
    parser.add_argument("--nodes", type=int, default=9, help="nodes (default 9)")
    parser.add_argument("--split", default="4P5D", help="initial split (default 4P5D)")
    parser.add_argument("--warmup", type=float, default=0.0, help="simulated warmup seconds (default 0)")
    parser.add_argument("--duration", type=float, default=3600.0, help="simulated scored seconds (default 3600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(handler=_run)


def bench_config(args: argparse.Namespace) -> SimConfig:
    """The simulator configuration of the benchmark, or a `CliError` naming the bad flag."""
    if args.agents < 1:
        raise CliError(f"--agents must be >= 1, got {args.agents}", USAGE_ERROR)
    if args.nodes < 2:
        raise CliError(f"--nodes must be >= 2 (one prefill and one decode node), got {args.nodes}", USAGE_ERROR)
    if args.duration <= 0:
        raise CliError(f"--duration must be > 0 simulated seconds, got {args.duration:g}", USAGE_ERROR)
    if args.warmup < 0:
        raise CliError(f"--warmup must be >= 0 simulated seconds, got {args.warmup:g}", USAGE_ERROR)
    overrides: dict[str, Any] = {"agents": args.agents, "nodes": args.nodes, "split": args.split, "seed": args.seed,
                                 "warmup_s": args.warmup, "duration_s": args.duration}
    if args.warmup == 0:
        overrides["models"] = "profile"
    try:
        return build_config(args.system, **overrides)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise CliError(f"invalid settings: {exc}", USAGE_ERROR) from None


def _run(args: argparse.Namespace) -> int:
    cfg = bench_config(args)
    console = Console(stderr=True, quiet=args.json)
    with console.status(f"generating {2 * args.agents} {args.workload} agents..."):
        trace = workload_trace(args.workload, 2 * args.agents, args.seed)
    with console.status(f"simulating {args.warmup + args.duration:,.0f} s..."):
        start = time.perf_counter()
        result = simulate(cfg, trace)
        wall = time.perf_counter() - start
    requests = len(result.records)
    figures = {
        "workload": args.workload, "system": args.system, "agents": args.agents, "nodes": args.nodes,
        "simulated_s": result.end_time, "wall_s": wall, "requests": requests, "events": result.events,
        "requests_per_wall_s": requests / wall, "events_per_wall_s": result.events / wall,
        "simulated_s_per_wall_s": result.end_time / wall,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    table = Table(title=f"simulator speed: {args.workload}, {args.agents} agents, {args.nodes} nodes, {args.system}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("simulated seconds", f"{result.end_time:,.0f}")
    table.add_row("wall seconds", f"{wall:,.1f}")
    table.add_row("requests finished", f"{requests:,}")
    table.add_row("simulated requests per wall second", f"{figures['requests_per_wall_s']:,.1f}")
    table.add_row("events per wall second", f"{figures['events_per_wall_s']:,.0f}")
    table.add_row("simulated seconds per wall second", f"{figures['simulated_s_per_wall_s']:,.1f}")
    Console().print(table)
    return 0
