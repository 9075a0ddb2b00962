"""Arrow's prefill routing as the paper describes it: the scheduler ignores where KV is cached and sends each
request to the least-loaded prefill node (baselines.md, "Arrow-style planner"; paper 6.4).

Load of a node = prompt tokens it still has to work through: the remaining tokens of its running prefills plus
the full prompts of its queued and not-yet-reported requests (Arrow predicts from the full input length), or,
when the node's report is stale, the full prompts of every request sent and not yet prefilled. Ties go to the
smallest node id. It moves no KV: the node reuses its own prefix and recomputes the rest.

Boundary: pure; state is only in the views.
"""

from __future__ import annotations

from collections.abc import Sequence

from evolving_infra.router.routing.base import (
    NodeScore,
    PrefillPolicyName,
    RouteReason,
    RouterHooks,
    RoutingDecision,
    by_node,
    decision_without_fetch,
)
from evolving_infra.router.routing.inputs import PrefillNodeView, RouteRequest, unique_nodes

STATE_MAX_AGE_S = 5.0


def outstanding_tokens(view: PrefillNodeView, max_age_s: float = STATE_MAX_AGE_S) -> int:
    """Prompt tokens the node still has to prefill, as far as the router knows."""
    if view.state_age_s is not None and view.state_age_s <= max_age_s:
        running = sum(r.remaining_tokens for r in view.running)
        return running + sum(q.work.t_in for q in (*view.queue, *view.unreported))
    return sum(q.work.t_in for q in view.router_in_flight)


class LeastLoadedRouter(RouterHooks):
    """Least outstanding prompt tokens wins; no KV moves."""

    name = PrefillPolicyName.LEAST_LOADED

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        unique_nodes(nodes, "prefill")
        loads = {v.node: outstanding_tokens(v) for v in nodes}
        node = min(loads, key=lambda n: (loads[n], n))
        diagnostics = tuple(NodeScore(n, float(t), {"outstanding_tokens": float(t)}) for n, t in loads.items())
        return decision_without_fetch(request, by_node(nodes, node), self.name, RouteReason.LEAST_LOADED, diagnostics)
