"""`evolving-infra bench sim`: how fast the cluster simulator runs, in simulated requests per wall-clock second.

    evolving-infra bench sim                      # one simulated hour of CC, 90 agents, 9 nodes, our system
    evolving-infra bench sim --duration 600 --json

One run of `evolving_infra.sim.run.simulate` on the generated CC workload; printed are the wall time and the
process CPU time of the run, the simulated requests finished per wall-clock second, kernel events per second,
simulated seconds per wall-clock second and the process's peak resident memory. The workload is generated agent
by agent as the closed loop starts agents (`sim.run.workload_stream`), inside the timed span, and a request's
pages are hashed when it is issued. `--warmup 0` (the default) uses
the profile's node models, as `simulate --warmup 0` does; the whole simulated span is warmup + duration. Without
`--split`, nine nodes start as 4P5D and other sizes at the same 4:5 ratio (one partition: `--nodes 96 --agents
3840` starts as 43P53D).

    evolving-infra bench sim --workload-only [--eager] --agents 3840 --json   # the workload up to the first event

`--workload-only` measures only what the workload costs before the first event: the process CPU time and the
resident memory added by preparing the trace, content model and replay plan of `2 x --agents` agents, starting the
closed loop of `--agents` and hashing the pages of the requests it issues at t=0; `--eager` prepares it as before
issue #11's lazy workload (the whole trace generated, validated and hashed up front, the whole replay plan).

    evolving-infra bench sim --against-dynamo --json   # the Mooncake conversation trace, ours and Dynamo's replay

`--against-dynamo` replays one Mooncake trace (`--mooncake`, default the conversation trace of the shared
traces; `--mooncake-rows N` for its first N rows) open loop through our simulator (`--system`: evolving,
dynamo or dynamo-kv, at `--split`) and through Dynamo's own replay (its KV router and mocker workers, the side
environment of `scripts/peers/setup-dynamo.sh`), in one run (`peers.judge.judge_dynamo`): both rates in
requests per wall-clock second and their ratio. Without the side environment it prints why and exits 0.

Boundary: measurement and printing only; the figures are never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evolving_infra.cli.bench_machine import machine_reference
from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.run import simulate, workload_stream, workload_trace
from evolving_infra.sim.systems import build_config
from evolving_infra.traces.growing import GrowingTrace


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("sim", help="simulator speed: simulated requests and events per wall-clock second")
    parser.add_argument("--workload", default="cc", choices=["cc", "putnam", "osworld"], help="default cc")
    parser.add_argument("--system", default="evolving", help="system preset (default evolving)")
    parser.add_argument("--agents", type=int, default=90, help="closed-loop concurrency (default 90)")
    parser.add_argument("--nodes", type=int, default=9, help="nodes (default 9)")
    parser.add_argument("--split", help="initial split (default 4P5D at nine nodes, the same 4:5 ratio otherwise)")
    parser.add_argument("--warmup", type=float, default=0.0, help="simulated warmup seconds (default 0)")
    parser.add_argument("--duration", type=float, default=3600.0, help="simulated scored seconds (default 3600)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--against-dynamo", action="store_true",
                        help="replay a Mooncake trace through our simulator and Dynamo's replay; both rates")
    parser.add_argument("--mooncake", default=str(MOONCAKE), help=f"Mooncake trace (default {MOONCAKE})")
    parser.add_argument("--mooncake-rows", type=int, help="replay only the first N rows (default all)")
    parser.add_argument("--dynamo-timeout", type=float, default=600.0, help="seconds allowed for Dynamo's replay")
    parser.add_argument("--workload-only", action="store_true",
                        help="measure only the workload's time and memory up to the first event")
    parser.add_argument("--eager", action="store_true",
                        help="with --workload-only: the whole trace generated and hashed up front (the old way)")
    parser.set_defaults(handler=_run)


MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
PEER_PROFILE = "glm-5.2-4xgb300-tp4"


def default_split(nodes: int) -> str:
    """4P5D at nine nodes, the same 4:5 ratio at other sizes (at least one node of each phase)."""
    prefill = min(nodes - 1, max(1, round(nodes * 4 / 9)))
    return f"{prefill}P{nodes - prefill}D"


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


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
    split = args.split or default_split(args.nodes)
    overrides: dict[str, Any] = {"agents": args.agents, "nodes": args.nodes, "split": split, "seed": args.seed,
                                 "warmup_s": args.warmup, "duration_s": args.duration}
    if args.warmup == 0:
        overrides["models"] = "profile"
    try:
        return build_config(args.system, **overrides)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise CliError(f"invalid settings: {exc}", USAGE_ERROR) from None


def current_rss_mib() -> float:
    """This process's resident memory now (Linux `/proc/self/statm`; 0 where it is not available)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * resource.getpagesize() / (1024 * 1024)


