"""The pure router core: routing flow (views with unreported and in-flight requests, placement, fetch plan),
decode binding with reservations, handed-back re-routing, count pushes, planner observation and split changes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.kv_events import KvRemoved, KvStored
from evolving_infra.core.pages import chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Tier
from evolving_infra.router.core import CoreSettings, NodeTrack, PoolSnapshot, PushCounts, RoutedRequest, RouterCore
from evolving_infra.router.planner import Outcome, PlannerDecision, SwitchMode
from evolving_infra.router.routing import (
    PrefillNodeView,
    PrefillPolicyName,
    RouteReason,
    RouteRequest,
    RoutingDecision,
    make_decode_binder,
)
from evolving_infra.router.routing.base import RouterHooks, decision_without_fetch

PT = 64


class FirstNodeRouter(RouterHooks):
    """Picks the first view; records every call's views."""

    name = PrefillPolicyName.ROUND_ROBIN

    def __init__(self) -> None:
        self.seen: list[Sequence[PrefillNodeView]] = []

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        self.seen.append(nodes)
        return decision_without_fetch(request, nodes[0], self.name, RouteReason.ROUND_ROBIN)


def make_core(phases: dict[str, Phase], shared_pool: bool = True) -> tuple[RouterCore, FirstNodeRouter]:
    tracks = {}
    for n, phase in phases.items():
        tracks[NodeId(n)] = NodeTrack(NodeId(n), phase, mode=NodeMode.of(phase), pool=PoolSnapshot(PT, l1_free=1000))
    router = FirstNodeRouter()
    core = RouterCore(tracks, router=router, binder=make_decode_binder("fewest-requests", random.Random(0)),  # type: ignore[arg-type]
                      settings=CoreSettings(shared_pool=shared_pool))
    return core, router


def request(core: RouterCore, rid: str, branch: str, pages: int, name: str = "p") -> RoutedRequest:
    hashes = tuple(chain_hashes(f"{name}:{i}".encode() for i in range(pages)))
    route = RouteRequest(RequestId(rid), BranchId(branch), hashes, pages * PT + 5, 10, page_tokens=PT)
    return RoutedRequest(route, hashes, core.admit(BranchId(branch), hashes))


