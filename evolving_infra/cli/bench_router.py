"""`evolving-infra bench router` and `evolving-infra bench switch`: the router's decision rate and HTTP overhead,
and the phase-switch time on a local cluster.

bench router (one process, seeded workload built before timing):
- routing decisions: a `RouterCore` with `--prefill-nodes` prefill nodes (96) and the `ttft` policy with the
  profile's models. Its directory holds `--prefixes` shared system prompts (each on several nodes, GPU and host)
  and `--branches` agent contexts (a system prompt plus their own pages, on one node's GPU and host and some on a
  second node's host). Every node has a realistic queue: a running chunked prefill and 0-8 queued requests sent
  through the core (so each view carries the report, unreported and in-flight requests). A timed decision is
  `route()` of one request that extends a random branch by a turn (directory lookup + one view per node + the
  policy + placement); the request is then forgotten, so the queues stay the same size. Latency is printed as
  wall clock and as thread CPU time (which leaves out preemption by other processes on a shared machine).
  `--queue-max` sets the longest queue (each node gets 0 to that many queued requests); with `--reports N`, N random
  prefill nodes report before each decision (their running prefill's remaining tokens drawn afresh, 1 to 8,192:
  a new state, so those nodes' backlogs are computed again; the reports untimed, the decision timed), as nodes do
  at every iteration.
- HTTP overhead: the HTTP front end (`router/http`) with `FakeBackend` on 127.0.0.1, one streaming
  `/v1/completions` request at a time (a 2,000-token prompt as token ids, 16 output tokens), against calling the
  same backend's `complete()` directly; overhead per request = the difference of the means (same run).

bench switch: `evolving_infra.local.switch_bench` (node-reported SwitchPhase times, idle and under load).

Boundary: timing and printing only.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import time
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from evolving_infra.cli.bench_machine import machine_reference
from evolving_infra.cli.errors import USAGE_ERROR, CliError
from evolving_infra.cli.router import shape_from_profile
from evolving_infra.core.kv_events import KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Tier
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.router.branches import BranchTable
from evolving_infra.router.core import CoreSettings, NodeTrack, PoolSnapshot, RoutedRequest, RouterCore
from evolving_infra.router.http import RouterHttpSettings, start_server
from evolving_infra.router.http.backend import BranchRef, CompletionRequest
from evolving_infra.router.http.fake import FakeBackend
from evolving_infra.router.routing import RouteRequest, RunningPrefill, make_decode_binder, make_prefill_router

PT = 64
PROFILE = "deepseek-v4-flash-4xh200-tp4"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("router", help="routing decisions per second and latency (96 prefill nodes), HTTP overhead")
    p.add_argument("--prefill-nodes", type=int, default=96)
    p.add_argument("--prefixes", type=int, default=32, help="shared system prompts in the directory")
    p.add_argument("--branches", type=int, default=2000, help="agent contexts in the directory")
    p.add_argument("--decisions", type=int, default=2000, help="timed routing decisions")
    p.add_argument("--http-requests", type=int, default=400, help="timed HTTP requests (and as many direct calls)")
    p.add_argument("--queue-max", type=int, default=8, help="queued requests per prefill node: 0 to this many")
    p.add_argument("--reports", type=int, default=0, help="prefill nodes reporting progress before each decision")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--page-exact-counts", action="store_true",
                   help="keep the branch counts page by page (the oracle's form) instead of per run, to compare")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=_router)
    s = sub.add_parser("switch", help="phase-switch time after drain on a local cluster (node-reported)")
    s.add_argument("--idle", type=int, default=6, help="switches of an idle node")
    s.add_argument("--loaded", type=int, default=6, help="switches while agents replay through the router")
    s.add_argument("--json", action="store_true", help="print the figures as JSON")
    s.set_defaults(handler=_switch)


def _pages(tag: str, n: int) -> tuple[PageHash, ...]:
    return tuple(chain_hashes(f"{tag}:{i}".encode() for i in range(n)))


def build_core(
    prefill_nodes: int, prefixes: int, branches: int, rng: random.Random, *, page_exact_counts: bool = False,
    queue_max: int = 8,
) -> tuple[RouterCore, list[tuple[str, tuple[PageHash, ...]]]]:
    shape = shape_from_profile(load_profile(PROFILE))
    nodes = [NodeId(f"p{i:03d}") for i in range(prefill_nodes)] + [NodeId(f"d{i:02d}") for i in range(max(1, prefill_nodes // 3))]
    tracks = {}
    for n in nodes:
        phase = Phase.PREFILL if n.startswith("p") else Phase.DECODE
        tracks[n] = NodeTrack(n, phase, mode=NodeMode(phase.value), pool=PoolSnapshot(PT, l1_free=100_000, l1_cached=50_000))
    table = BranchTable({n: t.phase or Phase.PREFILL for n, t in tracks.items()}, page_exact=page_exact_counts)
    core = RouterCore(tracks, router=make_prefill_router("ttft"), binder=make_decode_binder("fewest-requests", random.Random(1)),
                      settings=CoreSettings(shared_pool=True, kv_capacity_tokens=shape.l1_tokens), branches=table)  # fmt: skip
    prefill = [n for n in nodes if n.startswith("p")]
    for n in nodes:
        core.router_models[n] = shape.router_model()
        core.planner_models[n] = shape.planner_model()
    systems = [_pages(f"sys{i}", rng.randint(100, 400)) for i in range(prefixes)]
    events = []
    for i, sys_pages in enumerate(systems):
        for n in rng.sample(prefill, min(len(prefill), 8)):
            events += [KvStored(n, Tier.GPU, None, sys_pages, 0.0), KvStored(n, Tier.HOST, None, sys_pages, 0.0)]
    contexts = []
    for b in range(branches):
        base = rng.choice(systems)
        own = _pages(f"b{b}", rng.randint(20, 1500))
        path = base + tuple(chain_hashes((f"b{b}:{i}".encode() for i in range(len(own))), parent=base[-1]))
        home = rng.choice(prefill)
        events += [KvStored(home, Tier.GPU, None, path, 0.0), KvStored(home, Tier.HOST, None, path, 0.0)]
        if rng.random() < 0.3:
            events.append(KvStored(rng.choice(prefill), Tier.HOST, None, path, 0.0))
        contexts.append((f"b{b}", path))
    core.absorb(events)
    for branch, path in contexts:
        core.admit(BranchId(branch), path)
    sent = 0
    for node in prefill:  # realistic queues: requests sent through the core, a running prefill and a report
        queued = []
        for _ in range(rng.randint(0, queue_max)):
            branch, path = rng.choice(contexts)
            req = _request(core, f"q{sent}", branch, path, rng)
            sent += 1
            core.route(req, 0.0)
            core.prefill_sent(req)
            assert req.prefill_node is not None  # routed just above
            if req.prefill_node != node:  # keep each node's queue its own: move the request where we want it
                core.nodes[req.prefill_node].sent.pop(req.id, None)
                req.prefill_node = node
                core.nodes[node].sent[req.id] = req
            queued.append(req.id)
        running = (RunningPrefill(RequestId(f"run-{node}"), rng.randint(500, 8000), rng.randint(0, 60_000)),)
        core.nodes[node].record_report(0.0, running, tuple(queued))
    return core, contexts


def _request(core: RouterCore, rid: str, branch: str, path: tuple[PageHash, ...], rng: random.Random) -> RoutedRequest:
    turn = tuple(chain_hashes((f"{rid}:{i}".encode() for i in range(rng.randint(1, 40))), parent=path[-1]))
    pages = path + turn
    route = RouteRequest(RequestId(rid), BranchId(branch), pages, len(pages) * PT + 10, rng.randint(50, 2000), page_tokens=PT)
    return RoutedRequest(route, pages, core.admit(BranchId(branch), pages))


def bench_decisions(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    if args.queue_max < 0 or args.reports < 0:
        raise SystemExit("bench router: --queue-max and --reports must be >= 0")
    core, contexts = build_core(args.prefill_nodes, args.prefixes, args.branches, rng,
                                page_exact_counts=args.page_exact_counts, queue_max=args.queue_max)  # fmt: skip
    requests = [_request(core, f"t{i}", *rng.choice(contexts), rng) for i in range(args.decisions)]
    prefill = [n for n, t in core.nodes.items() if t.phase is Phase.PREFILL]
    queued = {n: tuple(str(rid) for rid in core.nodes[n].sent) for n in prefill}
    backlogs = getattr(core.router, "backlogs", None)
    replays = backlogs.replays if backlogs is not None else 0
    latencies, cpu = [], []
    pushed = 0
    now = 1.0
    gc.collect()  # the setup's garbage is not the router's: do not time its collection
    for req in requests:
        for node in rng.sample(prefill, min(args.reports, len(prefill))):  # progress reports (untimed)
            track = core.nodes[node]
            run = track.report_running[0]
            running = RunningPrefill(run.request, rng.randint(1, 8192), run.context_tokens)  # its chunk's progress
            track.record_report(now, (running,), queued[node])
        started, cpu_started = time.perf_counter(), time.thread_time()
        routed = core.route(req, now)
        cpu.append(time.thread_time() - cpu_started)
        latencies.append(time.perf_counter() - started)
        pushed += sum(len(push.counts) for push in routed.counts) if routed is not None else 0
        core.forget(req, now)
        now += 0.001
    latencies.sort()
    cpu.sort()
    total = sum(latencies)

    def p99(values: list[float]) -> float:
        return 1e3 * values[min(len(values) - 1, int(0.99 * len(values)))]

    return {
        "prefill_nodes": args.prefill_nodes, "directory_pages": core.directory.page_count, "decisions": len(latencies),
        "decisions_per_s": len(latencies) / total, "latency_p50_ms": 1e3 * latencies[len(latencies) // 2],
        "latency_p99_ms": p99(latencies),
        "decisions_per_cpu_s": len(cpu) / sum(cpu), "latency_cpu_p50_ms": 1e3 * cpu[len(cpu) // 2],
        "latency_cpu_p99_ms": p99(cpu),
        "mean_queue": statistics.fmean(len(t.sent) for t in core.nodes.values() if t.phase is Phase.PREFILL),
        "queue_max": args.queue_max, "reports_per_decision": args.reports,
        "queue_replays_per_decision": ((backlogs.replays - replays) / len(latencies)) if backlogs is not None else None,
        "count_updates_per_decision": pushed / len(latencies),
        "branch_counts": "pages" if core.branches.stats.page_exact else "runs", "branch_runs": core.branches.runs,
    }  # fmt: skip


async def bench_http(count: int) -> dict[str, Any]:
    backend = FakeBackend()
    prompt = list(range(1, 2001))
    server = await start_server(RouterHttpSettings(host="127.0.0.1", port=0), backend)
    body = json.dumps({"prompt": prompt, "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True}})
    http: list[float] = []
    direct: list[float] = []
    try:
        async with aiohttp.ClientSession() as session:
            for i in range(count + 20):
                started = time.perf_counter()
                async with session.post(f"{server.url}/v1/completions", data=body,
                                        headers={"content-type": "application/json", "x-evolving-branch-id": f"h{i}"}) as r:  # fmt: skip
                    if r.status != 200:
                        raise CliError(f"HTTP front end answered {r.status}: {(await r.read())[:300]!r}", 1)
                    async for _ in r.content:
                        pass
                if i >= 20:
                    http.append(time.perf_counter() - started)
        for i in range(count + 20):
            request = CompletionRequest(
                RequestId(f"d{i}"), "evolving-emulated", tuple(prompt), BranchRef(BranchId(f"d{i}")), max_tokens=16
            )
            started = time.perf_counter()
            async for _ in backend.complete(request):
                pass
            if i >= 20:
                direct.append(time.perf_counter() - started)
    finally:
        await server.stop()
    http.sort()
    return {
        "requests": count, "prompt_tokens": len(prompt), "output_tokens": 16,
        "http_mean_ms": 1e3 * statistics.fmean(http), "http_p50_ms": 1e3 * http[len(http) // 2],
        "http_p99_ms": 1e3 * http[min(len(http) - 1, int(0.99 * len(http)))],
        "direct_mean_ms": 1e3 * statistics.fmean(direct),
        "overhead_mean_ms": 1e3 * (statistics.fmean(http) - statistics.fmean(direct)),
    }  # fmt: skip


def _router(args: argparse.Namespace) -> int:
    for name in ("prefill_nodes", "prefixes", "branches", "decisions", "http_requests"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be >= 1", USAGE_ERROR)
    console = Console(stderr=True)
    if not args.json:
        console.print(f"building the directory and queues ({args.prefill_nodes} prefill nodes, {args.branches} branches)...")
    figures = {"routing": bench_decisions(args), "http": asyncio.run(bench_http(args.http_requests)),
               "machine": machine_reference()}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    t = Table(title="router benchmark")
    t.add_column("figure")
    t.add_column("value", justify="right")
    r, h = figures["routing"], figures["http"]
    t.add_row("routing decisions / s (ttft policy)", f"{r['decisions_per_s']:.0f}")
    t.add_row(f"decision latency p50 / p99 ({r['prefill_nodes']} prefill nodes)", f"{r['latency_p50_ms']:.2f} / {r['latency_p99_ms']:.2f} ms")
    t.add_row("same, thread CPU time", f"{r['latency_cpu_p50_ms']:.2f} / {r['latency_cpu_p99_ms']:.2f} ms")
    t.add_row("directory pages / mean queue per node", f"{r['directory_pages']} / {r['mean_queue']:.1f}")
    t.add_row(f"branch counts ({r['branch_counts']}): pages pushed per decision / runs",
              f"{r['count_updates_per_decision']:.0f} / {r['branch_runs']}")
    t.add_row("HTTP streaming request, mean (p99)", f"{h['http_mean_ms']:.2f} ({h['http_p99_ms']:.2f}) ms")
    t.add_row("backend called directly, mean", f"{h['direct_mean_ms']:.3f} ms")
    t.add_row("HTTP overhead per request", f"{h['overhead_mean_ms']:.2f} ms")
    t.add_row("machine reference (bench machine), M per CPU s", f"{figures['machine']['reference_mops_per_cpu_s']:.2f}")
    Console().print(t)
    return 0


def _switch(args: argparse.Namespace) -> int:
    from evolving_infra.local.processes import StartError
    from evolving_infra.local.switch_bench import run_switch_bench

    if args.idle < 0 or args.loaded < 0 or args.idle + args.loaded == 0:
        raise CliError("--idle and --loaded must be >= 0 and not both 0", USAGE_ERROR)
    try:
        result = run_switch_bench(args.idle, args.loaded)
    except StartError as exc:
        raise CliError(f"the local cluster did not start: {exc}", 1) from exc
    figures: dict[str, Any] = {
        "idle": result.summary(False), "loaded": result.summary(True),
        "requests_done": result.requests_done, "requests_failed": result.requests_failed,
        "samples": [dict(s.__dict__, after_drain_s=s.after_drain_s) for s in result.samples],
    }  # fmt: skip
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    t = Table(title="phase switch on a local cluster (3 nodes, speed-up 1: node clock = wall clock)")
    for col in ("node state", "switches", "after drain mean", "after drain max", "drain mean", "total mean"):
        t.add_column(col, justify="right")
    for label, s in (("idle", figures["idle"]), ("under load", figures["loaded"])):
        t.add_row(label, str(s["switches"]), *(f"{s[k]:.4f} s" if s[k] is not None else "-"
                                               for k in ("after_drain_mean_s", "after_drain_max_s", "drain_mean_s", "total_mean_s")))  # fmt: skip
    Console().print(t)
    Console().print(f"agent requests during the loaded switches: {result.requests_done} done, {result.requests_failed} failed")
    return 0
