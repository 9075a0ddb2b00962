"""Baseline prefill routers, one documented rule per test: SGLang gateway cache-aware, sticky sessions,
Dynamo KV router cost (and its memory-pool variant), round robin."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.pages import PageHash
from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.types import BranchId, NodeId, RequestId
from evolving_infra.router.routing.cache_aware import BalanceGate
from evolving_infra.router.routing import (
    CacheAwareRouter,
    CacheAwareSettings,
    DynamoKvRouter,
    DynamoKvSettings,
    DynamoLoads,
    FetchTiming,
    PrefillNodeView,
    PrefillPolicyName,
    RoundRobinRouter,
    RouteReason,
    RouteRequest,
    RoutingDecision,
    StickyRouter,
)

PAGE = 64
_ids = iter(range(10**9))


def request(pages: int, prefix: int = 1, branch: str = "b", parent: str | None = None, extra: int = 0) -> RouteRequest:
    """A prompt of `pages` full pages (plus `extra` tokens) whose page hashes start with family `prefix`."""
    return RouteRequest(
        id=RequestId(f"r{next(_ids)}"),
        branch=BranchId(branch),
        page_hashes=tuple(PageHash(prefix * 1_000_000 + i) for i in range(pages)),
        prompt_tokens=pages * PAGE + extra,
        output_tokens=50,
        parent_branch=BranchId(parent) if parent else None,
    )


def views(*names: str) -> list[PrefillNodeView]:
    return [PrefillNodeView(NodeId(n)) for n in names]


def send(router: object, req: RouteRequest, node: str, now: float = 0.0) -> None:
    """Tell `router` that `req` was sent to `node` (as the router service does after routing)."""
    decision = RoutingDecision(NodeId(node), PrefillPolicyName.ROUND_ROBIN, RouteReason.ROUND_ROBIN, 0, 1)
    router.on_routed(req, decision, now)  # type: ignore[attr-defined]


def load(router: object, node: str, n: int) -> None:
    for _ in range(n):
        send(router, request(1, prefix=999_999), node)


# --- SGLang gateway, cache-aware -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("load_a", "load_b", "expected", "reason"),
    [
        # (max - min) = 70 > 64 and 100 > 1.5 x 30: imbalanced -> least loaded, despite A's full match
        (100, 30, "p-b", RouteReason.IMBALANCED_LEAST_LOADED),
        # difference 64 is not > 64: balanced -> cache match on A
        (64, 0, "p-a", RouteReason.CACHE_MATCH),
        # difference 65 > 64 but 210 <= 1.5 x 145: balanced -> cache match on A
        (210, 145, "p-a", RouteReason.CACHE_MATCH),
        # both conditions hold with the loaded node being the holder
        (65, 0, "p-b", RouteReason.IMBALANCED_LEAST_LOADED),
    ],
)
def test_cache_aware_imbalance_needs_both_thresholds(
    load_a: int, load_b: int, expected: str, reason: RouteReason
) -> None:
    router = CacheAwareRouter(CacheAwareSettings(gate=BalanceGate.GLOBAL))  # the classic rule
    send(router, request(20), "p-a")
    load(router, "p-a", load_a - 1)
    load(router, "p-b", load_b)
    decision = router.route(request(20), views("p-a", "p-b"), now=1.0)
    assert (decision.node, decision.reason) == (expected, reason)
    assert decision.score_of(NodeId("p-a")).terms["load"] == load_a


@pytest.mark.parametrize(
    ("matched_pages", "expected", "reason"),
    [
        (3, "p-b", RouteReason.LOW_MATCH_LEAST_LOADED),  # 192 / 640 = 0.30, not > 0.3
        (4, "p-a", RouteReason.CACHE_MATCH),  # 256 / 640 = 0.40 > 0.3
    ],
)
def test_cache_aware_follows_a_match_only_above_the_cache_threshold(
    matched_pages: int, expected: str, reason: RouteReason
) -> None:
    router = CacheAwareRouter()
    send(router, request(matched_pages, prefix=7), "p-a")
    load(router, "p-a", 3)
    load(router, "p-b", 1)  # p-b is least loaded; loads are balanced
    decision = router.route(request(10, prefix=7), views("p-a", "p-b"), now=1.0)
    assert (decision.node, decision.reason) == (expected, reason)


def test_cache_aware_is_not_load_aware_among_workers_holding_the_longest_match() -> None:
    router = CacheAwareRouter(CacheAwareSettings(gate=BalanceGate.GLOBAL))
    send(router, request(30, prefix=5), "p-a", now=1.0)
    send(router, request(30, prefix=5), "p-b", now=2.0)  # p-b used the prefix last
    load(router, "p-b", 50)  # 51 vs 1: balanced (difference <= 64)
    decision = router.route(request(30, prefix=5), views("p-a", "p-b", "p-c"), now=3.0)
    assert (decision.node, decision.reason) == ("p-b", RouteReason.CACHE_MATCH)
    # a longer match elsewhere wins regardless of recency
    send(router, request(40, prefix=5), "p-c", now=4.0)
    send(router, request(30, prefix=5), "p-b", now=5.0)
    assert router.route(request(40, prefix=5), views("p-a", "p-b", "p-c"), now=6.0).node == "p-c"


def test_cache_aware_moves_no_kv_and_counts_loads_until_finished() -> None:
    router = CacheAwareRouter()
    req = request(10, prefix=3)
    send(router, req, "p-a")
    view = PrefillNodeView(NodeId("p-a"), own_gpu_pages=4, cluster_prefix_pages=9, fetch_pages=5)
    decision = router.route(request(10, prefix=3), [view, PrefillNodeView(NodeId("p-b"))], now=1.0)
    assert decision.node == "p-a" and decision.fetch_tokens == 0 and decision.fetch_timing is FetchTiming.NONE
    assert (decision.cached_tokens, decision.recompute_tokens) == (4 * PAGE, 5 * PAGE)
    assert router.loads.load(NodeId("p-a")) == 1
    router.on_finished(req.id, now=2.0)
    assert router.loads.load(NodeId("p-a")) == 0


def test_cache_aware_evicts_lru_leaves_every_120_s_down_to_max_tree_size() -> None:
    # 10 pages of 64 tokens x 4 characters = 2,560 characters per worker at most
    router = CacheAwareRouter(CacheAwareSettings(max_tree_size=10 * PAGE * 4))
    send(router, request(8, prefix=1), "p-a", now=10.0)  # older chain
    send(router, request(8, prefix=2), "p-a", now=20.0)  # newer chain: 16 pages in all
    assert router.tree.size_pages(NodeId("p-a")) == 16
    send(router, request(1, prefix=3), "p-b", now=119.0)  # before the first eviction tick
    assert router.tree.size_pages(NodeId("p-a")) == 16
    router.on_finished(RequestId("nobody"), now=120.0)
    assert router.tree.size_pages(NodeId("p-a")) == 10
    assert router.tree.match(NodeId("p-a"), request(8, prefix=1).page_hashes) == 2  # leaves of the old chain went
    assert router.tree.match(NodeId("p-a"), request(8, prefix=2).page_hashes) == 8
    assert router.tick(200.0) == 0  # next tick is at 240 s


# --- sticky sessions -----------------------------------------------------------------------------------


def test_sticky_keeps_a_branch_on_its_node_and_places_new_branches_on_the_least_loaded() -> None:
    router = StickyRouter()
    nodes = views("p-a", "p-b", "p-c")
    load(router, "p-a", 2)
    load(router, "p-b", 1)
    load(router, "p-c", 1)
    first = router.route(request(5, branch="x"), nodes, now=0.0)
    assert (first.node, first.reason) == ("p-b", RouteReason.STICKY_FIRST_LEAST_LOADED)  # tie -> smaller id
    send(router, request(5, branch="x"), first.node)
    load(router, "p-b", 10)
    again = router.route(request(6, branch="x"), nodes, now=1.0)
    assert (again.node, again.reason) == ("p-b", RouteReason.STICKY)
    fork = router.route(request(6, branch="y", parent="x"), nodes, now=1.0)
    assert (fork.node, fork.reason) == ("p-b", RouteReason.STICKY_INHERITED)
    # the pinned node left the prefill pool: placed again
    moved = router.route(request(6, branch="x"), views("p-a", "p-c"), now=2.0)
    assert (moved.node, moved.reason) == ("p-c", RouteReason.STICKY_FIRST_LEAST_LOADED)
    router.on_branch_finished(BranchId("x"), now=3.0)
    assert router.pinned(BranchId("x")) is None


# --- Dynamo KV router ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "host", "disk", "charged", "decode_only", "expected_cost"),
    [
        # raw = 0 + 10; credit = 0: cost 10
        (0, 0, 0, 0, 0, 10.0),
        # raw = 20 + 10; credit = 4 x 1.0 + 2 x 0.75 + 4 x 0.25 = 6.5; adjusted 23.5; decode 20 -> 43.5
        (4, 2, 4, 2, 0, 43.5),
        # one request past its first token: on an aggregated worker no longer charged to prefill, still decode
        # blocks (on a disaggregated prefill worker it is gone: see the charges test)
        (4, 2, 4, 1, 1, 10 + 10 - 6.5 + 20),
        # full GPU prefix: credit 10 -> adjusted 0
        (10, 0, 0, 0, 0, 0.0),
    ],
)
def test_dynamo_cost_formula_in_the_papers_reading(
    gpu: int, host: int, disk: int, charged: int, decode_only: int, expected_cost: float
) -> None:
    """`loads=prompt-blocks` (shared/baselines.md, the paper's A.3): whole prompts charged, credit off the sum."""
    router = DynamoKvRouter(DynamoKvSettings(disaggregated=False, loads=DynamoLoads.PROMPT_BLOCKS))
    for _ in range(charged):
        send(router, request(10, prefix=9), "p-a")
    for _ in range(decode_only):
        r = request(10, prefix=9)
        send(router, r, "p-a")
        router.on_first_token(r.id, now=0.0)
    view = PrefillNodeView(NodeId("p-a"), own_gpu_pages=gpu, own_host_pages=host, own_disk_pages=disk,
                           cluster_prefix_pages=gpu + host + disk)
    cost = router.cost(request(10), view)
    assert cost.cost == pytest.approx(expected_cost)
    assert cost.credit == pytest.approx(1.0 * gpu + 0.75 * host + 0.25 * disk)


def test_dynamo_lowest_cost_wins_and_the_node_recomputes_what_it_lacks() -> None:
    router = DynamoKvRouter()
    for _ in range(3):
        send(router, request(10), "p-a")  # sent without a credit: each computes its 10 blocks there
    holder = PrefillNodeView(NodeId("p-a"), own_gpu_pages=10, cluster_prefix_pages=10)
    empty = PrefillNodeView(NodeId("p-b"), cluster_prefix_pages=10, fetch_pages=10)
    decision = router.route(request(10, extra=5), [holder, empty], now=0.0)
    # p-a: prefill 30 charged + (11 prompt blocks - 10 credit) = 31; decode: the 10 pages the three share, once,
    # and the request's 10 full pages are among them -> 41. p-b: 11 + 10 new pages = 21.
    assert decision.node == "p-b" and decision.reason is RouteReason.LOWEST_KV_COST
    assert decision.score_of(NodeId("p-a")).score == pytest.approx(41.0)
    assert decision.score_of(NodeId("p-b")).score == pytest.approx(21.0)
    assert (decision.fetch_tokens, decision.recompute_tokens, decision.fetch_timing) == (0, 10 * PAGE, FetchTiming.NONE)


def test_dynamo_memory_pool_variant_fetches_at_prefill_start() -> None:
    router = DynamoKvRouter(DynamoKvSettings(with_memory_pool=True))
    runs = (FetchRun(0, 10, frozenset({NodeId("p-a")})),)
    empty = PrefillNodeView(NodeId("p-b"), cluster_prefix_pages=10, fetch_pages=10, fetch_sources=runs)
    decision = router.route(request(10, extra=5), [empty], now=0.0)
    assert router.name is PrefillPolicyName.DYNAMO_KV_POOL and decision.policy is PrefillPolicyName.DYNAMO_KV_POOL
    assert (decision.fetch_tokens, decision.recompute_tokens) == (10 * PAGE, 0)
    assert decision.fetch_timing is FetchTiming.AT_PREFILL_START and decision.fetch_from == runs


def test_dynamo_ties_go_to_the_smallest_cached_tree_then_a_seeded_random_choice() -> None:
    small = PrefillNodeView(NodeId("p-z"), cached_pages=10)
    big = PrefillNodeView(NodeId("p-a"), cached_pages=500)
    assert DynamoKvRouter().route(request(5), [big, small], now=0.0).node == "p-z"
    same = [PrefillNodeView(NodeId(n), cached_pages=10) for n in ("p-a", "p-b", "p-c")]
    picks = {DynamoKvRouter(rng=random.Random(seed)).route(request(5), same, now=0.0).node for seed in range(30)}
    assert picks == {"p-a", "p-b", "p-c"}
    again = [DynamoKvRouter(rng=random.Random(7)).route(request(5), same, now=0.0).node for _ in range(3)]
    assert len(set(again)) == 1


@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30), st.integers(0, 5)),
             min_size=1, max_size=5),
    st.integers(1, 60),
    st.floats(0, 1), st.floats(0, 1), st.floats(0, 1),
)
def test_dynamo_adjusted_cost_is_never_negative(
    specs: list[tuple[int, int, int, int]], pages: int, gpu_c: float, host_c: float, disk_c: float
) -> None:
    router = DynamoKvRouter(DynamoKvSettings(gpu_credit=gpu_c, host_credit=host_c, disk_credit=disk_c))
    nodes = []
    for i, (gpu, host, disk, inflight) in enumerate(specs):
        gpu = min(gpu, pages)
        host = min(host, pages - gpu)
        disk = min(disk, pages - gpu - host)
        nodes.append(PrefillNodeView(NodeId(f"p{i}"), own_gpu_pages=gpu, own_host_pages=host, own_disk_pages=disk,
                                     cluster_prefix_pages=gpu + host + disk))
        for _ in range(inflight):
            send(router, request(3, prefix=8), f"p{i}")
    req = request(pages)
    for view in nodes:
        cost = router.cost(req, view)
        assert cost.adjusted_prefill >= 0 and cost.cost >= 0
        assert cost.adjusted_prefill >= cost.raw_prefill - cost.credit - 1e-9
    decision = router.route(req, nodes, now=0.0)
    assert decision.score_of(decision.node).score == min(s.score for s in decision.diagnostics)