def _run(args: argparse.Namespace) -> int:
    if args.against_dynamo:
        return _against_dynamo(args)
    if args.eager and not args.workload_only:
        raise CliError("--eager goes with --workload-only", USAGE_ERROR)
    if args.workload_only:
        return _workload_only(args)
    cfg = bench_config(args)
    console = Console(stderr=True, quiet=args.json)
    with console.status(f"simulating {args.warmup + args.duration:,.0f} s..."):
        start, cpu = time.perf_counter(), time.process_time()
        trace = workload_stream(args.workload, 2 * args.agents, args.seed)
        result = simulate(cfg, trace, keep_state=True)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert result.state is not None
    content = result.state.content
    requests = len(result.records)
    figures = {
        "workload": args.workload, "system": args.system, "agents": args.agents, "nodes": args.nodes,
        "simulated_s": result.end_time, "wall_s": wall, "requests": requests, "events": result.events,
        "requests_per_wall_s": requests / wall, "events_per_wall_s": result.events / wall,
        "simulated_s_per_wall_s": result.end_time / wall, "split": cfg.split, "peak_rss_mib": peak_rss_mib(),
        "cpu_s": cpu, "requests_hashed": content.hashed_requests, "content_mib_at_end": content.memory_bytes() / 2**20,
        "agents_generated": trace.loaded_agents if isinstance(trace, GrowingTrace) else len(trace.agents),
        "machine": machine_reference(),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    table = Table(title=f"simulator speed: {args.workload}, {args.agents} agents, {args.nodes} nodes, {args.system}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("simulated seconds", f"{result.end_time:,.0f}")
    table.add_row("wall seconds", f"{wall:,.1f}")
    table.add_row("CPU seconds", f"{cpu:,.1f}")
    table.add_row("requests finished", f"{requests:,}")
    table.add_row("simulated requests per wall second", f"{figures['requests_per_wall_s']:,.1f}")
    table.add_row("events per wall second", f"{figures['events_per_wall_s']:,.0f}")
    table.add_row("simulated seconds per wall second", f"{figures['simulated_s_per_wall_s']:,.1f}")
    table.add_row("peak resident memory (MiB)", f"{figures['peak_rss_mib']:,.0f}")
    table.add_row("machine reference (bench machine), M per CPU s", f"{figures['machine']['reference_mops_per_cpu_s']:.2f}")
    Console().print(table)
    return 0


def _against_dynamo(args: argparse.Namespace) -> int:
    """The Mooncake trace through our simulator and Dynamo's replay (see the module docstring)."""
    from evolving_infra.peers.dynamo_replay import DynamoReplayError, dynamo_ready
    from evolving_infra.peers.judge import OurSide, judge_dynamo
    from evolving_infra.traces.loader import trace_from_records
    from evolving_infra.traces.mooncake import MooncakeError, convert_mooncake, read_mooncake

    try:
        side = OurSide(args.system)
    except ValueError:
        known = ", ".join(s.value for s in OurSide)
        raise CliError(f"--against-dynamo compares one of {known} with Dynamo's replay, not {args.system!r}",
                       USAGE_ERROR) from None  # fmt: skip
    if args.mooncake_rows is not None and args.mooncake_rows < 1:
        raise CliError(f"--mooncake-rows must be >= 1, got {args.mooncake_rows}", USAGE_ERROR)
    split = args.split or default_split(args.nodes)
    reason = dynamo_ready()
    if reason is not None:
        message = f"Dynamo's replay is not installed, comparison skipped: {reason}"
        print(json.dumps({"against_dynamo": {"skipped": message}}) if args.json else message)
        return 0
    try:
        rows = read_mooncake(args.mooncake)[: args.mooncake_rows]
    except (OSError, MooncakeError) as exc:
        raise CliError(f"cannot read the Mooncake trace {args.mooncake}: {exc}", USAGE_ERROR) from None
    records, _ = convert_mooncake(rows, name=f"mooncake-{Path(args.mooncake).stem}", source=str(args.mooncake))
    trace = trace_from_records(records)
    try:
        report = judge_dynamo(trace, profile=PEER_PROFILE, split=split, sides=(side,), seed=args.seed,
                              timeout_s=args.dynamo_timeout)  # fmt: skip
    except DynamoReplayError as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc), USAGE_ERROR) from None
    speed = report["speed"]
    ours, theirs = speed[side.value], speed["dynamo-replay"]
    figures = {
        "trace": args.mooncake, "requests": len(trace.requests), "split": split, "profile": PEER_PROFILE,
        "system": side.value, "ours_wall_s": ours["wall_s"], "ours_requests_per_wall_s": ours["requests_per_wall_s"],
        "dynamo_wall_s": theirs["wall_s"], "dynamo_requests_per_wall_s": theirs["requests_per_wall_s"],
        "ratio_ours_to_dynamo": ours["requests_per_wall_s"] / theirs["requests_per_wall_s"],
        "matched_requests": report["matched_requests"], "peak_rss_mib": peak_rss_mib(),
    }  # fmt: skip
    if args.json:
        print(json.dumps({"against_dynamo": figures}, indent=2))
        return 0
    print(f"{figures['requests']:,} requests of {args.mooncake} at {split}: ours ({side.value}) "
          f"{figures['ours_requests_per_wall_s']:,.1f} req/wall-s, Dynamo's replay "
          f"{figures['dynamo_requests_per_wall_s']:,.1f} req/wall-s, ratio {figures['ratio_ours_to_dynamo']:.3f}")
    return 0


