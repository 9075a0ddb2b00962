"""What the simulator reads off its engines for the router core: each prefill node's report of its running
batch and queue, and the pause rule's capacities.

Reports: a prefill node reports its running batch and queue at every iteration launch (paper E.3); the router
core adds the requests it sent since and its own record of every request sent and not yet prefilled
(`evolving_infra.router.core.views`).

`engine_report` builds a node's report from the engine's public `prefill_queue()`, as the live node agent does.

Boundary: pure reads of driver and engine state; nothing here changes the cluster except the node's report.
"""

from __future__ import annotations

from evolving_infra.core.types import NodeId, Phase, RequestId
from evolving_infra.node_agent.engine import EngineCore
from evolving_infra.router.core import decode_need, decode_view, kv_room_tokens
from evolving_infra.router.routing import RunningPrefill
from evolving_infra.sim.state import ClusterState, SimNode

__all__ = ["capacity_tokens", "decode_need", "decode_view", "engine_of", "engine_report", "kv_room_tokens"]


def engine_report(node: SimNode, now: float) -> None:
    """Record the node's running prefills and queue as it reports them at an iteration launch."""
    engine = node.engine
    if engine is None:
        return
    queue = engine.prefill_queue()
    running = (
        tuple(RunningPrefill(RequestId(r.request), r.remaining_tokens, r.context_tokens) for r in queue.running)
        if queue.running
        else ()  # (a decode node's every iteration)
    )
    node.record_report(now, running, queue.queued)


def capacity_tokens(state: ClusterState) -> dict[NodeId, int]:
    """KV capacity per prefill node for the pause rule: GPU plus host memory (paper D.5)."""
    cap = state.profile.l1_tokens + state.profile.l2_tokens
    return {n.id: cap for n in state.nodes.values() if n.accepts(Phase.PREFILL)}


def engine_of(node: SimNode) -> EngineCore:
    assert node.engine is not None, f"node {node.id} is relaunching"
    return node.engine
