"""Baseline: round-robin prefill routing.

Rule: nodes in node-id order, each request to the node after the one that got the previous request
(wrapping around); when the set of prefill nodes changes, the cycle continues from the first node whose id
follows the last one chosen. It moves no KV: the node recomputes what it lacks.

Boundary: pure policy state (the last node chosen) changed only by `on_routed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from evolving_infra.core.types import NodeId
from evolving_infra.router.routing.base import (
    PrefillPolicyName,
    RouteReason,
    RouterHooks,
    RoutingDecision,
    by_node,
    decision_without_fetch,
)
from evolving_infra.router.routing.inputs import PrefillNodeView, RouteRequest, unique_nodes


def next_in_cycle(nodes: Iterable[NodeId], last: NodeId | None) -> NodeId:
    """The first node id after `last` in sorted order, wrapping to the smallest."""
    ordered = sorted(nodes)
    if last is None:
        return ordered[0]
    for node in ordered:
        if node > last:
            return node
    return ordered[0]


class RoundRobinRouter(RouterHooks):
    def __init__(self) -> None:
        self._last: NodeId | None = None

    @property
    def name(self) -> PrefillPolicyName:
        return PrefillPolicyName.ROUND_ROBIN

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        unique_nodes(nodes, "prefill")
        node = next_in_cycle((v.node for v in nodes), self._last)
        return decision_without_fetch(request, by_node(nodes, node), self.name, RouteReason.ROUND_ROBIN)

    def on_routed(self, request: RouteRequest, decision: RoutingDecision, now: float) -> None:
        self._last = decision.node
