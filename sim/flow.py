"""The request path as kernel event handlers (docs/simulator.md, "Wiring"):

issue (replayer effect) -> content pages -> BranchTable.request -> KvDirectory.lookup -> prefill routing over the
accepting prefill nodes' views -> [SGLang: decode bound and KV reserved first] -> engine.submit_prefill with the
fetch plan -> fetch completion after profile.fetch_time -> prefill started: decode bound (ours) and the branch
placed -> prefill finished: first token, KV transfer after profile.transfer_time -> engine.submit_decode ->
decode finished: record, replayer.completed -> next requests; branch ends -> BranchTable.end.

Every handler returns kernel commands; node steps are scheduled with `state.kick`.

Invariant: a request is in `state.requests` from its issue to its last token and is recorded exactly once;
a stale event (a fetch or transfer of an earlier attempt of a re-routed request) changes nothing.

Boundary: the request path; iterations are driven by `stepping`, switches and the planner by `phases`.
"""

from __future__ import annotations

import math
from typing import cast

from evolving_infra.core.types import BranchId, Phase, RequestId
from evolving_infra.node_agent.engine import (
    DecodeFinished,
    DecodeRequest,
    FetchStarted,
    PrefillFinished,
    PrefillRequest,
    PrefillStarted,
)
from evolving_infra.router.core.control import RequestFinished
from evolving_infra.router.routing import RouteRequest
from evolving_infra.sim.config import DecodeReservation
from evolving_infra.sim.kernel import Cancel, Command, Event, Priority, StopRun
from evolving_infra.sim.pause import ProgramRecord
from evolving_infra.sim.records import RequestRecord
from evolving_infra.sim.replay import AgentFinished, AgentStarted, BranchEnded, Effect, IssueRequest
from evolving_infra.sim.state import ClusterState, SimNode, SimRequest, Stage, absorb, apply_counts, kick
from evolving_infra.sim.views import decode_need, kv_room_tokens

WAKE = "replayer-wake"


# -- replayer effects -------------------------------------------------------------------------------------
def react(state: ClusterState, effects: list[Effect], now: float) -> list[Command]:
    out: list[Command] = []
    for effect in effects:
        if isinstance(effect, IssueRequest):
            out += issue(state, effect, now)
        elif isinstance(effect, BranchEnded):
            apply_counts(state, state.core.end_branch(BranchId(effect.branch), now))
        elif isinstance(effect, AgentStarted):
            if state.pause is not None:
                state.programs[effect.agent] = ProgramRecord()
        elif isinstance(effect, AgentFinished):
            state.programs.pop(effect.agent, None)
    wake = state.replayer.next_wakeup()
    out.append(Cancel(WAKE))
    if wake is not None:
        out.append(Event(max(wake, now), Priority.ARRIVAL, lambda e: on_wake(state, e), label="replayer wake", token=WAKE))
    return out


def on_wake(state: ClusterState, event: Event) -> list[Command]:
    return react(state, state.replayer.due(event.time), event.time)


