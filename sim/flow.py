"""The request path as kernel event handlers (docs/simulator.md, "Wiring"):

issue (replayer effect) -> content pages -> BranchTable.request -> KvDirectory.lookup -> prefill routing over the
accepting prefill nodes' views -> [SGLang: decode bound and KV reserved first] -> engine.submit_prefill with the
fetch plan -> fetch runs over the links -> fetch completion (pages evicted at the source meanwhile fail and are
recomputed) -> prefill started: decode bound (ours) and the branch placed -> prefill finished: first token, KV
transfer over the links -> engine.submit_decode -> decode finished: record, replayer.completed -> next requests;
branch ends -> BranchTable.end.

Fetches and KV transfers share each node's NIC and host-memory bandwidth (`sim.links`): one pending kernel event
(token `LINKS`) follows the next landing at the current rates and is moved whenever a flow starts or ends.

Every handler returns kernel commands; node steps are scheduled with `state.kick`.

Invariant: a request is in `state.requests` from its issue to its last token and is recorded exactly once;
a stale event (a fetch or transfer of an earlier attempt of a re-routed request) changes nothing.

Boundary: the request path; iterations are driven by `stepping`, switches and the planner by `phases`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import cast

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase, RequestId
from evolving_infra.node_agent.engine import (
    DataPlane,
    DecodeFinished,
    DecodeRequest,
    FetchStarted,
    PrefillFinished,
    PrefillRequest,
    PrefillStarted,
)
from evolving_infra.router.core.control import RequestFinished
from evolving_infra.router.routing import RouteRequest
from evolving_infra.sim import quiet
from evolving_infra.sim.config import DecodeReservation
from evolving_infra.sim.kernel import Cancel, Command, Event, Priority, StopRun
from evolving_infra.sim.links import Flow, FlowKind, Landed, LinkModel
from evolving_infra.sim.pause import ProgramRecord
from evolving_infra.sim.records import RequestRecord
from evolving_infra.sim.replay import AgentFinished, AgentStarted, BranchEnded, Effect, IssueRequest
from evolving_infra.sim.state import ClusterState, SimNode, SimRequest, Stage, absorb, apply_counts, kick
from evolving_infra.sim.views import decode_need, kv_room_tokens

WAKE = "replayer-wake"
LINKS = "links"
_flow_ids = itertools.count()


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


@dataclass(eq=False)
class FetchGroup:
    """The fetch runs of one request's attempt on one node: it completes when the last run lands."""

    node: NodeId
    request: str
    attempt: int
    outstanding: int = 0
    failed: set[PageHash] = field(default_factory=set)
    flows: list[Flow] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class FetchRunFlow:
    """What a fetch flow carries: its group, the pages it pulls and the source engine it reads them from."""

    group: FetchGroup
    peer: NodeId
    pages: tuple[PageHash, ...]
    source_engine: object


def links(state: ClusterState) -> LinkModel:
    model = state.links
    if model is None:
        model = state.links = LinkModel(state.profile)
    assert isinstance(model, LinkModel)
    return model


def start_fetches(state: ClusterState, node: SimNode, fetches: tuple[FetchStarted, ...], now: float) -> list[Command]:
    """Each run is a flow from its peer over the links; a request's fetch lands when its last run has."""
    if not fetches:
        return []
    model = links(state)
    groups: dict[str, FetchGroup] = {}
    for f in fetches:
        req = state.requests.get(f.request)
        if req is not None:
            req.fetched += f.tokens
        state.stats.fetches += 1
        state.stats.fetched_tokens += f.tokens
        group = groups.get(f.request)
        if group is None:
            attempt = req.attempt if req is not None else -1
            group = groups[f.request] = FetchGroup(node.id, f.request, attempt)
        peer = state.nodes.get(NodeId(f.peer))
        source = peer.engine if peer is not None else None
        group.outstanding += 1
        key = (FlowKind.FETCH, next(_flow_ids))
        flow = model.start(key, FlowKind.FETCH, str(f.peer), str(node.id), f.bytes, now,
                           FetchRunFlow(group, NodeId(f.peer), tuple(f.pages), source))
        group.flows.append(flow)
    state.stats.peak_transfers = max(state.stats.peak_transfers, model.peak_concurrency)
    return _links_changed(state, now)