def held(core: RouterCore, pushes: list[PushCounts]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for p in pushes:
        out.setdefault(p.node, {}).update(p.counts)
    return out


def test_route_places_the_branch_and_views_carry_the_unreported_and_in_flight_requests() -> None:
    core, router = make_core({"p0": Phase.PREFILL, "p1": Phase.PREFILL, "d0": Phase.DECODE})
    a = request(core, "a", "b1", 4)
    routed = core.route(a, 0.0)
    assert routed is not None and routed.node == "p0" and a.prefill_node == "p0"
    assert [p.node for p in routed.counts] == ["p0"] and set(routed.counts[0].counts.values()) == {1}
    assert [v.node for v in router.seen[0]] == ["p0", "p1"]  # the decode node is no candidate
    core.prefill_sent(a)
    b = request(core, "b", "b2", 2, "q")
    core.route(b, 1.0)
    p0_view = router.seen[1][0]
    assert [q.request for q in p0_view.unreported] == ["a"] and [q.request for q in p0_view.router_in_flight] == ["a"]
    assert p0_view.state_age_s is None  # never reported
    core.nodes[NodeId("p0")].record_report(1.5, (), ("a",))
    core.route(b, 2.0)
    view = router.seen[2][0]
    assert view.unreported == () and [q.request for q in view.queue] == ["a"] and view.state_age_s == 0.5


def test_the_pool_fetches_the_reachable_prefix_only_with_a_shared_pool() -> None:
    for shared, expected in ((True, 3), (False, 0)):
        core, _ = make_core({"p0": Phase.PREFILL, "p1": Phase.PREFILL, "d0": Phase.DECODE}, shared_pool=shared)
        a = request(core, "a", "b1", 3)
        core.absorb([KvStored(NodeId("p1"), Tier.HOST, None, a.prompt_pages, 0.0)])
        routed = core.route(a, 0.0)
        assert routed is not None and routed.node == "p0"
        assert sum(len(r.pages) for r in routed.fetch) == expected
        assert all(r.peer == "p1" for r in routed.fetch)
        send = core.prefill_sent(a)
        assert (send.node, send.request, send.fetch) == ("p0", "a", routed.fetch)


def test_binding_reserves_kv_and_the_handover_releases_it() -> None:
    core, _ = make_core({"p0": Phase.PREFILL, "d0": Phase.DECODE, "d1": Phase.DECODE})
    a = request(core, "a", "b1", 4)
    core.route(a, 0.0)
    core.prefill_sent(a)
    core.prefill_started(NodeId("p0"), a, 0, 0, 0.1)
    bound = core.bind(a, 0.1)
    target = core.nodes[bound.node]  # type: ignore[index]
    assert a.reserved == a.route.prompt_tokens + a.route.output_tokens == target.reserved_tokens
    assert bound.counts and bound.counts[0].node == bound.node
    core.prefill_finished(NodeId("p0"), "a", a, 0.2)
    core.decode_handover(a)
    assert target.reserved_tokens == 0 and not target.bound
    core.decode_submitted(a, 0.3)
    assert core.decode_occupancy == 1 and "a" in target.decode_jobs
    core.decode_finished(target.id, a, 0.4)
    assert core.decode_occupancy == 0 and not target.decode_jobs and not core.nodes[NodeId("p0")].sent


def test_a_switching_node_gets_no_new_work_and_its_handed_back_requests_go_elsewhere() -> None:
    core, _ = make_core({"p0": Phase.PREFILL, "p1": Phase.PREFILL, "d0": Phase.DECODE})
    a = request(core, "a", "b1", 2)
    core.route(a, 0.0)
    core.prefill_sent(a)
    assert a.prefill_node == "p0"
    decision = PlannerDecision({"p0": Phase.DECODE, "p1": Phase.PREFILL, "d0": Phase.DECODE}, SwitchMode.IN_PLACE,
                               Outcome.SWITCH, "t", None)  # type: ignore[arg-type]
    change = core.split_change(decision)
    assert change is not None and [(s.node, s.phase) for s in change.switches] == [("p0", Phase.DECODE)]
    core.switch_begun(NodeId("p0"), Phase.DECODE)
    assert core.split_change(decision).switches == ()  # type: ignore[union-attr]
    obs = core.observation(1.0)
    assert obs.nodes["p0"].switching and obs.nodes["p0"].phase is Phase.DECODE and obs.nodes["p0"].move_cost == 1.0
    assert obs.load["p0"].queued_prefill_tokens == a.route.prompt_tokens
    core.release_prefill(a)
    assert a.attempt == 1 and a.prefill_node is None and not core.nodes[NodeId("p0")].sent
    again = core.route(a, 1.0)
    assert again is not None and again.node == "p1"
    core.switch_completed(NodeId("p0"), Phase.DECODE, 2.0)
    assert core.nodes[NodeId("p0")].phase is Phase.DECODE and core.split_now() == (1, 2)


def test_the_observation_carries_the_active_contexts_and_node_sizes_once_sizes_are_set() -> None:
    core, _ = make_core({"p0": Phase.PREFILL, "d0": Phase.DECODE})
    assert core.observation(0.0).active_kv_pages is None and not core.observation(0.0).kv_pages  # (sizes unknown)
    core.settings = CoreSettings(node_kv_pages=500)
    a = request(core, "a", "b1", 4)
    request(core, "b", "b2", 6, "q")  # a context of its own
    c = RoutedRequest(a.route, a.prompt_pages, core.admit(BranchId("b3"), a.prompt_pages))  # b1's prefix again
    assert c.prompt_pages == a.prompt_pages
    obs = core.observation(1.0)
    assert obs.active_kv_pages == 10 and dict(obs.kv_pages) == {"p0": 500, "d0": 500}  # shared pages count once
    core.end_branch(BranchId("b2"), 2.0)
    assert core.observation(2.0).active_kv_pages == 4


def test_route_passes_over_the_excluded_nodes_while_another_accepts_prefill() -> None:
    core, router = make_core({"p0": Phase.PREFILL, "p1": Phase.PREFILL, "p2": Phase.PREFILL, "d0": Phase.DECODE})
    a = request(core, "a", "b1", 2)
    first = core.route(a, 0.0)
    assert first is not None and first.node == "p0"  # the policy picks the first candidate
    core.release_prefill(a)
    again = core.route(a, 1.0, exclude=frozenset({NodeId("p0")}))  # p0 refused the request's prefill
    assert again is not None and again.node == "p1" and a.prefill_node == "p1"
    assert [v.node for v in router.seen[1]] == ["p1", "p2"]
    core.release_prefill(a)
    third = core.route(a, 2.0, exclude=frozenset({NodeId("p0"), NodeId("p1"), NodeId("d0")}))
    assert third is not None and third.node == "p2" and [v.node for v in router.seen[2]] == ["p2"]


def test_route_falls_back_to_every_candidate_when_each_is_excluded() -> None:
    core, router = make_core({"p0": Phase.PREFILL, "p1": Phase.PREFILL, "d0": Phase.DECODE})
    a = request(core, "a", "b1", 2)
    routed = core.route(a, 0.0, exclude=frozenset({NodeId("p0"), NodeId("p1")}))
    assert routed is not None and routed.node == "p0" and [v.node for v in router.seen[0]] == ["p0", "p1"]
    core.switch_begun(NodeId("p0"), Phase.DECODE)
    core.switch_begun(NodeId("p1"), Phase.DECODE)
    assert core.route(a, 1.0, exclude=frozenset({NodeId("p0")})) is None  # an exclusion never adds a candidate


def test_branch_end_and_host_evictions_release_counts_and_a_cleared_node_leaves_the_directory() -> None:
    core, _ = make_core({"p0": Phase.PREFILL, "d0": Phase.DECODE})
    a = request(core, "a", "b1", 3)
    routed = core.route(a, 0.0)
    assert routed is not None
    assert core.absorb([]) == []
    evicted = core.absorb([KvRemoved(NodeId("p0"), Tier.HOST, a.prompt_pages[2:], 1.0)])
    assert held(core, evicted) == {"p0": {a.prompt_pages[2]: 0}}
    assert held(core, core.end_branch(BranchId("b1"), 2.0)) == {"p0": {p: 0 for p in a.prompt_pages[:2]}}
    core.absorb([KvStored(NodeId("p0"), Tier.HOST, None, a.prompt_pages, 3.0)])
    core.clear_node(NodeId("p0"), 4.0)
    assert core.directory.held_count(NodeId("p0"), Tier.HOST) == 0


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.booleans()), min_size=1, max_size=25))
def test_every_count_change_is_pushed_once_to_the_node_it_is_on(ops: list[tuple[int, int, bool]]) -> None:
    core, _ = make_core({"p0": Phase.PREFILL, "p1": Phase.PREFILL, "d0": Phase.DECODE})
    mirror: dict[str, dict[int, int]] = {}
    pushes: list[PushCounts] = []
    for i, (branch, pages, end) in enumerate(ops):
        if end:
            pushes += core.end_branch(BranchId(f"b{branch}"), float(i))
            continue
        req = request(core, f"r{i}", f"b{branch}", pages, f"b{branch}")
        routed = core.route(req, float(i))
        assert routed is not None
        pushes += routed.counts
        bound = core.bind(req, float(i))
        pushes += bound.counts
    pushes += core.take_counts()
    for p in pushes:
        mirror.setdefault(p.node, {}).update(p.counts)
    for node in core.nodes:
        expected = core.branches.counts_for(node)
        got: dict[Any, int] = {k: v for k, v in mirror.get(node, {}).items() if v}
        assert got == expected
    assert core.take_counts() == []