def _workload_only(args: argparse.Namespace) -> int:
    """The workload's CPU time and added resident memory up to the first event (see the module docstring)."""
    from evolving_infra.node_agent.profiles import load_profile
    from evolving_infra.sim.replay import AgentReplayer, IssueRequest, ReplayMode, ReplayPlan, StreamedPlan
    from evolving_infra.traces.content import ContentModel, PageLabels

    cfg = bench_config(args)
    page_tokens = load_profile(cfg.profile).page_tokens
    count = 2 * args.agents
    rss, cpu = current_rss_mib(), time.process_time()
    trace = workload_trace(args.workload, count, args.seed) if args.eager else workload_stream(
        args.workload, count, args.seed)  # fmt: skip
    content = ContentModel(trace, page_tokens, lazy=not args.eager,  # (lazy: as the simulator builds it)
                           labels=PageLabels.CONTENT_HASH if args.eager else PageLabels.DENSE)
    plan = StreamedPlan(trace) if isinstance(trace, GrowingTrace) else ReplayPlan.from_trace(trace)
    replayer = AgentReplayer(plan, ReplayMode.closed_loop(args.agents))
    issued = [e.request.id for e in replayer.start(0.0) if isinstance(e, IssueRequest)]
    for rid in issued:
        content.prompt_pages(rid)
        content.context_pages(rid)
    cpu = time.process_time() - cpu
    figures = {
        "workload": args.workload, "agents": args.agents, "trace_agents": count, "eager": args.eager,
        "agents_generated": trace.loaded_agents if isinstance(trace, GrowingTrace) else len(trace.agents),
        "requests_loaded": len(trace.requests), "requests_issued_at_0": len(issued),
        "requests_hashed": content.hashed_requests, "content_mib": content.memory_bytes() / 2**20,
        "cpu_s": cpu, "rss_added_mib": current_rss_mib() - rss, "peak_rss_mib": peak_rss_mib(),
    }  # fmt: skip
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))
    return 0
