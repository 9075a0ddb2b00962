"""Partition claims: which nodes belong to which AgentServingCluster when several select by label.

Invariant: every node belongs to at most one cluster. Clusters claim in order of creation (timestamp,
then namespace and name, so ties are decided the same way on every run); a node that an earlier cluster's
selector already matched is reported on each later cluster that also matches it, never shared silently.
A cluster that ends up with fewer nodes than its `nodeCount` reports the shortfall; with more, it uses
the first `nodeCount` by name and reports the surplus.

Boundary: pure; the operator lists the clusters and the nodes and turns `PartitionClaim`s into
conditions and into the node agents' scheduling constraints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from evolving_infra.operator.meta import selector_matches
from evolving_infra.operator.spec import NodeSelector

ClusterKey = tuple[str, str]
"""(namespace, name) of a cluster."""


@dataclass(frozen=True, slots=True)
class ClusterSelection:
    """One cluster as claims need it."""

    namespace: str
    name: str
    created: datetime
    selector: NodeSelector
    node_count: int

    @property
    def key(self) -> ClusterKey:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class NodeLabels:
    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Conflict:
    """A node this cluster's selector matches that `holder` (created earlier) already claimed."""

    node: str
    holder: ClusterKey


@dataclass(frozen=True, slots=True)
class PartitionClaim:
    """The nodes one cluster owns, and what is wrong with its selection."""

    cluster: ClusterKey
    nodes: tuple[str, ...]
    conflicts: tuple[Conflict, ...] = ()
    surplus: tuple[str, ...] = ()
    shortfall: int = 0

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.surplus and self.shortfall == 0

    def problems(self) -> list[str]:
        """One message per problem, for a condition."""
        out = []
        if self.conflicts:
            by_holder: dict[ClusterKey, list[str]] = {}
            for conflict in self.conflicts:
                by_holder.setdefault(conflict.holder, []).append(conflict.node)
            for (namespace, name), nodes in sorted(by_holder.items()):
                out.append(
                    f"{len(nodes)} selected node(s) already belong to {namespace}/{name}, created earlier: "
                    f"{_some(nodes)}; make the node selectors disjoint"
                )
        if self.shortfall:
            out.append(f"{self.shortfall} node(s) short of nodeCount: only {len(self.nodes)} selected node(s) are free")
        if self.surplus:
            out.append(f"{len(self.surplus)} selected node(s) beyond nodeCount are left unused: {_some(self.surplus)}")
        return out


def _some(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def claim_nodes(clusters: Sequence[ClusterSelection], nodes: Sequence[NodeLabels]) -> dict[ClusterKey, PartitionClaim]:
    """Each cluster's claim, keyed by (namespace, name); see the module docstring for the rules."""
    holder: dict[str, ClusterKey] = {}
    claims: dict[ClusterKey, PartitionClaim] = {}
    ordered_nodes = sorted(nodes, key=lambda n: n.name)
    for cluster in sorted(clusters, key=lambda c: (c.created, c.namespace, c.name)):
        matched = [n.name for n in ordered_nodes if selector_matches(cluster.selector, n.labels)]
        free = [name for name in matched if name not in holder]
        conflicts = tuple(Conflict(name, holder[name]) for name in matched if name in holder)
        for name in free:
            holder[name] = cluster.key
        used = tuple(free[: cluster.node_count])
        claims[cluster.key] = PartitionClaim(
            cluster=cluster.key,
            nodes=used,
            conflicts=conflicts,
            surplus=tuple(free[cluster.node_count :]),
            shortfall=max(0, cluster.node_count - len(free)),
        )
    return claims