def test_take_counts_visits_the_changed_nodes_in_node_order_and_each_change_once() -> None:
    core, _ = make_core({"p2": Phase.PREFILL, "p1": Phase.PREFILL, "d1": Phase.DECODE})
    req = request(core, "r1", "b1", 5)
    for node in ("p1", "d1", "p2"):  # counted on three nodes, changed in another order than the nodes'
        core.branches.place(req.branch, NodeId(node), held=False)
    core.branches.set_phase(NodeId("x"), Phase.PREFILL)  # a node the table knows and the core does not
    core.branches.place(req.branch, NodeId("x"), held=False)
    pushes = core.take_counts()
    assert [p.node for p in pushes] == ["p2", "p1", "d1"]
    assert all(dict(p.counts) == dict.fromkeys(req.prompt_pages, 1) for p in pushes)
    assert core.take_counts() == []
    core.add_node(NodeTrack(NodeId("x"), Phase.PREFILL, mode=NodeMode.PREFILL), Phase.PREFILL)
    assert [p.node for p in core.take_counts()] == ["x"]  # kept until its node joined


def test_accepts_is_serves_of_the_mode_and_of_the_switch_target() -> None:
    from itertools import product

    from evolving_infra.router.core.tracking import serves

    for mode, target, phase in product([None, *NodeMode], [None, *NodeMode], Phase):
        track = NodeTrack(NodeId("n"), Phase.PREFILL, mode=mode)
        track.target = target
        expected = mode is not None and serves(mode, phase) and (target is None or serves(target, phase))
        assert track.accepts(phase) is expected, (mode, target, phase)


def test_the_planners_prefill_work_follows_the_cached_tokens_the_prefill_node_reused() -> None:
    """A request arrives with its whole prefix cached in the pool; while it waits, the prefix is evicted and its
    prefill node computes it all: the slice's mean uncached tokens are what the node computed, once per request
    (a re-started prefill corrects nothing again)."""
    from evolving_infra.router.planner import WindowConfig

    core, _ = make_core({"p0": Phase.PREFILL, "p1": Phase.PREFILL, "d0": Phase.DECODE})
    core.start_window(WindowConfig(window_s=600, slices=10), 0.0)
    a = request(core, "a", "b1", 8)
    core.absorb([KvStored(NodeId("p0"), Tier.HOST, None, a.prompt_pages, 0.0)])
    routed = core.route(a, 1.0)
    assert routed is not None and routed.node == "p0" and a.recorded_cached == 8 * PT
    core.prefill_sent(a)
    core.prefill_started(NodeId("p0"), a, 0, 0, 70.0)  # the prefix was evicted: nothing reused
    core.prefill_started(NodeId("p0"), a, 0, 0, 71.0)
    assert core.recorder is not None
    first, second = core.recorder.completed(130.0)
    assert (first.requests, first.sum_t_uc, first.measured) == (1, 5, 0)
    assert (second.requests, second.measured, second.correction_t_uc) == (0, 1, 8 * PT)
    merged = first.merge(second)
    assert (merged.sum_t_uc + merged.correction_t_uc, merged.sum_t_c + merged.correction_t_c) == (8 * PT + 5, 0)
