"""Baseline: sticky sessions (the SGLang gateway's session-affinity variant).

Rule (shared/baselines.md): a branch always goes to the prefill node that served it before. Its first
request goes where its parent branch is pinned when it has one (`inherit_parent`, so an agent and its
forks stay together, as with a per-agent session key) and otherwise to the least-loaded node, load being
the router's own count of in-flight requests (ties to the smallest node id). If the pinned node is no
longer a prefill node, the branch is placed again as if new. It moves no KV: the node recomputes what it
lacks.

Boundary: pure policy state (pins, loads) changed only by the hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.core.types import BranchId, NodeId, RequestId
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
from evolving_infra.router.routing.loads import InFlightCounter


@dataclass(frozen=True, slots=True)
class StickySettings:
    inherit_parent: bool = True


class StickyRouter(RouterHooks):
    def __init__(self, settings: StickySettings | None = None) -> None:
        self.settings = settings if settings is not None else StickySettings()
        self.loads = InFlightCounter()
        self._pinned: dict[BranchId, NodeId] = {}

    @property
    def name(self) -> PrefillPolicyName:
        return PrefillPolicyName.STICKY

    def pinned(self, branch: BranchId) -> NodeId | None:
        return self._pinned.get(branch)

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        unique_nodes(nodes, "prefill")
        ids = {v.node for v in nodes}
        own = self._pinned.get(request.branch)
        parent = self._pinned.get(request.parent_branch) if request.parent_branch is not None else None
        node: NodeId
        if own is not None and own in ids:
            node, reason = own, RouteReason.STICKY
        elif self.settings.inherit_parent and parent is not None and parent in ids:
            node, reason = parent, RouteReason.STICKY_INHERITED
        else:
            node, reason = self.loads.least_loaded(ids), RouteReason.STICKY_FIRST_LEAST_LOADED
        diagnostics = tuple(NodeScore(n, float(self.loads.load(n)), {"load": float(self.loads.load(n))})
                            for n in sorted(ids))
        return decision_without_fetch(request, by_node(nodes, node), self.name, reason, diagnostics)

    def on_routed(self, request: RouteRequest, decision: RoutingDecision, now: float) -> None:
        self._pinned[request.branch] = decision.node
        self.loads.add(request.id, decision.node)

    def on_finished(self, request: RequestId, now: float) -> None:
        self.loads.remove(request)

    def on_branch_finished(self, branch: BranchId, now: float) -> None:
        self._pinned.pop(branch, None)
