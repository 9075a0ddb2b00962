"""The simulator's driver of the control core (`router.core.control.ControlCore`): it delivers the core's ticks and
events on the kernel and carries out its effects. Warmup, model refresh, planner ticks, switch orders and their
completion are decided by the core, exactly as in the live router; this module only applies a `SwitchOrder` the
way its mode says (docs/planner.md, `SwitchMode`):

- IN_PLACE: `engine.begin_switch`; queued requests are handed back and re-routed to nodes of the old phase,
  running ones finish in place; when the engine reports completion the node serves its new phase and the
  branch table learns it (`set_phase`).
- IN_PLACE_STRAND_KV: the same, then the node's cached KV is dropped (Arrow keeps KV in each engine's own
  cache, so a switched node's KV is unreachable for prefill).
- RELAUNCH: the node's worker is terminated at once: its requests are re-routed (their KV on it is lost), its
  KV is cleared (`KvCleared` to the directory, its counts dropped), it serves nothing for `relaunch_s`, then a
  fresh engine serves the new phase.

Also the pause rule's ticks.

Invariant: no request is lost or duplicated by a switch: every request a node hands back or loses is re-routed
exactly once per hand-back, and stale events of its earlier attempt are ignored (`SimRequest.attempt`).

Boundary: carrying out control effects on the simulated cluster; decisions are the control core's, the request
path is `flow`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from evolving_infra.core.types import NodeId, NodeMode, Phase, Tier
from evolving_infra.node_agent.engine import DecodeRequest, PrefillRequest
from evolving_infra.router.core import PushCounts
from evolving_infra.router.core.control import (
    ControlEffect, ModelsFrozen, PlannerDecided, SwitchCompleted, SwitchOrder,
)  # fmt: skip
from evolving_infra.router.planner import OursDiagnostics, Outcome, PlannerDecision, SwitchMode
from evolving_infra.sim import flow, quiet
from evolving_infra.sim.kernel import Cancel, Command, Event, Priority
from evolving_infra.sim.pause import ProgramView
from evolving_infra.sim.records import SwitchRecord
from evolving_infra.sim.spans import close_span, stop_span
from evolving_infra.sim.state import ClusterState, SimNode, SimRequest, Stage, absorb, apply_counts, kick
from evolving_infra.sim.views import capacity_tokens

CONTROL = "control-tick"


def _sim_requests(records: Iterable[object]) -> list[SimRequest]:
    """A copy of a simulator node's request records (`NodeTrack` types them as `RoutedRequest`s; here they are
    always `SimRequest`s)."""
    return cast("list[SimRequest]", list(records))


def _done(state: ClusterState) -> bool:
    return bool(state.replayer.done and not state.requests)


# -- the control core's ticks and effects ------------------------------------------------------------------
def start_control(state: ClusterState, now: float) -> list[Command]:
    """Start the control core at `now` (the warmup, or the initial split) and schedule its first tick."""
    return carry_out(state, state.control.start(now), now) + schedule_tick(state, now)


def schedule_tick(state: ClusterState, now: float) -> list[Command]:
    """The control core's next tick (replacing any tick still pending: there is one at most)."""
    at = state.control.next_tick_at
    if at is None or _done(state):
        return []
    tick = Event(max(at, now), Priority.CONTROL, lambda e: on_control_tick(state, e), label="control tick",
                 token=CONTROL)
    return [Cancel(CONTROL), tick]


def tick_if_due(state: ClusterState, now: float) -> list[Command]:
    """An event made a tick due now (a completion the staged end of the warmup waits for): deliver it at once,
    replacing the tick scheduled for later (it is scheduled again after this one)."""
    at = state.control.next_tick_at
    if at is None or at > now:
        return []
    return schedule_tick(state, now)


def on_control_tick(state: ClusterState, event: Event) -> list[Command]:
    if _done(state):
        return []
    now = event.time
    out = carry_out(state, state.control.tick(now), now)
    return out + schedule_tick(state, now)


def apply_decision(state: ClusterState, decision: PlannerDecision, now: float) -> list[Command]:
    """Carry out a decision made outside the planner's ticks (tests): the control core orders its switches."""
    return carry_out(state, state.control.decided(decision, now), now)


