"""What the router and planner read, built from the simulated nodes: prefill and decode node views, each
node's report of its prefill queue, and the load signals of the queue-driven planners.

Reports: a prefill node reports its running batch and queue at every iteration launch (paper E.3); the
router adds the requests it sent since (`unreported`) and keeps its own record of every request sent and not
yet prefilled (`router_in_flight`), used when the report is older than the policy's limit.

The engine core has no public accessor for its prefill queue, so `engine_report` reads it in one place (the
live node agent will need the same accessor; see the report of this module's author).

Boundary: pure reads of driver and engine state; nothing here changes the cluster.
"""

from __future__ import annotations

from evolving_infra.core.types import NodeId, Phase
from evolving_infra.node_agent.engine import EngineCore
from evolving_infra.router.planner import NodeLoad
from evolving_infra.router.prefix_match import PrefixMatch
from evolving_infra.router.routing import (
    DecodeNodeView,
    PageRun,
    PrefillNodeView,
    QueuedPrefill,
    RunningPrefill,
)
from evolving_infra.router.routing.decode import kv_tokens_needed
from evolving_infra.sim.state import ClusterState, SimNode, SimRequest


def engine_report(node: SimNode, now: float) -> None:
    """Snapshot the node's running prefills and queue as it would report them at an iteration launch."""
    engine = node.engine
    if engine is None:
        return
    running: list[RunningPrefill] = []
    queue: list[QueuedPrefill] = []
    pt = engine.profile.page_tokens
    for rid, job in engine._prefill.jobs.items():  # noqa: SLF001 - see the module docstring
        if job.stage.value == "running":
            context = job.prefix_pages * pt + job.done
            running.append(RunningPrefill(rid, max(0, job.req.prompt_tokens - context), context))  # type: ignore[arg-type]
        else:
            req = node.sent.get(rid)
            if req is not None:
                queue.append(req.queued_view())
    node.report_time = now
    node.report_running = tuple(running)
    node.report_queue = tuple(queue)
    node.report_ids = frozenset(node.sent)


def prefill_view(
    state: ClusterState, node: SimNode, req: SimRequest, match: PrefixMatch, now: float
) -> PrefillNodeView:
    gpu = match.gpu.get(node.id, 0)
    either = match.either.get(node.id, 0)
    plan = match.fetch_plan(node.id)
    cluster = max(plan.reachable, either)
    runs = tuple(PageRun(r.start, r.pages, r.peers) for r in plan.runs)
    fetch_pages = sum(r.pages for r in runs)
    if not state.cfg.shared_pool:  # private host memory: only the node's own KV is reusable
        runs, fetch_pages, cluster = (), 0, either
    unreported = tuple(r.queued_view() for rid, r in node.sent.items() if rid not in node.report_ids)
    engine = node.engine
    cached_pages = 0
    if engine is not None:
        g = engine.pool.gauges()
        cached_pages = g.l1.cached + g.l1.pinned + g.l2.cached + g.l2.pinned
    return PrefillNodeView(
        node=node.id,
        own_gpu_pages=gpu,
        own_host_pages=max(0, either - gpu),
        cluster_prefix_pages=cluster,
        fetch_pages=fetch_pages,
        fetch_sources=runs,
        running=node.report_running,
        queue=node.report_queue,
        unreported=unreported,
        router_in_flight=tuple(r.queued_view() for r in node.sent.values()),
        state_age_s=None if node.report_time is None else max(0.0, now - node.report_time),
        model=state.router_models.get(node.id),
        cached_pages=cached_pages,
    )


def kv_room_tokens(node: SimNode) -> int:
    """KV tokens a decode node can still take: free and evictable GPU pages, less what is reserved."""
    if node.engine is None:
        return 0
    g = node.engine.pool.gauges().l1
    return max(0, (g.free + g.cached) * node.engine.profile.page_tokens - node.reserved_tokens)


def decode_view(node: SimNode) -> DecodeNodeView:
    return DecodeNodeView(
        node=node.id,
        running_requests=len(node.decode_jobs) + len(node.bound),
        free_kv_tokens=kv_room_tokens(node),
    )


def decode_need(req: SimRequest) -> int:
    return kv_tokens_needed(req.route)


def node_load(state: ClusterState, node: SimNode) -> NodeLoad:
    """The momentary signals Dynamo's and Arrow's planners read (zero for a node that is not serving)."""
    capacity = state.profile.l1_tokens
    context = state.cfg.context_length_tokens
    if node.engine is None:
        return NodeLoad(context_length=context, kv_capacity_tokens=capacity)
    queued = [r for rid, r in node.sent.items() if r.prefill_start is None]
    queued_tokens = sum(r.route.prompt_tokens - r.routed_cached for r in queued)
    inputs = tuple(r.route.prompt_tokens for r in node.sent.values())
    decode = list(node.decode_jobs.values()) + list(node.bound.values()) + list(node.prealloc)
    kv = sum(decode_need(r) for r in decode)
    return NodeLoad(
        queued_prefill_tokens=queued_tokens,
        context_length=context,
        decode_kv_tokens=kv,
        kv_capacity_tokens=capacity,
        queued_prefill_inputs=inputs,
        decode_requests=len(decode),
    )


def move_cost(node: SimNode) -> float:
    """Requests the node would have to finish (or lose) if it moved now."""
    return float(len(node.sent) + len(node.decode_jobs))


def serving_phase(node: SimNode) -> Phase:
    """The phase a node counts in for the planner: its switch target while switching."""
    if node.target is not None:
        return Phase(node.target.value)
    assert node.phase is not None
    return node.phase


def capacity_tokens(state: ClusterState) -> dict[NodeId, int]:
    """KV capacity per prefill node for the pause rule: GPU plus host memory (paper D.5)."""
    cap = state.profile.l1_tokens + state.profile.l2_tokens
    return {n.id: cap for n in state.nodes.values() if n.accepts(Phase.PREFILL)}


def engine_of(node: SimNode) -> EngineCore:
    assert node.engine is not None, f"node {node.id} is relaunching"
    return node.engine
