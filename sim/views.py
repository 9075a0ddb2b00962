"""What the simulator reads off its engines for the router core: each prefill node's report of its running
batch and queue, and the pause rule's capacities.

Reports: a prefill node reports its running batch and queue at every iteration launch (paper E.3); the router
core adds the requests it sent since and its own record of every request sent and not yet prefilled
(`evolving_infra.router.core.views`).

The engine core has no public accessor for its prefill queue, so `engine_report` reads it in one place (the
live node agent will need the same accessor; see the report of this module's author).

Boundary: pure reads of driver and engine state; nothing here changes the cluster except the node's report.
"""

from __future__ import annotations

from evolving_infra.core.types import NodeId, Phase
from evolving_infra.node_agent.engine import EngineCore
from evolving_infra.router.core import decode_need, decode_view, kv_room_tokens
from evolving_infra.router.routing import RunningPrefill
from evolving_infra.sim.state import ClusterState, SimNode

__all__ = ["capacity_tokens", "decode_need", "decode_view", "engine_of", "engine_report", "kv_room_tokens"]


def engine_report(node: SimNode, now: float) -> None:
    """Snapshot the node's running prefills and queue as it would report them at an iteration launch."""
    engine = node.engine
    if engine is None:
        return
    jobs = engine._prefill.jobs  # noqa: SLF001 - see the module docstring
    if not jobs:
        node.record_report(now, (), ())
        return
    running: list[RunningPrefill] = []
    queued: list[str] = []
    pt = engine.profile.page_tokens
    for rid, job in jobs.items():
        if job.stage.value == "running":
            context = job.prefix_pages * pt + job.done
            running.append(RunningPrefill(rid, max(0, job.req.prompt_tokens - context), context))  # type: ignore[arg-type]
        else:
            queued.append(rid)
    node.record_report(now, tuple(running), tuple(queued))


def capacity_tokens(state: ClusterState) -> dict[NodeId, int]:
    """KV capacity per prefill node for the pause rule: GPU plus host memory (paper D.5)."""
    cap = state.profile.l1_tokens + state.profile.l2_tokens
    return {n.id: cap for n in state.nodes.values() if n.accepts(Phase.PREFILL)}


def engine_of(node: SimNode) -> EngineCore:
    assert node.engine is not None, f"node {node.id} is relaunching"
    return node.engine