def carry_out(state: ClusterState, effects: list[ControlEffect], now: float) -> list[Command]:
    """Carry out the control core's effects on the simulated cluster, in order."""
    out: list[Command] = []
    for effect in effects:
        if isinstance(effect, PushCounts):
            apply_counts(state, [effect])
        elif isinstance(effect, ModelsFrozen):
            state.stats.fit_messages.extend(effect.messages)
        elif isinstance(effect, PlannerDecided):
            state.stats.planner_ticks += 1
            decision = effect.decision
            diag = decision.diagnostics
            ours = isinstance(diag, OursDiagnostics)
            if decision.outcome is Outcome.SWITCH or (ours and decision.outcome is Outcome.HOLD):
                record = {"at": now, "outcome": decision.outcome.value, "reason": decision.reason,
                          "mode": decision.mode.value}  # fmt: skip
                if isinstance(diag, OursDiagnostics):  # why: every candidate, as a live CR shows
                    record["candidates"] = diag.candidate_summary()
                    record["slices"] = diag.slice_summary()
                    record["active_kv_pages"] = diag.active_kv_pages
                if decision.outcome is Outcome.SWITCH:
                    state.decisions.append(record)
                    state.stats.planner_switches += 1
                else:  # a hold that weighed candidates: why the planner stayed (skips carry no candidates)
                    state.holds.append(record)
        elif isinstance(effect, SwitchOrder):
            node = state.nodes[effect.node]
            if effect.mode is SwitchMode.RELAUNCH:
                out += relaunch(state, node, effect.phase, effect.relaunch_s, now)
            else:
                strand = effect.mode is SwitchMode.IN_PLACE_STRAND_KV
                out += begin_in_place(state, node, effect.phase, now, strand=strand, record=not effect.initial)
    if state.disaggregated_at is None and not state.control.warming_up:
        state.disaggregated_at = now
    state.record_split(now)
    return out


# -- in-place switches --------------------------------------------------------------------------------------
def begin_in_place(
    state: ClusterState, node: SimNode, phase: Phase, now: float, *, strand: bool, record: bool = True
) -> list[Command]:
    assert node.engine is not None
    out: list[Command] = quiet.settle(state, node, now)
    node.switch_decided = now
    node.switch_from = node.phase if record else None
    node.strand_on_switch = strand
    stop_span(state, node, now)
    begun = node.engine.begin_switch(phase, now)
    absorb(state, node.id, begun.events)
    for item in begun.handed_back:
        req = state.requests.get(str(item.request))
        if req is None:
            continue
        if isinstance(item, PrefillRequest):
            out += reroute(state, req, now)
        elif isinstance(item, DecodeRequest):
            out += rebind_decode(state, req, now)
    for req in _sim_requests(node.prealloc):  # waiting for a reservation on a node that leaves decode
        flow.unbind(state, req)
        out += reroute(state, req, now)
    if begun.completed is not None:
        out += on_switch_completed(state, node, now)
    return out + kick(state, node, now)


def on_switch_completed(state: ClusterState, node: SimNode, now: float) -> list[Command]:
    if node.target is None or node.engine is None:
        return []
    phase = Phase(node.target.value)
    if node.strand_on_switch:
        engine = node.engine
        engine.evict(Tier.GPU, engine.pool.l1.capacity, now)
        absorb(state, node.id, engine.evict(Tier.HOST, engine.pool.l2.capacity, now).events)
        node.strand_on_switch = False
    carry_out(state, state.control.handle(SwitchCompleted(node.id, phase, now)), now)
    if node.switch_from is not None:
        state.switches.append(SwitchRecord(node.id, node.switch_from, phase, node.switch_decided, now))
    node.switch_from = None
    close_span(state, node, now, phase)
    node.busy = 0.0
    state.record_split(now)
    return tick_if_due(state, now) + flow.retry_waiting(state, now) + kick(state, node, now)


