"""The live router's Prometheus metrics (its own registry), and a small server for them.

| series | type | labels | meaning |
| --- | --- | --- | --- |
| `evolving_router_split_nodes` | gauge | phase | nodes serving prefill / decode / both (collocated warmup) |
| `evolving_router_phase_switches_total` | counter | to_phase, outcome | switches applied (completed / failed) |
| `evolving_router_phase_switch_duration_seconds` | histogram | | decision to serving the new phase |
| `evolving_router_queued_requests` | gauge | node, phase | requests queued at the node (its last report) |
| `evolving_router_inflight_requests` | gauge | node, phase | requests the router has sent there and not seen finish |
| `evolving_router_kv_cached_tokens_total` | counter | | prompt tokens routed to reuse cached KV |
| `evolving_router_kv_prompt_tokens_total` | counter | | prompt tokens routed (hit rate = cached / prompt) |
| `evolving_router_kv_lost_reuse_tokens_total` | counter | | tokens cached somewhere but recomputed (lost reuse estimate) |
| `evolving_router_kv_fetch_pages_total` | counter | | prefix pages planned to be fetched from peers |
| `evolving_router_directory_pages` | gauge | | pages in the KV directory |
| `evolving_router_directory_nodes` | gauge | | nodes in the KV directory |
| `evolving_router_routing_decision_seconds` | histogram | | time to route one request (views + policy) |
| `evolving_router_routing_state_total` | counter | source | routing decisions by the state they read for the chosen node: `reported` (its fresh report), `router-record` (report missing or stale), `unknown` (the policy does not say) |
| `evolving_router_retries_total` | counter | reason | attempts re-routed before a first token |
| `evolving_router_prefill_cancels_total` | counter | outcome | abandoned attempts' prefills the router cancelled on their node: `cancelled` (the node dropped it), `not_held` (already finished or handed back), `failed` (no answer) |
| `evolving_router_node_up` | gauge | node | 1 while the node's event stream is open |
| `evolving_router_branches` | gauge | | active branches in the branch table |
| `evolving_router_branches_restored` | gauge | | branches this router restored from its branch snapshot at start |
| `evolving_router_planner_decisions_total` | counter | outcome | planner decisions |

Node ids are bounded labels (the cluster's nodes); request and branch ids never are labels.

Boundary: metric objects and exposition; the backend updates them.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from evolving_infra.router.routing import RoutingDecision, StateSource

_FAST = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_SLOW = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class RouterServiceMetrics:
    """The series in the module docstring, on `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.split = Gauge("evolving_router_split_nodes", "Nodes serving each phase.", ["phase"], registry=r)
        self.switches = Counter(
            "evolving_router_phase_switches_total", "Phase switches applied.", ["to_phase", "outcome"], registry=r
        )
        self.switch_seconds = Histogram(
            "evolving_router_phase_switch_duration_seconds", "Switch decision to serving the new phase.", buckets=_SLOW,
            registry=r,
        )
        self.queued = Gauge("evolving_router_queued_requests", "Requests queued at a node.", ["node", "phase"], registry=r)
        self.inflight = Gauge(
            "evolving_router_inflight_requests", "Requests sent to a node and not finished.", ["node", "phase"], registry=r
        )
        self.cached_tokens = Counter("evolving_router_kv_cached_tokens_total", "Prompt tokens reusing KV.", registry=r)
        self.prompt_tokens = Counter("evolving_router_kv_prompt_tokens_total", "Prompt tokens routed.", registry=r)
        self.lost_reuse = Counter(
            "evolving_router_kv_lost_reuse_tokens_total", "Tokens cached in the cluster but recomputed.", registry=r
        )
        self.fetch_pages = Counter("evolving_router_kv_fetch_pages_total", "Prefix pages planned for fetching.", registry=r)
        self.directory_pages = Gauge("evolving_router_directory_pages", "Pages in the KV directory.", registry=r)
        self.directory_nodes = Gauge("evolving_router_directory_nodes", "Nodes in the KV directory.", registry=r)
        self.routing_seconds = Histogram(
            "evolving_router_routing_decision_seconds", "Time to route one request.", buckets=_FAST, registry=r
        )
        self.routing_state = Counter(
            "evolving_router_routing_state_total", "Routing decisions by the state source read for the chosen node.",
            ["source"], registry=r,
        )
        self.retries = Counter("evolving_router_retries_total", "Attempts re-routed before a first token.", ["reason"], registry=r)
        self.branches = Gauge("evolving_router_branches", "Active branches in the branch table.", registry=r)
        self.branches_restored = Gauge(
            "evolving_router_branches_restored", "Branches restored from the branch snapshot at start.", registry=r
        )
        self.prefill_cancels = Counter(
            "evolving_router_prefill_cancels_total", "Abandoned prefills cancelled on their node.", ["outcome"], registry=r
        )
        self.node_up = Gauge("evolving_router_node_up", "1 while the node's event stream is open.", ["node"], registry=r)
        self.decisions = Counter("evolving_router_planner_decisions_total", "Planner decisions.", ["outcome"], registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def routed(self, decision: RoutingDecision) -> str:
        """Count the state source `decision` read for its chosen node (its `state_reported` diagnostic term);
        returns the label counted."""
        source = STATE_UNKNOWN
        for score in decision.diagnostics:
            if score.node == decision.node and "state_reported" in score.terms:
                reported = score.terms["state_reported"] > 0
                source = (StateSource.REPORTED if reported else StateSource.ROUTER_RECORD).value
                break
        self.routing_state.labels(source=source).inc()
        return source


STATE_UNKNOWN = "unknown"
"""The `source` label of a decision whose policy does not say which state it read."""


class MetricsServer:
    """Serves `GET /metrics` of one registry on its own port."""

    def __init__(self, metrics: RouterServiceMetrics) -> None:
        self.metrics = metrics
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> str:
        app = web.Application()

        async def handle(_: web.Request) -> web.Response:
            response = web.Response(body=self.metrics.exposition())
            response.headers["Content-Type"] = CONTENT_TYPE_LATEST
            return response

        app.router.add_get("/metrics", handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = self._runner.addresses[0][1] if self._runner.addresses else port
        return f"http://{host}:{bound}/metrics"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