def _links_changed(state: ClusterState, now: float) -> list[Command]:
    """Rates changed: move the pending landing event, and tell HiCache engines when their fetches now land."""
    model = links(state)
    if state.cfg.data_plane is DataPlane.HICACHE_LOADBACK:
        seen: set[int] = set()
        for flow in model.flows.values():
            payload = flow.payload
            if isinstance(payload, FetchRunFlow) and id(payload.group) not in seen:
                seen.add(id(payload.group))
                _tell_expected(state, payload.group)
    cap = state.profile.load_bandwidth
    touched = {n for f in model.flows.values() if f.kind is FlowKind.FETCH for n in (f.source, f.target)}
    for name in touched | model.loading_nodes:
        node = state.nodes.get(NodeId(name))
        if node is not None and node.engine is not None:
            node.engine.set_load_bandwidth(model.host_share(name, cap))
    model.loading_nodes = touched
    out: list[Command] = [Cancel(LINKS)]
    at = model.next_landing()
    if at is not None:
        out.append(Event(max(at, now), Priority.COMPLETION, lambda e: on_links(state, e), label="links", token=LINKS))
    return out


def _tell_expected(state: ClusterState, group: FetchGroup) -> None:
    model = links(state)
    ends = [model.expected_end(f.key) for f in group.flows if f.key in model.flows]
    known = [t for t in ends if t is not None]
    node = state.nodes[group.node]
    req = state.requests.get(group.request)
    if known and node.engine is not None and req is not None and req.attempt == group.attempt:
        node.engine.fetch_expected(group.request, max(known))


def on_links(state: ClusterState, event: Event) -> list[Command]:
    """Flows whose last byte arrived now: transfers are handed over, fetch runs complete after their latency."""
    now = event.time
    out: list[Command] = []
    for landed in links(state).land(now):
        if landed.at > now:
            out.append(Event(landed.at, Priority.COMPLETION, lambda e: _flow_done(state, e.payload, e.time),
                             label=f"landed {landed.flow.key}", payload=landed))
        else:
            out += _flow_done(state, landed, now)
    return out + _links_changed(state, now)


def _flow_done(state: ClusterState, landed: Landed, now: float) -> list[Command]:
    payload = landed.flow.payload
    if isinstance(payload, FetchRunFlow):
        return _fetch_run_done(state, payload, now)
    assert isinstance(payload, tuple)
    return transfer_landed(state, payload, now)


def _fetch_run_done(state: ClusterState, run: FetchRunFlow, now: float) -> list[Command]:
    """A fetch run landed: pages its source no longer holds in host memory never arrived (the source evicted
    them, or was relaunched, while the fetch ran)."""
    group = run.group
    source = state.nodes.get(run.peer)
    engine = source.engine if source is not None else None
    if engine is None or engine is not run.source_engine:
        missing = set(run.pages)
    else:
        held = engine.pool.l2.resident_set()
        missing = {p for p in run.pages if p not in held}
    if missing:
        group.failed |= missing
        state.stats.failed_fetches += 1
        state.stats.failed_fetch_tokens += len(missing) * state.profile.page_tokens
    group.outstanding -= 1
    if group.outstanding > 0:
        return []
    return fetch_done(state, group, now)


def fetch_done(state: ClusterState, group: FetchGroup, now: float) -> list[Command]:
    req = state.requests.get(group.request)
    node = state.nodes[group.node]
    if req is None or req.attempt != group.attempt or req.prefill_node != group.node or node.engine is None:
        return []
    effects = node.engine.fetch_completed(group.request, now, frozenset(group.failed))
    if group.failed and effects.applied:
        req.fetched = max(0, req.fetched - len(group.failed) * state.profile.page_tokens)
    absorb(state, group.node, effects.events)
    return start_fetches(state, node, effects.fetches, now) + kick(state, node, now)


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
    """The prefill node sends the request's prompt KV to its decode node over the links."""
    req.stage = Stage.TRANSFER
    model = links(state)
    nbytes = req.route.prompt_tokens * state.profile.kv_bytes_per_token
    payload = (req.id, req.attempt, req.decode_node)
    key = (FlowKind.TRANSFER, next(_flow_ids))
    model.start(key, FlowKind.TRANSFER, str(req.prefill_node), str(req.decode_node), nbytes, now, payload)
    state.stats.peak_transfers = max(state.stats.peak_transfers, model.peak_concurrency)
    return _links_changed(state, now)


def transfer_landed(state: ClusterState, payload: tuple[str, int, NodeId | None], now: float) -> list[Command]:
    rid, attempt, target_id = payload
    req = state.requests.get(rid)
    if req is None or req.attempt != attempt or req.decode_node != target_id or req.stage is not Stage.TRANSFER:
        return []
    assert target_id is not None  # a transfer starts once the decode node is bound
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
    settled = quiet.settle(state, target, now)
    effects = target.engine.submit_decode(dr, now)  # type: ignore[union-attr]  # it accepts decode: it has an engine
    absorb(state, target.id, effects.events)
    req.stage = Stage.DECODE
    apply_counts(state, state.core.decode_submitted(req, now))
    return settled + kick(state, target, now) if settled else kick(state, target, now)


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