@pytest.mark.parametrize(("loads", "idle_cost"), [(DynamoLoads.PROMPT_BLOCKS, 4.0), (DynamoLoads.DYNAMO, 8.0)])
def test_dynamo_charges_follow_first_token_and_finish(loads: DynamoLoads, idle_cost: float) -> None:
    router = DynamoKvRouter(DynamoKvSettings(disaggregated=False, loads=loads))  # an aggregated worker decodes it too
    r = request(10)
    send(router, r, "p-a")
    view = PrefillNodeView(NodeId("p-a"))
    # request(4) shares its 4 pages with r: with Dynamo's loads they are already active (decode 10 + 0 new)
    assert (router.cost(request(4), view).charged_prefill, router.cost(request(4), view).decode_blocks) == (10, 10)
    router.on_first_token(r.id, now=1.0)
    router.on_first_token(r.id, now=1.5)  # repeated report: no double release
    assert (router.cost(request(4), view).charged_prefill, router.cost(request(4), view).decode_blocks) == (0, 10)
    router.on_finished(r.id, now=2.0)
    assert router.cost(request(4), view).cost == idle_cost  # 4 prefill blocks (+ its own 4 pages with Dynamo's)


def test_dynamo_loads_count_shared_pages_once_and_charge_only_what_is_computed() -> None:
    """As Dynamo's router keeps its loads (module docstring): a worker's decode load is its distinct active
    pages plus the request's pages not among them, and a routed request charges prefill with the blocks it
    computes there (prompt blocks less the credit it was routed with)."""
    router = DynamoKvRouter()
    for _ in range(2):
        send(router, request(10, prefix=1), "p-a")  # same ten pages twice
    view = PrefillNodeView(NodeId("p-a"))
    other = request(5, prefix=2)
    assert router.cost(other, view).decode_blocks == 10 + 5
    assert DynamoKvRouter(DynamoKvSettings(loads=DynamoLoads.PROMPT_BLOCKS)).cost(other, view).decode_blocks == 0
    fresh = DynamoKvRouter()
    holder = PrefillNodeView(NodeId("p-h"), own_gpu_pages=8, own_host_pages=2, cluster_prefix_pages=10)
    r = request(10, prefix=3, extra=5)  # 11 prompt blocks, credit 8 + 1.5
    decision = fresh.route(r, [holder], now=0.0)
    fresh.on_routed(r, decision, now=0.0)
    assert fresh.cost(request(1, prefix=4), PrefillNodeView(NodeId("p-h"))).charged_prefill == pytest.approx(1.5)
    fresh.on_first_token(r.id, now=1.0)  # disaggregated: gone from the prefill worker
    assert fresh.cost(request(1, prefix=4), PrefillNodeView(NodeId("p-h"))).cost == pytest.approx(2.0)