# -- relaunch (Dynamo) ----------------------------------------------------------------------------------------
def relaunch(state: ClusterState, node: SimNode, phase: Phase, downtime: float, now: float) -> list[Command]:
    """Terminate the node's worker now and start a worker of `phase` after `downtime` seconds."""
    old = node.phase
    settled = quiet.settle(state, node, now)  # (the iteration running then ends with no engine: a no-op, as stepped)
    stop_span(state, node, now)
    node.engine = None
    node.switch_decided = now
    node.switch_from = old
    node.step_at = None
    node.iterating = False
    apply_counts(state, state.core.clear_node(node.id, now))
    state.record_split(now)
    out: list[Command] = [*settled, Cancel(("step", node.id))]
    lost = list(node.sent.values()) + list(node.decode_jobs.values())
    if node.decode_jobs:
        state.core.set_occupancy(state.core.decode_occupancy - len(node.decode_jobs), now)
    node.sent.clear()
    node.decode_jobs.clear()
    node.forget_report()
    state.stats.aborted_by_relaunch += len(lost)
    for req in lost:
        if state.requests.get(req.id) is req:
            out += reroute(state, req, now, lost_kv=True)
    for req in _sim_requests(node.prealloc):  # not yet at a prefill node: route afresh
        flow.unbind(state, req)
        out += reroute(state, req, now)
    for req in _sim_requests(node.bound.values()):  # bind another decode node; the prefill (if running) stays
        flow.unbind(state, req)
        if req.prefill_done:
            req.attempt += 1
            req.stage = Stage.TRANSFER
        out += flow.bind(state, req, now)
        if req.decode_node is not None and req.reserved == 0:
            state.core.reserve(req)
    ready = Event(now + downtime, Priority.CONTROL, lambda e: on_relaunched(state, node.id, phase, e),
                  label=f"relaunched {node.id}")
    return [*out, ready]


def on_relaunched(state: ClusterState, node_id: NodeId, phase: Phase, event: Event) -> list[Command]:
    node = state.nodes[node_id]
    now = event.time
    assert state.make_engine is not None
    node.engine = state.make_engine(node.id, NodeMode.of(phase))
    carry_out(state, state.control.handle(SwitchCompleted(node.id, phase, now)), now)
    if node.switch_from is not None:
        state.switches.append(SwitchRecord(node.id, node.switch_from, phase, node.switch_decided, now))
    node.switch_from = None
    close_span(state, node, now, phase)
    state.record_split(now)
    return tick_if_due(state, now) + flow.retry_waiting(state, now) + kick(state, node, now)


# -- pause rule ---------------------------------------------------------------------------------------------
def on_pause_tick(state: ClusterState, event: Event) -> list[Command]:
    now = event.time
    if _done(state) or state.pause is None:
        return []
    views = [ProgramView(agent, p.node, p.kv, p.state, p.paused_since) for agent, p in state.programs.items()]
    decision = state.pause.tick(views, capacity_tokens(state), now)
    out: list[Command] = []
    for agent in decision.pause:
        state.programs[agent].paused_since = now
        state.stats.pauses += 1
    for agent, node in decision.resume:
        program = state.programs[agent]
        program.paused_since = None
        program.node = node
        state.stats.resumes += 1
        for req in state.held.pop(agent, []):
            if state.requests.get(req.id) is req:
                out += flow.route_request(state, req, now)
    out.append(Event(now + state.pause.interval_s, Priority.CONTROL, lambda e: on_pause_tick(state, e),
                     label="pause tick"))
    return out


# -- moving requests (hand-backs and relaunches) ------------------------------------------------------------
def reroute(state: ClusterState, req: SimRequest, now: float, *, lost_kv: bool = False) -> list[Command]:
    """Send a request's prefill again (handed back by a switching node, or its node relaunched)."""
    state.stats.rerouted += 1
    state.core.release_prefill(req, lost_kv=lost_kv)
    if lost_kv:
        req.prefill_start = None
        req.first_token = None
    return flow.route_request(state, req, now)


def rebind_decode(state: ClusterState, req: SimRequest, now: float) -> list[Command]:
    """A queued decode handed back by a switching decode node: bind elsewhere and transfer again."""
    state.stats.rebound += 1
    state.core.release_decode(req, now)
    req.stage = Stage.TRANSFER
    return flow.bind(state, req, now)
