"""The router's own count of in-flight requests per node, as the baseline gateways keep it.

Invariant: `load(n)` equals the number of requests added on `n` and not yet removed; a request is on at
most one node (adding it again moves it).

Boundary: pure bookkeeping fed by a policy's `on_routed` / `on_finished` hooks.
"""

from __future__ import annotations

from collections.abc import Iterable

from evolving_infra.core.types import NodeId, RequestId


class InFlightCounter:
    def __init__(self) -> None:
        self._node_of: dict[RequestId, NodeId] = {}
        self._count: dict[NodeId, int] = {}

    def add(self, request: RequestId, node: NodeId) -> None:
        self.remove(request)
        self._node_of[request] = node
        self._count[node] = self._count.get(node, 0) + 1

    def remove(self, request: RequestId) -> NodeId | None:
        """Forget `request`; returns the node it was on, or None if it was unknown."""
        node = self._node_of.pop(request, None)
        if node is not None:
            left = self._count[node] - 1
            if left:
                self._count[node] = left
            else:
                del self._count[node]
        return node

    def load(self, node: NodeId) -> int:
        return self._count.get(node, 0)

    def node_of(self, request: RequestId) -> NodeId | None:
        return self._node_of.get(request)

    def least_loaded(self, nodes: Iterable[NodeId]) -> NodeId:
        """The node with the fewest in-flight requests; ties to the smallest node id."""
        return min(nodes, key=lambda n: (self.load(n), n))