@given(st.lists(st.tuples(st.sampled_from(["route", "first", "finish"]), st.integers(0, 5), st.integers(0, 2),
                          st.integers(1, 6), st.booleans()), max_size=40))  # fmt: skip
def test_dynamo_active_pages_are_the_distinct_pages_of_the_active_requests(
    steps: list[tuple[str, int, int, int, bool]],
) -> None:
    """Against a plain recount: after any order of routing, first tokens and finishes (repeats included), each
    worker's decode load is the number of distinct full pages of its active requests, its prefill charge the
    prompt blocks of those still prefilling; everything returns to zero when all are done."""
    for disaggregated in (True, False):
        router = DynamoKvRouter(DynamoKvSettings(disaggregated=disaggregated))
        reqs: list[tuple[RouteRequest, str]] = []
        prefilling: set[int] = set()
        active: set[int] = set()
        for op, key, node_i, pages, fam in steps:
            node = f"p{node_i}"
            if op == "route":
                r = request(pages, prefix=1 + int(fam))
                reqs.append((r, node))
                send(router, r, node)
                prefilling.add(len(reqs) - 1)
                active.add(len(reqs) - 1)
                continue
            if not reqs:
                continue
            key %= len(reqs)
            if op == "first":
                router.on_first_token(reqs[key][0].id, now=0.0)
                prefilling.discard(key)
                if disaggregated:
                    active.discard(key)
            else:
                router.on_finished(reqs[key][0].id, now=0.0)
                prefilling.discard(key)
                active.discard(key)
        probe = request(1, prefix=99)
        for node in ("p0", "p1", "p2"):
            pages = {h for k in active if reqs[k][1] == node for h in reqs[k][0].page_hashes}
            blocks = sum(len(reqs[k][0].page_hashes) for k in prefilling if reqs[k][1] == node)
            cost = router.cost(probe, PrefillNodeView(NodeId(node)))
            assert (cost.decode_blocks, cost.charged_prefill) == (len(pages) + 1, pytest.approx(blocks))
        for r, _ in reqs:
            router.on_finished(r.id, now=1.0)
        assert not router._active and not router._prefill and not router._decode  # noqa: SLF001


