"""`evolving-infra bench fleet`: how fast and how large a simulated fleet runs (appendix D.2 scales).

    evolving-infra bench fleet --json                             # both runs below, with their defaults
    evolving-infra bench fleet --run eighth --duration 600 --json # a shorter 1/8-scale run (rate, projection)
    evolving-infra bench fleet --run smoke --smoke-duration 30

Two runs of `simulate --fleet` (our system; each partition's planner from its CR), on the generated fleet workload:

- `eighth`: the 1/8-scale fleet, `examples/fleet-d2/fleet-1of8.yaml` (8 partitions x 12 nodes x 4 GPUs = 384
  GPUs), 3,840 concurrent agents (10 per GPU), `--warmup` + `--duration` simulated seconds (default 600 + 6,600:
  the two simulated hours the local shifts are compressed into);
- `smoke`: the full fleet, `examples/fleet-d2/fleet-3072.yaml` (8 x 96 nodes x 4 GPUs = 3,072 GPUs), 30,720
  concurrent agents, `--smoke-duration` simulated seconds from a cold start (profile models, no warmup, no drain):
  it shows the fleet fits in memory and gives its rate.

Printed per run: GPUs simulated, simulated seconds, wall seconds (workload planning and binding included; each
worker generates its own partition's tasks), requests finished, **simulated requests per wall second**, kernel
events per wall second, the largest worker's peak resident memory and this process's, and the projected wall time
of the same run for a longer simulated span at the measured rate (`--project S`).

Boundary: measurement and printing only; the figures are never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.fleet.executors import ExecutorKind, open_executor
from evolving_infra.fleet.partitions import load_partitions
from evolving_infra.fleet.runs import simulate_fleet
from evolving_infra.fleet.sim import FleetOptions, FleetWorkload
from evolving_infra.workloads.fleet import FleetParams

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet-d2"
RUNS = {
    "eighth": ("fleet-1of8.yaml", 3_840),
    "smoke": ("fleet-3072.yaml", 30_720),
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("fleet", help="fleet simulator: 1/8-scale D.2 fleet and a 3,072-GPU smoke run")
    parser.add_argument("--run", choices=["eighth", "smoke", "both"], default="both", help="default both")
    parser.add_argument("--fleet-dir", default=str(EXAMPLES), help="folder of fleet-1of8.yaml and fleet-3072.yaml")
    parser.add_argument("--warmup", type=float, default=600.0, help="1/8 run: simulated warmup s (default 600)")
    parser.add_argument("--duration", type=float, default=6600.0, help="1/8 run: scored simulated s (default 6600)")
    parser.add_argument("--smoke-duration", type=float, default=120.0, help="3,072-GPU run: simulated s (default 120)")
    parser.add_argument("--executor", choices=[k.value for k in ExecutorKind], default="processes")
    parser.add_argument("--workers", type=int, help="worker processes (default: this machine's CPUs)")
    parser.add_argument("--ray-address", help="run the partitions on this Ray cluster")
    parser.add_argument("--project", type=float, default=7200.0,
                        help="project the wall time of this many simulated seconds at the measured rate (default 7200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(handler=_run)


def bench_one(name: str, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    file, agents = RUNS[name]
    partitions = load_partitions([Path(args.fleet_dir) / file])
    if name == "eighth":
        warmup, duration, drain = args.warmup, args.duration, None
    else:
        warmup, duration, drain = 0.0, args.smoke_duration, 0.0
    if duration <= 0 or warmup < 0:
        raise CliError("durations must be > 0 and warmups >= 0 simulated seconds", USAGE_ERROR)
    opts = FleetOptions(duration_s=duration, warmup_s=warmup, agents=agents, seed=args.seed, drain_s=drain)
    kind = ExecutorKind.RAY if args.ray_address else ExecutorKind(args.executor)
    start = time.perf_counter()
    workload = FleetWorkload.generated(replace(FleetParams(), span_s=warmup + duration), agents, args.seed)
    with open_executor(kind, args.workers, args.ray_address) as executor:
        with console.status(f"{name}: {len(partitions)} partitions, {agents:,} agents, {warmup + duration:,.0f} s..."):
            result = simulate_fleet(partitions, workload, opts, executor)
    wall = time.perf_counter() - start
    requests = sum(p.requests for p in result.partitions)
    events = sum(p.events for p in result.partitions)
    simulated = max(p.sim_end_s for p in result.partitions)
    return {
        "run": name, "fleet": file, "partitions": len(partitions), "gpus": sum(p.gpus for p in partitions),
        "nodes": sum(p.node_count for p in partitions), "agents": agents, "executor": kind.value,
        "workers": args.workers, "simulated_s": simulated, "wall_s": wall, "requests": requests, "events": events,
        "requests_per_wall_s": requests / wall, "events_per_wall_s": events / wall,
        "simulated_s_per_wall_s": simulated / wall,
        "peak_worker_rss_mb": max(p.peak_rss_mb for p in result.partitions),
        "main_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "partition_wall_s_sum": sum(p.wall_s for p in result.partitions),
        "projected_wall_s": wall * args.project / simulated if simulated > 0 else None,
        "projected_for_simulated_s": args.project,
    }


def _run(args: argparse.Namespace) -> int:
    console = Console(stderr=True, quiet=args.json)
    names = ["eighth", "smoke"] if args.run == "both" else [args.run]
    figures = [bench_one(name, args, console) for name in names]
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    table = Table(title="fleet simulator")
    table.add_column("figure")
    for f in figures:
        table.add_column(f["run"], justify="right")
    for key in ("gpus", "agents", "simulated_s", "wall_s", "requests", "requests_per_wall_s", "events_per_wall_s",
                "peak_worker_rss_mb", "main_rss_mb", "projected_wall_s"):
        table.add_row(key, *(f"{f[key]:,.1f}" if isinstance(f[key], float) else f"{f[key]:,}" for f in figures))
    Console().print(table)
    return 0
