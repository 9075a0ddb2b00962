"""Prometheus metrics of a node agent (own registry) and the `/metrics` HTTP endpoint.

Series (all `evolving_node_*`; labels are small enums, never request or branch ids):
- `iteration_duration_seconds{phase}` histogram, node clock; `iterations_total{phase}`;
- `queued_requests{phase}`, `running_requests{phase}`, `prefill_waiting_requests` gauges;
- `kv_pages{tier,state}` (state: free, cached, pinned, in_use) and `kv_capacity_pages{tier}` gauges;
  `arena_slots{state}` (free, reserved, ready) of the host arena holding the bytes;
- `kv_transfer_bytes_total{transport}`, `kv_transfer_pages_total{transport}`,
  `kv_transfer_seconds{transport}` (wall clock, real I/O), `kv_transfer_failures_total{transport,error}`,
  `kv_fetch_fallback_pages_total`, `kv_served_bytes_total` (pages streamed to peers by ReadPages);
- `phase_switches_total{source,target}`, `phase_switch_duration_seconds` and
  `phase_switch_drain_seconds` histograms (node clock), `phase_switch_handed_back_total`;
- `mode{mode}` (1 for the current mode), `switch_state{state}`, `switch_generation`;
- `requests_total{phase,outcome}` (accepted, rejected, finished, handed_back, failed, cancelled),
  `decode_tokens_total`, `event_subscribers`, `event_subscribers_dropped_total`.

The node clock is emulated time (wall clock times `speed_up`); with `speed_up` 1 it is wall seconds.

Boundary: metric definitions and exposition; callers decide when to record.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from evolving_infra.core.itermodel import IterationRecord
from evolving_infra.core.types import NodeMode
from evolving_infra.node_agent.engine import EngineGauges, SwitchReport, SwitchState
from evolving_infra.node_agent.engine.tier import TierGauges
from evolving_infra.node_agent.transfer.arena import ArenaGauges
from evolving_infra.node_agent.transfer.base import TransportKind

PREFIX = "evolving_node_"
_ITERATION_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
_TRANSFER_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
_SWITCH_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class NodeMetrics:
    """The node agent's series in their own registry (see the module docstring)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = PREFIX
        self.iteration_seconds = Histogram(
            p + "iteration_duration_seconds", "Engine iteration durations (node clock).", ["phase"],
            buckets=_ITERATION_BUCKETS, registry=r,
        )
        self.iterations = Counter(p + "iterations", "Engine iterations run.", ["phase"], registry=r)
        self.queued = Gauge(p + "queued_requests", "Requests queued (not running) by phase.", ["phase"], registry=r)
        self.running = Gauge(p + "running_requests", "Requests running by phase.", ["phase"], registry=r)
        self.waiting = Gauge(
            p + "prefill_waiting_requests", "Queued prefills not yet runnable (room, fetch or load).", registry=r
        )
        self.pages = Gauge(p + "kv_pages", "KV pages per tier and state.", ["tier", "state"], registry=r)
        self.capacity = Gauge(p + "kv_capacity_pages", "KV page capacity per tier.", ["tier"], registry=r)
        self.arena = Gauge(p + "arena_slots", "Host arena slots by state.", ["state"], registry=r)
        self.transfer_bytes = Counter(
            p + "kv_transfer_bytes", "KV bytes pulled from peers.", ["transport"], registry=r
        )
        self.transfer_pages = Counter(
            p + "kv_transfer_pages", "KV pages pulled from peers.", ["transport"], registry=r
        )
        self.transfer_seconds = Histogram(
            p + "kv_transfer_seconds", "Wall seconds per transport read.", ["transport"],
            buckets=_TRANSFER_BUCKETS, registry=r,
        )
        self.transfer_failures = Counter(
            p + "kv_transfer_failures", "Failed transport reads.", ["transport", "error"], registry=r
        )
        self.fallback_pages = Counter(
            p + "kv_fetch_fallback_pages", "Pages of failed fetches, recomputed by the prefill instead.", registry=r
        )
        self.served_bytes = Counter(p + "kv_served_bytes", "KV bytes streamed to peers (ReadPages).", registry=r)
        self.switches = Counter(p + "phase_switches", "Completed phase switches.", ["source", "target"], registry=r)
        self.switch_seconds = Histogram(
            p + "phase_switch_duration_seconds", "Phase switch durations (node clock).", buckets=_SWITCH_BUCKETS,
            registry=r,
        )
        self.drain_seconds = Histogram(
            p + "phase_switch_drain_seconds", "Drain time of phase switches (node clock).", buckets=_SWITCH_BUCKETS,
            registry=r,
        )
        self.handed_back = Counter(
            p + "phase_switch_handed_back", "Queued requests handed back by phase switches.", registry=r
        )
        self.mode = Gauge(p + "mode", "1 for the mode the node serves.", ["mode"], registry=r)
        self.switch_state = Gauge(p + "switch_state", "1 for the node's switch state.", ["state"], registry=r)
        self.generation = Gauge(p + "switch_generation", "Switch generation the node is at.", registry=r)
        self.requests = Counter(p + "requests", "Requests by phase and outcome.", ["phase", "outcome"], registry=r)
        self.tokens = Counter(p + "decode_tokens", "Tokens generated by decode.", registry=r)
        self.subscribers = Gauge(p + "event_subscribers", "StreamEvents subscribers.", registry=r)
        self.dropped = Counter(
            p + "event_subscribers_dropped", "StreamEvents subscribers dropped for falling behind.", registry=r
        )
        self.denied = Counter(p + "unauthenticated_calls", "gRPC calls refused for missing or wrong credentials.", registry=r)
        self.invalid = Counter(
            p + "invalid_requests", "gRPC requests refused by validation (INVALID_ARGUMENT).", ["method"], registry=r
        )

    # --- recording -----------------------------------------------------------------------------------
    def iteration(self, record: IterationRecord) -> None:
        self.iteration_seconds.labels(record.phase.value).observe(record.duration)
        self.iterations.labels(record.phase.value).inc()

    def engine_gauges(self, g: EngineGauges) -> None:
        self.queued.labels("prefill").set(g.prefill_queued)
        self.queued.labels("decode").set(g.decode_queued)
        self.running.labels("prefill").set(g.prefill_running)
        self.running.labels("decode").set(g.decode_running)
        self.waiting.set(g.prefill_waiting)
        self._tier("gpu", g.pool.l1)
        self._tier("host", g.pool.l2)
        self.state(g.mode, g.switch_state)

    def _tier(self, tier: str, t: TierGauges) -> None:
        self.capacity.labels(tier).set(t.capacity)
        for state, value in (("free", t.free), ("cached", t.cached), ("pinned", t.pinned), ("in_use", t.in_use)):
            self.pages.labels(tier, state).set(value)

    def arena_gauges(self, a: ArenaGauges) -> None:
        for state, value in (("free", a.free), ("reserved", a.reserved), ("ready", a.ready)):
            self.arena.labels(state).set(value)

    def state(self, mode: NodeMode | None, switch: SwitchState | None, generation: int | None = None) -> None:
        """The node's mode and switch state (None, None while it relaunches: it serves nothing)."""
        for m in NodeMode:
            self.mode.labels(m.value).set(1 if m is mode else 0)
        for s in SwitchState:
            self.switch_state.labels(s.value).set(1 if s is switch else 0)
        if generation is not None:
            self.generation.set(generation)

    def transferred(self, kind: TransportKind, nbytes: int, seconds: float, pages: int) -> None:
        self.transfer_bytes.labels(kind.value).inc(nbytes)
        self.transfer_pages.labels(kind.value).inc(pages)
        if pages:
            self.transfer_seconds.labels(kind.value).observe(seconds)

    def transfer_failed(self, kind: TransportKind, error: str) -> None:
        self.transfer_failures.labels(kind.value, error).inc()

    def fetch_fallback(self, pages: int) -> None:
        self.fallback_pages.inc(pages)

    def switched(self, report: SwitchReport, switch_seconds: float) -> None:
        self.switches.labels(report.source.value, report.target.value).inc()
        self.drain_seconds.observe(report.drain)
        self.switch_seconds.observe(switch_seconds)
        self.handed_back.inc(report.handed_back)

    def request(self, phase: str, outcome: str, n: int = 1) -> None:
        self.requests.labels(phase, outcome).inc(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """`GET /metrics` on host:port (aiohttp, on the running event loop)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics
        self._runner: web.AppRunner | None = None
        self.address = ""

    async def start(self, host: str, port: int) -> str:
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]  # aiohttp keeps an asyncio.Server here
        bound = sockets[0].getsockname()[1] if sockets else port
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.address = f"{shown}:{bound}"
        return self.address

    async def _serve(self, request: web.Request) -> web.Response:
        body = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