def test_dynamo_disaggregated_prefill_worker_is_free_of_a_request_at_its_first_token() -> None:
    """Judged by Dynamo's own replay (docs/peers.md): in disaggregated mode the prefill worker's request ends
    with its prefill, so its blocks stop counting there (prefill and decode charge alike)."""
    router = DynamoKvRouter()
    r = request(10)
    send(router, r, "p-a")
    view = PrefillNodeView(NodeId("p-a"))
    assert router.cost(request(4), view).cost == 24.0  # 10 charged + 4 new + 10 active pages (its 4 among them)
    router.on_first_token(r.id, now=1.0)
    assert router.cost(request(4), view).cost == 8.0  # 4 new + its own 4 pages
    router.on_finished(r.id, now=2.0)  # finishing later on a decode node releases nothing twice
    assert router.cost(request(4), view).cost == 8.0


# --- round robin ---------------------------------------------------------------------------------------


def test_round_robin_cycles_in_node_order_and_survives_pool_changes() -> None:
    router = RoundRobinRouter()
    picks = []
    nodes = views("p-c", "p-a", "p-b")
    for _ in range(4):
        req = request(2)
        decision = router.route(req, nodes, now=0.0)
        router.on_routed(req, decision, now=0.0)
        picks.append(decision.node)
    assert picks == ["p-a", "p-b", "p-c", "p-a"]
    assert router.route(request(2), views("p-a", "p-c"), now=0.0).node == "p-c"  # p-b left: next after p-a
    assert router.route(request(2), views("p-a"), now=0.0).node == "p-a"


