"""Phases of the cluster as kernel event handlers: the collocated warmup and its end, planner ticks, and the
three ways a decided switch is applied (docs/planner.md, `SwitchMode`):

- IN_PLACE: `engine.begin_switch`; queued requests are handed back and re-routed to nodes of the old phase,
  running ones finish in place; when the engine reports completion the node serves its new phase and the
  branch table learns it (`set_phase`).
- IN_PLACE_STRAND_KV: the same, then the node's cached KV is dropped (Arrow keeps KV in each engine's own
  cache, so a switched node's KV is unreachable for prefill).
- RELAUNCH: the node's worker is terminated at once: its requests are re-routed (their KV on it is lost), its
  KV is cleared (`KvCleared` to the directory, its counts dropped), it serves nothing for `relaunch_s`, then a
  fresh engine serves the new phase.

Also the warmup's periodic refits of the provisional routing models and the pause rule's ticks.

Invariant: no request is lost or duplicated by a switch: every request a node hands back or loses is re-routed
exactly once per hand-back, and stale events of its earlier attempt are ignored (`SimRequest.attempt`).

Boundary: switching and planning; the request path is `flow`.
"""

from __future__ import annotations

from evolving_infra.core.types import NodeMode, Phase, Tier
from evolving_infra.node_agent.engine import DecodeRequest, PrefillRequest
from evolving_infra.router.fitting import UsageCounts
from evolving_infra.router.core import NodeTrack
from evolving_infra.router.planner import (
    Outcome,
    PlannerDecision,
    SwitchMode,
    WindowConfig,
)
from evolving_infra.sim import flow
from evolving_infra.sim.config import ModelSource
from evolving_infra.sim.kernel import Cancel, Command, Event, Priority
from evolving_infra.sim.models import freeze_all, profile_planner_model, profile_router_model, provisional_model
from evolving_infra.sim.pause import ProgramView
from evolving_infra.sim.records import SwitchRecord
from evolving_infra.sim.spans import close_span, stop_span
from evolving_infra.sim.state import ClusterState, SimNode, SimRequest, Stage, absorb, apply_counts, kick, push_counts
from evolving_infra.sim.views import capacity_tokens


def _done(state: ClusterState) -> bool:
    return bool(state.replayer.done and not state.requests)


# -- warmup -------------------------------------------------------------------------------------------------
def on_fit_tick(state: ClusterState, event: Event) -> list[Command]:
    """During the collocated warmup: refresh the router's provisional models from the fits so far."""
    if not state.collocated:
        return []
    for node in state.nodes.values():
        if node.fitter is not None:
            state.core.router_models[node.id] = provisional_model(node.fitter, state.profile)
    nxt = event.time + state.cfg.fit_interval_s
    if nxt < state.cfg.warmup_s and not _done(state):
        return [Event(nxt, Priority.CONTROL, lambda e: on_fit_tick(state, e), label="fit tick")]
    return []


def start_disaggregation(state: ClusterState, phases: dict[str, Phase], now: float) -> list[Command]:
    """End of the collocated warmup: freeze the models, then switch every node to its initial phase."""
    out: list[Command] = []
    if state.collocated:
        fitters = {n.id: n.fitter for n in state.nodes.values() if n.fitter is not None}
        fitted, messages = freeze_all(fitters)  # type: ignore[arg-type]
        state.stats.fit_messages.extend(messages)
        state.fitted = fitted
        for node in state.nodes.values():
            node.usage = UsageCounts()
            state.core.router_models[node.id] = fitted[node.id]
            state.core.planner_models[node.id] = fitted[node.id]
        state.collocated = False
        for node in state.nodes.values():
            state.branches.set_phase(node.id, phases[node.id])
        push_counts(state)
        for node in state.nodes.values():
            out += begin_in_place(state, node, phases[node.id], now, strand=False, record=False)
    state.disaggregated_at = now
    window = getattr(getattr(state.planner, "settings", None), "window", None)
    state.core.start_window(window if isinstance(window, WindowConfig) else WindowConfig(), now)
    state.record_split(now)
    if state.planner is not None and not _done(state):
        out.append(Event(now + state.planner.interval_s, Priority.CONTROL, lambda e: on_planner_tick(state, e),
                         label="planner tick"))
    return out


# -- planner ------------------------------------------------------------------------------------------------
def refresh_models(state: ClusterState) -> None:
    """Remeasure t̄_n and f_n of every node from the window's usage counts (new model objects)."""

    def refresh(node: NodeTrack, usage: UsageCounts | None) -> tuple[object, object]:
        if state.cfg.models is ModelSource.FITTED:
            base = state.fitted[node.id]
            model = base.remeasured(usage) if usage is not None else state.core.planner_models.get(node.id, base)
            return model, model
        return profile_router_model(state.profile, usage), profile_planner_model(state.profile, usage)

    state.core.refresh_models(refresh)


