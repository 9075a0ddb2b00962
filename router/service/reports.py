"""`NodeReports`: a node's `StreamEvents` messages and its availability, applied to the live router's core.

- KV event batches go to the directory (host evictions to the branch counts; count changes are pushed);
- iteration reports go to the node's warmup fitter and usage counts;
- state snapshots set the node's mode, pool gauges and queue metrics; the first one of a node (or after it came
  back) registers its phase; a mode that reaches a switch's target completes the switch; a node draining for a
  switch the router did not start (the operator's) stops getting old-phase work;
- prefill starts and ends of the current attempt of a request (by wire id, from its prefill node) are recorded
  on its flight; a start lets its decode be bound, an end confirms the prefill in the core;
- hand-backs (streamed as a switch begins) interrupt the requests' attempts, which are routed again at once;
- switch reports complete the switch; a state still draining from the phase a switch left, or still collocated
  after the end of the warmup's switch, arriving after the switch's end (its SwitchPhase answer comes on another
  channel), is stale and ignored;
- a state's prefill queue (running chunked prefills, queued ids in order; wire ids mapped to request ids) becomes
  the node's report in the core, stamped with the router's time of arrival, so TTFT routing reads it while it is
  fresh (`TtftSettings.state_max_age_s`) and the router's own record otherwise; a node that reports no queue (an
  older node agent) is routed on the router's record;
- a node reporting SWITCH_STATE_RELAUNCHING serves nothing: it leaves routing, its KV leaves the directory (its
  counts are released) and the requests in flight on it are routed again (a decode on another node that already
  streams tokens keeps going); its report of the new phase completes the switch;
- a broken stream takes the node out of routing, drops its pages from the directory, releases its counts and
  interrupts the requests in flight on it; a new stream (starting with a KV snapshot) brings it back.

Collocated nodes (the warmup of algorithm E.3) serve both phases: prefills go to them and each decodes what it
prefilled. The control core learns of nodes joining, leaving and finishing switches from here.

Boundary: translating reports into core calls; the core decides.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from evolving_infra.core.types import NodeId, NodeMode, Phase, RequestId
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.core import NodeTrack
from evolving_infra.router.routing import RunningPrefill
from evolving_infra.router.service import flights
from evolving_infra.proto.convert import iteration_from_proto, kv_batch_from_proto, mode_from_proto, prefill_queue_from_proto
from evolving_infra.router.service.wire import pool_from

if TYPE_CHECKING:
    from evolving_infra.router.service.backend import LiveRouter

log = logging.getLogger(__name__)


class NodeReports:
    """Applies node reports to `router` (see the module docstring)."""

    def __init__(self, router: LiveRouter) -> None:
        self.router = router
        self.joined: set[NodeId] = set()
        """Nodes whose stream is up and that reported their state since (known to the control core)."""

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
            router.generation_seen(node, event.switch_completed.generation)
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
        if state.switch_state == pb.SWITCH_STATE_RELAUNCHING:
            self._relaunching(node, track)
            return
        mode = mode_from_proto(state.mode, "NodeState.mode")
        router.generation_seen(node, state.generation)
        draining = state.switch_state == pb.SWITCH_STATE_DRAINING
        if node in self.joined and track.target is None and track.phase is not None and (
            mode is NodeMode.COLLOCATED or (draining and Phase(mode.value) is not track.phase)
        ):
            # collocated, or draining away from a phase, after the node's switch to another phase ended: a snapshot
            # from before that end, which the router learnt first (the SwitchPhase answer comes on another
            # channel; a node never goes back to the warmup without a new stream): stale, nothing taken
            log.debug("node %s: stale state (%s%s after its switch to %s) ignored", node,
                      "draining from " if draining else "", mode.value, track.phase.value)  # fmt: skip
            return
        router.progress_events[node] = state.prefill_events
        router.metrics.queued.labels(node=node, phase="prefill").set(state.prefill_queued + state.prefill_waiting)
        router.metrics.queued.labels(node=node, phase="decode").set(state.decode_queued)
        track.pool = pool_from(state, router.shape.page_tokens)
        self._queue(track, state)
        track.mode = mode
        if mode is NodeMode.COLLOCATED:  # the collocated warmup: the node serves both phases
            if node not in self.joined:
                self.joined.add(node)
                router.push(router.control.node_joined(node, None, router.now()))
            return
        phase = Phase(mode.value)
        if node not in self.joined:
            self.joined.add(node)
            router.push(router.control.node_joined(node, phase, router.now()))
        elif track.target is not None and mode is track.target and not draining:
            router.switch_done(node, phase)
        elif track.target is None and phase is not track.phase:
            router.switch_done(node, phase)
        elif draining and track.target is None:  # a switch the operator started
            router.core.switch_begun(node, Phase.DECODE if phase is Phase.PREFILL else Phase.PREFILL)

    def _queue(self, track: NodeTrack, state: pb.NodeState) -> None:
        """The state's prefill queue as the node's report (module docstring)."""
        queue = prefill_queue_from_proto(state)
        if queue is None:
            return
        attempts = self.router.attempts

        def request(wire: str) -> RequestId:
            flight = attempts.get(wire)
            return flight.req.route.id if flight is not None else RequestId(wire)  # `req.id` is str(route.id)

        running = tuple(RunningPrefill(request(w), left, context) for w, left, context in queue.running)
        track.record_report(self.router.now(), running, tuple(request(w) for w in queue.queued))

    def _relaunching(self, node: NodeId, track: NodeTrack) -> None:
        """The node relaunches for a switch (module docstring); later reports of the same relaunch change nothing."""
        if track.mode is None:
            return
        router = self.router
        log.info("node %s relaunches: it serves nothing until it reports its new phase", node)
        if track.target is None and track.phase is not None:  # a relaunch the router did not order (the operator's)
            router.core.switch_begun(node, track.phase.other)
        track.mode, track.pool = None, None
        track.forget_report()
        router.push(router.core.clear_node(node, router.now()))
        self._interrupt_flights(node, f"handed back by node {node}'s relaunch")
        router.refresh_gauges()

    def _interrupt_flights(self, node: NodeId, reason: str) -> None:
        """Interrupt the flights `node` served (it relaunches or was lost): those it decodes, and those it
        prefills that have not streamed yet, the latter marked as a prefill loss (a first token already on its
        way means the decode node holds the prompt KV, and the request goes on: `LiveRouter._next`)."""
        for flight in list(self.router.flights.values()):
            req = flight.req
            if req.decode_node == node or (req.prefill_node == node and not flight.tokens_sent):
                flight.interrupt(reason, prefill_loss=node != req.decode_node)

    def on_down(self, node: NodeId, reason: str) -> None:
        router = self.router
        log.warning("node %s is unavailable: %s", node, reason)
        router.metrics.node_up.labels(node=node).set(0)
        track = router.core.nodes[node]
        track.mode, track.pool = None, None
        self.joined.discard(node)
        router.progress_events.pop(node, None)
        router.push(router.control.node_lost(node, router.now(), reason))
        self._interrupt_flights(node, f"node {node} became unavailable ({reason})")
        router.refresh_gauges()

    def on_up(self, node: NodeId) -> None:
        router = self.router
        router.metrics.node_up.labels(node=node).set(1)
        counts = router.core.branches.counts_for(node)
        if counts and router.push_enabled:
            router.clients[node].push_counts(counts)
