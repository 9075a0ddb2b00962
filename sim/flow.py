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

from evolving_infra.core.itermodel import Work
from evolving_infra.core.types import BranchId, NodeId, Phase, RequestId
from evolving_infra.node_agent.engine import DecodeRequest, FetchRun, FetchStarted, PrefillRequest
from evolving_infra.router.fitting import UsageCounts
from evolving_infra.router.routing import FetchTiming, RouteRequest, RoutingDecision
from evolving_infra.sim.config import DecodeReservation, SimPrefillPolicy
from evolving_infra.sim.kernel import Cancel, Command, Event, Priority, StopRun
from evolving_infra.sim.pause import ProgramRecord
from evolving_infra.sim.records import RequestRecord
from evolving_infra.sim.replay import AgentFinished, AgentStarted, BranchEnded, Effect, IssueRequest
from evolving_infra.sim.state import ClusterState, SimNode, SimRequest, Stage, absorb, kick, push_counts
from evolving_infra.sim.views import decode_need, decode_view, kv_room_tokens, prefill_view

WAKE = "replayer-wake"


# -- replayer effects -------------------------------------------------------------------------------------
def react(state: ClusterState, effects: list[Effect], now: float) -> list[Command]:
    out: list[Command] = []
    for effect in effects:
        if isinstance(effect, IssueRequest):
            out += issue(state, effect, now)
        elif isinstance(effect, BranchEnded):
            state.branches.end(BranchId(effect.branch))
            state.router.on_branch_finished(BranchId(effect.branch), now)
            push_counts(state)
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
    pages = tuple(int(h) for h in state.content.prompt_pages(spec.id))
    context = state.content.context_pages(spec.id)
    pt = state.profile.page_tokens
    generated = tuple(int(h) for h in context[len(pages) : (spec.prompt_tokens + spec.output_tokens) // pt])
    version = state.branches.request(BranchId(spec.branch), pages).version
    route = RouteRequest(
        id=RequestId(spec.id),
        branch=BranchId(spec.branch),
        page_hashes=pages,  # type: ignore[arg-type]
        prompt_tokens=spec.prompt_tokens,
        output_tokens=spec.output_tokens,
        t_acc=state.profile.decode.t_acc,
        page_tokens=pt,
        parent_branch=BranchId(state.parents[spec.branch]) if spec.branch in state.parents else None,
    )
    req = SimRequest(spec, route, pages, generated, version, issued=effect.at, since=effect.since)  # type: ignore[arg-type]
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
    candidates = state.accepting(Phase.PREFILL)
    if not candidates:
        req.stage = Stage.HELD
        state.parked.append(req)
        return []
    match = state.directory.lookup(req.prompt_pages)
    views = [prefill_view(state, n, req, match, now) for n in candidates]
    decision: RoutingDecision = state.router.route(req.route, views, now)
    state.router.on_routed(req.route, decision, now)
    node = state.nodes[decision.node]
    view = next(v for v in views if v.node == node.id)
    req.prefill_node = node.id
    req.queued = now
    req.routed_cached = decision.cached_tokens
    req.routed_restore = max(0, decision.cached_tokens - view.own_gpu_pages * req.route.page_tokens)
    req.fetch = _fetch_plan(state, req, decision, view.fetch_sources or ())
    req.fetched = 0
    if BranchId(req.spec.branch) in state.branches:
        state.branches.place(BranchId(req.spec.branch), node.id, held=False)
        push_counts(state)
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
            target = state.nodes[req.decode_node]  # type: ignore[index]
            target.prealloc.append(req)
            req.stage = Stage.WAIT_RESERVATION
            return grant_reservations(state, target, now)
    return submit_prefill(state, req, now)


def _fetch_plan(state: ClusterState, req: SimRequest, decision: RoutingDecision, runs: tuple) -> tuple[FetchRun, ...]:
    """What the prefill node pulls from peers: the policy's plan, or the pool's whole reachable prefix when
    the policy does not move KV itself but the host memory is a shared pool."""
    pages = req.prompt_pages
    if decision.fetch_timing is not FetchTiming.NONE and decision.fetch_from:
        chosen = decision.fetch_from
    elif state.cfg.shared_pool and state.cfg.prefill_routing is not SimPrefillPolicy.TTFT:
        chosen = runs
    else:
        return ()
    return tuple(FetchRun(min(r.peers), tuple(pages[r.first_page : r.first_page + r.pages])) for r in chosen)


def submit_prefill(state: ClusterState, req: SimRequest, now: float) -> list[Command]:
    node = state.nodes[req.prefill_node]  # type: ignore[index]
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
    node.sent[req.id] = req
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
    nodes = state.accepting(Phase.DECODE)
    binding = state.binder.bind(req.route, [decode_view(n) for n in nodes], now)
    if binding.node is None:
        if req not in state.wait_bind:
            req_stage = req.stage
            state.wait_bind.append(req)
            state.stats.bind_waits += 1
            if req_stage is Stage.TRANSFER:
                req.stage = Stage.WAIT_BIND
        return []
    state.binder.on_bound(req.route, binding, now)
    target = state.nodes[binding.node]
    req.decode_node = target.id
    target.bound[req.id] = req
    if state.cfg.decode_reservation is DecodeReservation.AT_PREFILL_START:
        req.reserved = decode_need(req)
        target.reserved_tokens += req.reserved
    if BranchId(req.spec.branch) in state.branches:
        state.branches.place(BranchId(req.spec.branch), target.id, held=False)
        push_counts(state)
    if req.prefill_done:
        return start_transfer(state, req, now)
    return []


def unbind(state: ClusterState, req: SimRequest) -> None:
    if req.decode_node is None:
        return
    node = state.nodes[req.decode_node]
    node.bound.pop(req.id, None)
    if req in node.prealloc:
        node.prealloc.remove(req)
    node.reserved_tokens -= req.reserved
    req.reserved = 0
    req.decode_node = None


def grant_reservations(state: ClusterState, node: SimNode, now: float) -> list[Command]:
    """SGLang pre-allocation: reserve decode KV for waiting requests in order while the node has room."""
    out: list[Command] = []
    while node.prealloc:
        req = node.prealloc[0]
        need = decode_need(req)
        if kv_room_tokens(node) < need:
            state.stats.reservation_waits += 1
            break
        node.prealloc.popleft()
        req.reserved = need
        node.reserved_tokens += need
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
def on_prefill_started(state: ClusterState, node: SimNode, started, now: float) -> list[Command]:  # type: ignore[no-untyped-def]
    req = state.requests.get(started.request)
    if req is None:
        return []
    req.prefill_start = started.time
    req.cached = started.cached_tokens
    restored = min(started.restored_tokens, started.cached_tokens)
    node.usage = node.usage + UsageCounts.of_request(started.cached_tokens, restored)
    if node.fitter is not None and not node.fitter.frozen:
        node.fitter.observe_request(started.cached_tokens, restored)
    if state.recorder is not None and not state.collocated:
        work = Work(req.route.prompt_tokens - started.cached_tokens, started.cached_tokens, req.route.output_tokens,
                    req.route.t_acc)
        state.recorder.record_request(work, now)
    if started.local_decode or req.decode_node is not None:
        return []
    return bind(state, req, now)


def on_prefill_finished(state: ClusterState, node: SimNode, finished, now: float) -> list[Command]:  # type: ignore[no-untyped-def]
    req = state.requests.get(finished.request)
    node.sent.pop(finished.request, None)
    if req is None:
        return []
    req.prefill_done = True
    req.first_token = finished.time
    state.router.on_first_token(req.route.id, now)
    state.branches.confirm_held(BranchId(req.spec.branch), node.id, req.version)
    push_counts(state)
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
    target.bound.pop(rid, None)
    target.reserved_tokens -= req.reserved
    req.reserved = 0
    effects = target.engine.submit_decode(dr, now)  # type: ignore[union-attr]
    absorb(state, target.id, effects.events)
    target.decode_jobs[rid] = req
    req.stage = Stage.DECODE
    set_occupancy(state, state.decode_occupancy + 1, now)
    state.branches.confirm_held(BranchId(req.spec.branch), target.id, req.version)
    push_counts(state)
    return kick(state, target, now)


def set_occupancy(state: ClusterState, count: int, now: float) -> None:
    state.decode_occupancy = count
    if state.recorder is not None:
        state.recorder.record_decode_occupancy(count, now)


# -- completion -------------------------------------------------------------------------------------------
def on_decode_finished(state: ClusterState, node: SimNode, done, now: float) -> list[Command]:  # type: ignore[no-untyped-def]
    req = state.requests.pop(done.request, None)
    if req is None:
        return []
    if node.decode_jobs.pop(done.request, None) is not None:
        set_occupancy(state, state.decode_occupancy - 1, now)
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
    state.router.on_finished(req.route.id, now)
    program = state.programs.get(req.spec.agent)
    if program is not None:
        program.in_flight -= 1
    out = grant_reservations(state, node, now) + retry_waiting(state, now)
    out += react(state, state.replayer.completed(req.id, now), now)
    if state.replayer.done and not state.requests:
        out.append(StopRun("every agent of the trace finished"))
    return out