def on_planner_tick(state: ClusterState, event: Event) -> list[Command]:
    now = event.time
    if _done(state):
        return []
    state.stats.planner_ticks += 1
    refresh_models(state)
    observation = state.core.observation(now)
    decision: PlannerDecision = state.planner.decide(observation, now)
    out: list[Command] = []
    if decision.outcome is Outcome.SWITCH:
        state.decisions.append({"at": now, "outcome": decision.outcome.value, "reason": decision.reason,
                                "mode": decision.mode.value})
        state.stats.planner_switches += 1
        out += apply_decision(state, decision, now)
    out.append(Event(now + state.planner.interval_s, Priority.CONTROL, lambda e: on_planner_tick(state, e),
                     label="planner tick"))
    return out


def apply_decision(state: ClusterState, decision: PlannerDecision, now: float) -> list[Command]:
    change = state.core.split_change(decision)
    assert change is not None
    out: list[Command] = []
    for switch in change.switches:
        node = state.nodes[switch.node]
        if decision.mode is SwitchMode.RELAUNCH:
            out += relaunch(state, node, switch.phase, decision.relaunch_s, now)
        else:
            out += begin_in_place(state, node, switch.phase, now, strand=decision.mode is SwitchMode.IN_PLACE_STRAND_KV)
    return out


# -- in-place switches --------------------------------------------------------------------------------------
def begin_in_place(
    state: ClusterState, node: SimNode, phase: Phase, now: float, *, strand: bool, record: bool = True
) -> list[Command]:
    assert node.engine is not None
    state.core.switch_begun(node.id, phase)
    node.switch_decided = now
    node.switch_from = node.phase if record else None
    node.strand_on_switch = strand
    stop_span(state, node, now)
    begun = node.engine.begin_switch(phase, now)
    absorb(state, node.id, begun.events)
    out: list[Command] = []
    for item in begun.handed_back:
        req = state.requests.get(str(item.request))  # type: ignore[attr-defined]
        if req is None:
            continue
        if isinstance(item, PrefillRequest):
            out += reroute(state, req, now)
        elif isinstance(item, DecodeRequest):
            out += rebind_decode(state, req, now)
    for req in list(node.prealloc):  # waiting for a reservation on a node that leaves decode
        flow.unbind(state, req)
        out += reroute(state, req, now)
    if begun.completed is not None:
        out += on_switch_completed(state, node, now)
    return out + kick(state, node, now)


def on_switch_completed(state: ClusterState, node: SimNode, now: float) -> list[Command]:
    if node.target is None or node.engine is None:
        return []
    phase = Phase(node.target.value)
    state.core.switch_completed(node.id, phase, now)
    if node.strand_on_switch:
        engine = node.engine
        engine.evict(Tier.GPU, engine.pool.l1.capacity, now)
        absorb(state, node.id, engine.evict(Tier.HOST, engine.pool.l2.capacity, now).events)
        node.strand_on_switch = False
    push_counts(state)
    if node.switch_from is not None:
        state.switches.append(SwitchRecord(node.id, node.switch_from, phase, node.switch_decided, now))
        state.core.last_switch_end = now
    node.switch_from = None
    close_span(state, node, now, phase)
    node.busy = 0.0
    state.record_split(now)
    return flow.retry_waiting(state, now) + kick(state, node, now)


# -- relaunch (Dynamo) ----------------------------------------------------------------------------------------
def relaunch(state: ClusterState, node: SimNode, phase: Phase, downtime: float, now: float) -> list[Command]:
    """Terminate the node's worker now and start a worker of `phase` after `downtime` seconds."""
    old = node.phase
    stop_span(state, node, now)
    node.engine = None
    node.phase = None
    state.core.switch_begun(node.id, phase)
    node.switch_decided = now
    node.switch_from = old
    node.step_at = None
    node.iterating = False
    apply_counts(state, state.core.clear_node(node.id, now))
    state.record_split(now)
    out: list[Command] = [Cancel(("step", node.id))]
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
    for req in list(node.prealloc):  # not yet at a prefill node: route afresh
        flow.unbind(state, req)
        out += reroute(state, req, now)
    for req in list(node.bound.values()):  # bind another decode node; the prefill (if running) stays
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


def on_relaunched(state: ClusterState, node_id: str, phase: Phase, event: Event) -> list[Command]:
    node = state.nodes[node_id]
    now = event.time
    assert state.make_engine is not None
    node.engine = state.make_engine(node.id, NodeMode.of(phase))
    state.core.switch_completed(node.id, phase, now)
    if node.switch_from is not None:
        state.switches.append(SwitchRecord(node.id, node.switch_from, phase, node.switch_decided, now))
    node.switch_from = None
    state.core.last_switch_end = now
    close_span(state, node, now, phase)
    state.record_split(now)
    return flow.retry_waiting(state, now) + kick(state, node, now)


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
