"""`NodeReports`: a node's `StreamEvents` messages and its availability, applied to the live router's core.

- KV event batches go to the directory (host evictions to the branch counts; count changes are pushed);
- iteration reports go to the node's warmup fitter and usage counts;
- state snapshots set the node's mode, pool gauges and queue metrics; the first one of a node (or after it came
  back) registers its phase; a mode that reaches a switch's target completes the switch; a node draining for a
  switch the router did not start (the operator's) stops getting old-phase work;
- prefill starts and ends of the current attempt of a request (by wire id, from its prefill node) are recorded
  on its flight; a start lets its decode be bound, an end confirms the prefill in the core;
- hand-backs (streamed as a switch begins) interrupt the requests' attempts, which are routed again at once;
- switch reports complete the switch;
- a broken stream takes the node out of routing, drops its pages from the directory, releases its counts and
  interrupts the requests in flight on it; a new stream (starting with a KV snapshot) brings it back.

Collocated nodes are not routed to by the live router (their mode counts as serving nothing).

Boundary: translating reports into core calls; the core decides.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from evolving_infra.core.types import NodeId, NodeMode, Phase
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.service import flights
from evolving_infra.proto.convert import iteration_from_proto, kv_batch_from_proto, mode_from_proto
from evolving_infra.router.service.wire import pool_from

if TYPE_CHECKING:
    from evolving_infra.router.service.backend import LiveRouter

log = logging.getLogger(__name__)


class NodeReports:
    """Applies node reports to `router` (see the module docstring)."""

    def __init__(self, router: LiveRouter) -> None:
        self.router = router

    def on_event(self, node: NodeId, event: pb.NodeEvent) -> None:
        router = self.router
        kind = event.WhichOneof("body")
        if kind == "kv":
            router.push(router.core.absorb(kv_batch_from_proto(event.kv)))
        elif kind == "iteration":
            router.core.iteration(node, iteration_from_proto(event.iteration))
        elif kind == "state":
            self._state(node, event.state)
        elif kind == "prefill_started":
            flight = router.attempts.get(event.prefill_started.request_id)
            if flight is not None and flight.req.prefill_node == node:
                flights.started(flight, event.prefill_started, router.now())
        elif kind == "prefill_finished":
            self._prefill_finished(node, event.prefill_finished)
        elif kind == "handed_back":
            router.handed_back(node, list(event.handed_back.request_ids))
        elif kind == "switch_completed":
            mode = mode_from_proto(event.switch_completed.target, "SwitchCompleted.target")
            router.generations[node] = max(router.generations.get(node, 0), event.switch_completed.generation)
            if mode is not NodeMode.COLLOCATED and router.core.nodes[node].target is not None:
                router.switch_done(node, Phase(mode.value))
        router.refresh_gauges()

    def _prefill_finished(self, node: NodeId, report: pb.PrefillFinished) -> None:
        router = self.router
        flight = router.attempts.get(report.request_id)
        if flight is None or flight.req.prefill_node != node:
            return
        flights.finished(flight, report, router.now())
        req = flight.req
        if req.prefill_started and not req.prefill_done:
            router.push(router.core.prefill_finished(node, req.id, req, router.now()))

    def _state(self, node: NodeId, state: pb.NodeState) -> None:
        router = self.router
        track = router.core.nodes[node]
        mode = mode_from_proto(state.mode, "NodeState.mode")
        router.generations[node] = max(router.generations.get(node, 0), state.generation)
        router.progress_events[node] = state.prefill_events
        router.metrics.queued.labels(node=node, phase="prefill").set(state.prefill_queued + state.prefill_waiting)
        router.metrics.queued.labels(node=node, phase="decode").set(state.decode_queued)
        track.pool = pool_from(state, router.shape.page_tokens)
        if mode is NodeMode.COLLOCATED:  # the live router routes to prefill and decode nodes only
            track.mode = None
            return
        track.mode = mode
        phase = Phase(mode.value)
        draining = state.switch_state == pb.SWITCH_STATE_DRAINING
        if track.phase is None:
            router.core.add_node(track, phase)
            track.phase = phase
        elif track.target is not None and mode is track.target and not draining:
            router.switch_done(node, phase)
        elif track.target is None and phase is not track.phase:
            router.switch_done(node, phase)
        elif draining and track.target is None:  # a switch the operator started
            router.core.switch_begun(node, Phase.DECODE if phase is Phase.PREFILL else Phase.PREFILL)

    def on_down(self, node: NodeId, reason: str) -> None:
        router = self.router
        log.warning("node %s is unavailable: %s", node, reason)
        router.metrics.node_up.labels(node=node).set(0)
        track = router.core.nodes[node]
        track.mode, track.phase, track.pool, track.target = None, None, None, None
        router.progress_events.pop(node, None)
        track.forget_report()
        router.push(router.core.clear_node(node, router.now()))
        for flight in list(router.flights.values()):
            if node in (flight.req.prefill_node, flight.req.decode_node):
                flight.interrupt(f"node {node} became unavailable ({reason})")
        router.refresh_gauges()

    def on_up(self, node: NodeId) -> None:
        router = self.router
        router.metrics.node_up.labels(node=node).set(1)
        counts = router.core.branches.counts_for(node)
        if counts and router.push_enabled:
            router.clients[node].push_counts(counts)