def issue(state: ClusterState, effect: IssueRequest, now: float) -> list[Command]:
    spec = effect.request
    pages = tuple(state.content.prompt_pages(spec.id).tolist())  # numpy uint64 -> Python ints
    context = state.content.context_pages(spec.id)
    pt = state.profile.page_tokens
    generated = tuple(context[len(pages) : (spec.prompt_tokens + spec.output_tokens) // pt].tolist())
    version = state.core.admit(BranchId(spec.branch), pages)
    route = RouteRequest(
        id=RequestId(spec.id),
        branch=BranchId(spec.branch),
        page_hashes=pages,
        prompt_tokens=spec.prompt_tokens,
        output_tokens=spec.output_tokens,
        t_acc=state.profile.decode.t_acc,
        page_tokens=pt,
        parent_branch=BranchId(state.parents[spec.branch]) if spec.branch in state.parents else None,
    )
    req = SimRequest(route=route, prompt_pages=pages, version=version, spec=spec, generated=generated,
                     issued=effect.at, since=effect.since)
    state.requests[spec.id] = req
    state.stats.issued += 1
    program = state.programs.get(spec.agent)
    if program is not None:
        program.in_flight += 1
        if program.paused_since is not None:
            req.stage = Stage.HELD
            state.held.setdefault(spec.agent, []).append(req)
            return []
    return route_request(state, req, now)


# -- routing ----------------------------------------------------------------------------------------------
def route_request(state: ClusterState, req: SimRequest, now: float) -> list[Command]:
    """Choose the prefill node (and, under SGLang's reservation, the decode node) and send the request."""
    routed = state.core.route(req, now)
    if routed is None:
        req.stage = Stage.HELD
        state.parked.append(req)
        return []
    node = state.nodes[routed.node]
    req.queued = now
    req.fetch = routed.fetch
    req.fetched = 0
    apply_counts(state, routed.counts)
    program = state.programs.get(req.spec.agent)
    if program is not None:
        program.node = node.id
        program.kv = req.route.prompt_tokens + req.route.output_tokens
    if state.cfg.decode_reservation is DecodeReservation.AT_ROUTING and not state.collocated:
        if req.decode_node is None:
            out = bind(state, req, now)
            if req.decode_node is None:
                return out
        if req.reserved == 0:
            target = state.nodes[req.decode_node]
            target.prealloc.append(req)
            req.stage = Stage.WAIT_RESERVATION
            return grant_reservations(state, target, now)
    return submit_prefill(state, req, now)


def submit_prefill(state: ClusterState, req: SimRequest, now: float) -> list[Command]:
    node = state.nodes[req.prefill_node]  # type: ignore[index]  # a request is submitted after routing sets it
    assert node.engine is not None
    local = state.collocated
    pr = PrefillRequest(
        request=RequestId(req.id),
        branch=BranchId(req.spec.branch),
        prompt_pages=req.prompt_pages,
        prompt_tokens=req.route.prompt_tokens,
        output_tokens=req.route.output_tokens if local else 0,
        t_acc=req.route.t_acc,
        fetch=req.fetch,
        generated_pages=req.generated if local else None,
    )
    req.stage = Stage.PREFILL
    state.core.prefill_sent(req)
    effects = node.engine.submit_prefill(pr, now)
    absorb(state, node.id, effects.events)
    return start_fetches(state, node, effects.fetches, now) + kick(state, node, now)


def start_fetches(state: ClusterState, node: SimNode, fetches: tuple[FetchStarted, ...], now: float) -> list[Command]:
    """Each request's fetch lands when its slowest peer run has arrived (runs from peers go in parallel)."""
    due: dict[str, float] = {}
    for f in fetches:
        due[f.request] = max(due.get(f.request, now), now + state.profile.fetch_time(f.tokens))
        req = state.requests.get(f.request)
        if req is not None:
            req.fetched += f.tokens
        state.stats.fetches += 1
        state.stats.fetched_tokens += f.tokens
    out: list[Command] = []
    for rid, at in due.items():
        attempt = state.requests[rid].attempt if rid in state.requests else -1
        payload = (node.id, rid, attempt)
        out.append(Event(at, Priority.COMPLETION, lambda e: on_fetch_done(state, e), label=f"fetch {rid}", payload=payload))
    return out


def on_fetch_done(state: ClusterState, event: Event) -> list[Command]:
    node_id, rid, attempt = event.payload
    req = state.requests.get(rid)
    node = state.nodes[node_id]
    if req is None or req.attempt != attempt or req.prefill_node != node_id or node.engine is None:
        return []
    effects = node.engine.fetch_completed(rid, event.time)
    absorb(state, node_id, effects.events)
    return start_fetches(state, node, effects.fetches, event.time) + kick(state, node, event.time)


# -- decode binding and reservations ----------------------------------------------------------------------
def bind(state: ClusterState, req: SimRequest, now: float) -> list[Command]:
    """Bind the request's decode node now, or queue it until some node has room."""
    bound = state.core.bind(req, now)
    if bound.node is None:
        if req not in state.wait_bind:
            req_stage = req.stage
            state.wait_bind.append(req)
            state.stats.bind_waits += 1
            if req_stage is Stage.TRANSFER:
                req.stage = Stage.WAIT_BIND
        return []
    apply_counts(state, bound.counts)
    if req.prefill_done:
        return start_transfer(state, req, now)
    return []


def unbind(state: ClusterState, req: SimRequest) -> None:
    state.core.unbind(req)


def grant_reservations(state: ClusterState, node: SimNode, now: float) -> list[Command]:
    """SGLang pre-allocation: reserve decode KV for waiting requests in order while the node has room."""
    out: list[Command] = []
    while node.prealloc:
        req = cast(SimRequest, node.prealloc[0])  # a simulator node's records are SimRequests
        need = decode_need(req)
        if kv_room_tokens(node) < need:
            state.stats.reservation_waits += 1
            break
        node.prealloc.popleft()
        state.core.reserve(req)
        if not state.nodes[req.prefill_node].accepts(Phase.PREFILL):  # type: ignore[index]  # waiting requests were routed first
            # its prefill node stopped taking prefills (relaunch or switch) while it waited: route it again;
            # the decode binding and reservation stay
            state.stats.rerouted += 1
            state.core.release_prefill(req)
            out += route_request(state, req, now)
            continue
        out += submit_prefill(state, req, now)
    return out


def retry_waiting(state: ClusterState, now: float) -> list[Command]:
    """Room or nodes changed: retry bindings that found no room, and requests parked without a prefill node."""
    out: list[Command] = []
    for _ in range(len(state.wait_bind)):
        req = state.wait_bind.popleft()
        if state.requests.get(req.id) is not req:
            continue
        out += bind(state, req, now)
        if req.decode_node is None:
            break  # no room anywhere yet; keep the order
    if state.parked and state.accepting(Phase.PREFILL):
        parked = list(state.parked)
        state.parked.clear()
        for req in parked:
            if state.requests.get(req.id) is req:
                out += route_request(state, req, now)
    return out


# -- prefill progress -------------------------------------------------------------------------------------
def on_prefill_started(state: ClusterState, node: SimNode, started: PrefillStarted, now: float) -> list[Command]:
    req = state.requests.get(started.request)
    if req is None:
        return []
    req.prefill_start = started.time
    req.cached = started.cached_tokens
    state.core.prefill_started(node.id, req, started.cached_tokens, started.restored_tokens, now)
    if started.local_decode or req.decode_node is not None:
        return []
    return bind(state, req, now)


def on_prefill_finished(state: ClusterState, node: SimNode, finished: PrefillFinished, now: float) -> list[Command]:
    req = state.requests.get(finished.request)
    apply_counts(state, state.core.prefill_finished(node.id, finished.request, req, now))
    if req is None:
        return []
    req.first_token = finished.time
    if finished.local_decode:
        req.stage = Stage.DECODE
        req.decode_node = node.id
        return []
    if req.decode_node is None:
        req.stage = Stage.WAIT_BIND
        return []
    return start_transfer(state, req, now)


def start_transfer(state: ClusterState, req: SimRequest, now: float) -> list[Command]:
    req.stage = Stage.TRANSFER
    at = now + state.profile.transfer_time(req.route.prompt_tokens)
    payload = (req.id, req.attempt, req.decode_node)
    return [Event(at, Priority.COMPLETION, lambda e: on_transfer_done(state, e), label=f"transfer {req.id}", payload=payload)]


def on_transfer_done(state: ClusterState, event: Event) -> list[Command]:
    rid, attempt, target_id = event.payload
    req = state.requests.get(rid)
    now = event.time
    if req is None or req.attempt != attempt or req.decode_node != target_id or req.stage is not Stage.TRANSFER:
        return []
    target = state.nodes[target_id]
    if not target.accepts(Phase.DECODE):
        unbind(state, req)
        state.stats.rebound += 1
        return bind(state, req, now)
    dr = DecodeRequest(
        request=RequestId(rid),
        branch=BranchId(req.spec.branch),
        prompt_pages=req.prompt_pages,
        prompt_tokens=req.route.prompt_tokens,
        output_tokens=req.route.output_tokens,
        t_acc=req.route.t_acc,
        generated_pages=req.generated,
    )
    state.core.decode_handover(req)
    effects = target.engine.submit_decode(dr, now)  # type: ignore[union-attr]  # it accepts decode: it has an engine
    absorb(state, target.id, effects.events)
    req.stage = Stage.DECODE
    apply_counts(state, state.core.decode_submitted(req, now))
    return kick(state, target, now)


# -- completion -------------------------------------------------------------------------------------------
def on_decode_finished(state: ClusterState, node: SimNode, done: DecodeFinished, now: float) -> list[Command]:
    req = state.requests.pop(done.request, None)
    if req is None:
        return []
    state.core.decode_finished(node.id, req, now)
    iterations = math.ceil(done.output_tokens / req.route.t_acc - 1e-9)  # what the engine ran for it
    state.control.handle(RequestFinished(done.output_tokens, float(iterations), now))
    assert req.queued is not None and req.prefill_start is not None and req.first_token is not None
    state.records.append(
        RequestRecord(
            request_id=req.id,
            agent=req.spec.agent,
            workload=req.spec.workload,
            branch=req.spec.branch,
            issued=req.issued,
            prefill_node=req.prefill_node or "",
            decode_node=node.id,
            queued=req.queued,
            prefill_start=req.prefill_start,
            first_token=req.first_token,
            finish=done.time,
            prompt_tokens=req.route.prompt_tokens,
            cached_tokens=req.cached,
            fetched_tokens=min(req.fetched, req.cached),
            output_tokens=req.route.output_tokens,
            since=req.since,
            pause_s=req.spec.delay_s,
        )
    )
    state.stats.finished += 1
    program = state.programs.get(req.spec.agent)
    if program is not None:
        program.in_flight -= 1
    out = grant_reservations(state, node, now) + retry_waiting(state, now)
    out += react(state, state.replayer.completed(req.id, now), now)
    if state.replayer.done and not state.requests:
        out.append(StopRun("every agent of the trace finished"))
    return out
