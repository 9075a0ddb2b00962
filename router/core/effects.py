"""The typed effects `RouterCore` returns for its driver to carry out, and the results it hands back.

| effect | the driver (live service / simulator) |
| --- | --- |
| `SendPrefill(node, request, fetch)` | SubmitPrefill to the node with the fetch plan / `engine.submit_prefill` |
| `PushCounts(node, counts)` | a PushCounts message / `engine.set_counts` |
| `SwitchNode(node, phase, mode)` | SwitchPhase (or the operator via the CR) / `begin_switch` or a relaunch |

`Routed` is the outcome of routing one request (its decision, the chosen node's view, the fetch plan);
`SplitChange` is a planner decision turned into the nodes that move.

Boundary: plain immutable values; no behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.planner import PlannerDecision, SwitchMode
from evolving_infra.router.routing import PrefillNodeView, RoutingDecision


@dataclass(frozen=True, slots=True)
class SendPrefill:
    """Send `request`'s prefill to `node`, pulling `fetch` from peers while it waits."""

    node: NodeId
    request: str
    fetch: tuple[FetchRun, ...] = ()


@dataclass(frozen=True, slots=True)
class PushCounts:
    """Branch counts of pages on `node` that changed (0 = released)."""

    node: NodeId
    counts: Mapping[PageHash, int]


@dataclass(frozen=True, slots=True)
class SwitchNode:
    """Move `node` to `phase`, the way `mode` says."""

    node: NodeId
    phase: Phase
    mode: SwitchMode


Effect = SendPrefill | PushCounts | SwitchNode


@dataclass(frozen=True, slots=True)
class Routed:
    """Where a request's prefill goes: the policy's decision, the chosen node's view and the fetch plan."""

    node: NodeId
    decision: RoutingDecision
    view: PrefillNodeView
    fetch: tuple[FetchRun, ...] = ()
    counts: tuple[PushCounts, ...] = ()
    """Count changes of the branch's placement on the node."""


@dataclass(frozen=True, slots=True)
class SplitChange:
    """A planner decision as node moves: `switches` in node order, the full `target`, and the decision."""

    decision: PlannerDecision
    target: Mapping[NodeId, Phase]
    switches: tuple[SwitchNode, ...] = ()
    relaunch_s: float = 0.0

    @property
    def split(self) -> tuple[int, int]:
        """(prefill, decode) node counts of the target."""
        p = sum(1 for phase in self.target.values() if phase is Phase.PREFILL)
        return p, len(self.target) - p