def test_dynamo_pool_credit_is_off_by_default_and_credits_pool_pages_when_set() -> None:
    view = PrefillNodeView(NodeId("p-a"), own_gpu_pages=2, cluster_prefix_pages=10, fetch_pages=8)
    plain = DynamoKvRouter(DynamoKvSettings(with_memory_pool=True))
    assert plain.credit(view) == pytest.approx(2.0)
    credited = DynamoKvRouter(DynamoKvSettings(with_memory_pool=True, pool_credit=0.25))
    assert credited.credit(view) == pytest.approx(2.0 + 0.25 * 8)
    assert DynamoKvRouter(DynamoKvSettings(pool_credit=0.25)).credit(view) == pytest.approx(2.0)  # no pool


@pytest.mark.parametrize(
    ("loads", "holder_spills"),
    [
        ([0, 7, 0], True),  # mean 2.33, margin max(4, 2 sqrt 2.33 = 3.1) = 4: 7 > 6.33 and 7 > 3.5
        ([0, 6, 1], False),  # 6 is not > 2.33 + 4
        ([60, 100, 60], False),  # mean 73.3, margin 2 sqrt 73.3 = 17.1: 100 > 90.4 but not > 1.5 x 73.3 = 110
        ([10, 200, 10], True),  # 200 > 73.3 + 17.1 and 200 > 110
        ([0, 70, 0], True),  # the margin never exceeds balance_abs_threshold (64) nor falls under 4
    ],
)
def test_cache_aware_spill_gate(loads: list[int], holder_spills: bool) -> None:
    """smg 1.13: a matched worker is skipped when its load exceeds the mean by the capped margin and the
    relative threshold; then the least loaded wins, ties to the fewest requests sent, then view order."""
    router = CacheAwareRouter()
    prompt = request(20, prefix=4)
    send(router, prompt, "p-b")
    for node, n in zip(("p-a", "p-b", "p-c"), loads, strict=True):
        load(router, node, n - (node == "p-b"))
    assert router.spills(loads[1], loads) is holder_spills
    decision = router.route(request(20, prefix=4), views("p-a", "p-b", "p-c"), now=1.0)
    if holder_spills:
        low = min(loads[0], loads[2])
        tied = [n for n, x in (("p-a", loads[0]), ("p-c", loads[2])) if x == low]
        expected = min(tied, key=lambda n: (router.processed[NodeId(n)], n))
        assert (decision.node, decision.reason) == (expected, RouteReason.IMBALANCED_LEAST_LOADED)
    else:
        assert (decision.node, decision.reason) == ("p-b", RouteReason.CACHE_MATCH)


def test_cache_aware_spill_least_loaded_ties_go_to_fewest_sent() -> None:
    router = CacheAwareRouter()
    req = request(5, prefix=8)
    send(router, req, "p-a")
    router.on_finished(req.id, now=0.5)  # p-a: load 0 again, but one request sent
    decision = router.route(request(3, prefix=9), views("p-a", "p-b"), now=1.0)
    assert (decision.node, decision.reason) == ("p-b", RouteReason.LOW_MATCH_LEAST_LOADED)
    classic = CacheAwareRouter(CacheAwareSettings(gate=BalanceGate.GLOBAL))
    send(classic, req, "p-a")
    classic.on_finished(req.id, now=0.5)
    assert classic.route(request(3, prefix=9), views("p-a", "p-b"), now=1.0).node == "p-a"  # smallest id
