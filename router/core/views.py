"""What the routing policies and the planner read, built from the router's tracks of the nodes.

- `prefill_view`: the KV directory's prefix match for one node (own GPU and host prefix, reachable cluster
  prefix, fetch plan), the node's last report (running batch, queue, its age), the requests sent since that
  report (`unreported`), everything sent and not yet prefilled (`router_in_flight`), the node's model and
  its cached pages. With private host memory only the node's own KV counts (nothing is fetched).
- `decode_view`: running plus bound requests, and the KV room left after reservations.
- `node_load`: the momentary signals of the queue-driven planners (zero for a node serving nothing).

Boundary: pure reads of `NodeTrack`s; nothing here changes them.
"""

from __future__ import annotations

from evolving_infra.router.planner import NodeLoad
from evolving_infra.router.prefix_match import PrefixMatch
from evolving_infra.router.routing import DecodeNodeView, PageRun, PrefillNodeView, PrefillNodeModel
from evolving_infra.router.routing.decode import kv_tokens_needed
from evolving_infra.router.core.tracking import NodeTrack, RoutedRequest


def prefill_view(
    node: NodeTrack, match: PrefixMatch, now: float, *, shared_pool: bool, model: PrefillNodeModel | None
) -> PrefillNodeView:
    gpu = match.gpu.get(node.id, 0)
    either = match.either.get(node.id, 0)
    plan = match.fetch_plan(node.id)
    cluster = max(plan.reachable, either)
    runs = tuple(PageRun(r.start, r.pages, r.peers) for r in plan.runs)
    fetch_pages = sum(r.pages for r in runs)
    if not shared_pool:  # private host memory: only the node's own KV is reusable
        runs, fetch_pages, cluster = (), 0, either
    unreported, in_flight = node.sent_views()
    pool = node.current_pool()
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
        router_in_flight=in_flight,
        state_age_s=None if node.report_time is None else max(0.0, now - node.report_time),
        model=model,
        cached_pages=0 if pool is None else pool.cached_pages,
    )


def kv_room_tokens(node: NodeTrack) -> int:
    """KV tokens a decode node can still take: free and evictable GPU pages, less what is reserved."""
    pool = node.current_pool()
    if pool is None:
        return 0
    return max(0, pool.room_tokens - node.reserved_tokens)


def decode_view(node: NodeTrack) -> DecodeNodeView:
    return DecodeNodeView(
        node=node.id,
        running_requests=len(node.decode_jobs) + len(node.bound),
        free_kv_tokens=kv_room_tokens(node),
    )


def decode_need(req: RoutedRequest) -> int:
    """Decode KV tokens the request needs (prompt + output)."""
    return kv_tokens_needed(req.route)


def node_load(node: NodeTrack, *, context_length: int, kv_capacity_tokens: int) -> NodeLoad:
    """The momentary signals Dynamo's and Arrow's planners read (zero for a node that is not serving)."""
    if not node.serving:
        return NodeLoad(context_length=context_length, kv_capacity_tokens=kv_capacity_tokens)
    queued = [r for r in node.sent.values() if not r.prefill_started]
    queued_tokens = sum(r.route.prompt_tokens - r.routed_cached for r in queued)
    inputs = tuple(r.route.prompt_tokens for r in node.sent.values())
    decode = list(node.decode_jobs.values()) + list(node.bound.values()) + list(node.prealloc)
    kv = sum(decode_need(r) for r in decode)
    return NodeLoad(
        queued_prefill_tokens=queued_tokens,
        context_length=context_length,
        decode_kv_tokens=kv,
        kv_capacity_tokens=kv_capacity_tokens,
        queued_prefill_inputs=inputs,
        decode_requests=len(decode),
    )
