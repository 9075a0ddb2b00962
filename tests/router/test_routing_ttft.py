"""Ours: shortest predicted TTFT (eq. 7 with the exposed fetch and the copy price), and the queue replay."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.itermodel import PrefillCoefficients, PrefillItem
from evolving_infra.core.pages import PageHash
from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.types import BranchId, NodeId, RequestId, Work
from evolving_infra.router.routing import (
    CoefficientPrefillModel,
    FetchTiming,
    PrefillNodeView,
    QueuedPrefill,
    ReplayJob,
    RouteReason,
    RouteRequest,
    RunningPrefill,
    StateSource,
    TtftRouter,
    TtftSettings,
    WaitModel,
    append_job,
    estimate_ttft,
    replay_chunked_prefill,
)

PAGE = 64
COEF = PrefillCoefficients(c0=0.02, c1=2e-5, c2=1e-10, c3=1e-6)
MODEL = CoefficientPrefillModel(COEF, t_bar=8192.0, f_restore=0.5)


def request(prompt_tokens: int, pages: int | None = None, rid: str = "r") -> RouteRequest:
    n = prompt_tokens // PAGE if pages is None else pages
    return RouteRequest(
        id=RequestId(rid),
        branch=BranchId("b"),
        page_hashes=tuple(PageHash(i + 1) for i in range(n)),
        prompt_tokens=prompt_tokens,
        output_tokens=100,
    )


def view(node: str, **kw: object) -> PrefillNodeView:
    kw.setdefault("state_age_s", 0.1)
    kw.setdefault("model", MODEL)
    return PrefillNodeView(node=NodeId(node), **kw)  # type: ignore[arg-type]


def queued(rid: str, t_uc: int, t_c: int = 0) -> QueuedPrefill:
    return QueuedPrefill(RequestId(rid), Work(t_uc=t_uc, t_c=t_c, t_out=10))


# --- the replay -------------------------------------------------------------------------------------


def test_replay_matches_a_hand_computed_chunked_schedule() -> None:
    """Budget 1,000: iteration 1 = rest of the running request + the head of A; iteration 2 = the rest of
    A, all of B and the new request N, which therefore share one iteration."""
    coef = PrefillCoefficients(c0=0.1, c1=1e-4, c2=1e-8, c3=1e-3)
    model = CoefficientPrefillModel(coef)
    jobs = [
        ReplayJob(RequestId("R0"), remaining_tokens=300, context_tokens=500),
        ReplayJob(RequestId("A"), remaining_tokens=900, context_tokens=0, restore_tokens=10),
        ReplayJob(RequestId("B"), remaining_tokens=600, context_tokens=200),
        ReplayJob(RequestId("N"), remaining_tokens=100, context_tokens=0),
    ]
    result = replay_chunked_prefill(model, jobs, chunk_tokens=1000, keep_iterations=True)

    # by hand: A = t_uc*t_c + t_uc(t_uc+1)/2 per item
    it1_pairs = (300 * 500 + 300 * 301 // 2) + (700 * 0 + 700 * 701 // 2)
    it1 = 0.1 + 1e-4 * 1000 + 1e-8 * it1_pairs + 1e-3 * 10  # A restores 10 tokens on its first chunk
    it2_pairs = (200 * 700 + 200 * 201 // 2) + (600 * 200 + 600 * 601 // 2) + (100 * 101 // 2)
    it2 = 0.1 + 1e-4 * 900 + 1e-8 * it2_pairs

    assert [it.items for it in result.iterations] == [
        (PrefillItem(300, 500), PrefillItem(700, 0, 10)),
        (PrefillItem(200, 700), PrefillItem(600, 200), PrefillItem(100, 0)),
    ]
    timing = {t.request: (t.start, t.finish) for t in result.timings}
    assert timing[RequestId("R0")] == pytest.approx((0.0, it1))
    assert timing[RequestId("A")] == pytest.approx((0.0, it1 + it2))
    assert timing[RequestId("B")] == pytest.approx((it1, it1 + it2))
    assert timing[RequestId("N")] == pytest.approx((it1, it1 + it2))
    assert result.last.service == pytest.approx(it2)


def test_wait_and_service_of_a_request_come_from_the_replay() -> None:
    coef = PrefillCoefficients(c0=0.1, c1=1e-4, c2=0.0, c3=0.0)
    v = view("p0", model=CoefficientPrefillModel(coef), running=(RunningPrefill(RequestId("R0"), 300, 500),),
             queue=(queued("A", 900),), unreported=(queued("B", 600, 200),))
    est = estimate_ttft(request(100, pages=0), v, TtftSettings(chunk_tokens=1000))
    assert est.state is StateSource.REPORTED
    assert est.wait == pytest.approx(0.1 + 0.1)  # iteration 1: 1,000 tokens
    assert est.service == pytest.approx(0.1 + 1e-4 * 900)  # iteration 2: 200 + 600 + 100 tokens


@given(
    st.lists(st.tuples(st.integers(1, 20_000), st.integers(0, 50_000), st.integers(0, 500)), min_size=1, max_size=8),
    st.integers(16, 10_000),
)
def test_replay_keeps_budget_order_and_token_totals(specs: list[tuple[int, int, int]], chunk: int) -> None:
    jobs = [ReplayJob(RequestId(f"j{i}"), uc, c, r) for i, (uc, c, r) in enumerate(specs)]
    result = replay_chunked_prefill(MODEL, jobs, chunk, keep_iterations=True)
    assert [t.request for t in result.timings] == [j.request for j in jobs]
    assert all(sum(i.t_uc for i in it.items) <= chunk for it in result.iterations)
    assert sum(i.t_uc for it in result.iterations for i in it.items) == sum(j.remaining_tokens for j in jobs)
    assert sum(i.t_rst for it in result.iterations for i in it.items) == sum(j.restore_tokens for j in jobs)
    for before, after in zip(result.timings, result.timings[1:], strict=False):
        assert before.start <= after.start and before.finish <= after.finish
    clock = 0.0
    for it in result.iterations:
        assert it.start == pytest.approx(clock)
        clock += it.duration
    assert result.last.finish == pytest.approx(clock)


@given(
    st.lists(st.tuples(st.integers(1, 20_000), st.integers(0, 50_000), st.integers(0, 500)), min_size=1, max_size=8),
    st.integers(16, 10_000),
)
def test_appending_to_a_replayed_backlog_equals_replaying_everything(
    specs: list[tuple[int, int, int]], chunk: int
) -> None:
    jobs = [ReplayJob(RequestId(f"j{i}"), uc, c, r) for i, (uc, c, r) in enumerate(specs)]
    backlog = replay_chunked_prefill(MODEL, jobs[:-1], chunk).backlog
    appended = append_job(MODEL, backlog, jobs[-1])
    full = replay_chunked_prefill(MODEL, jobs, chunk).last
    assert appended.request == full.request
    assert appended.start == pytest.approx(full.start, abs=1e-12)
    assert appended.finish == pytest.approx(full.finish, abs=1e-12)


@given(
    st.lists(st.lists(st.integers(1, 30_000), max_size=4), min_size=2, max_size=6),
    st.lists(st.sampled_from([None, 1.0, 9.0]), min_size=6, max_size=6),
)
def test_the_backlog_memo_never_changes_a_decision(queues: list[list[int]], ages: list[float | None]) -> None:
    """A sequence of decisions over changing node states: memoized and fresh routers agree every time."""
    memo, fresh = TtftRouter(), TtftRouter(memoize_backlogs=False)
    r = request(20_000)
    for step in range(len(queues)):
        nodes = [
            view(f"p{i}", queue=tuple(queued(f"q{i}-{j}", t) for j, t in enumerate(queues[(step + i) % len(queues)])),
                 state_age_s=ages[(step + i) % len(ages)], own_gpu_pages=10 * i, cluster_prefix_pages=40,
                 fetch_pages=40 - 10 * i, router_in_flight=(queued(f"s{i}", 5_000 * (step + 1)),))
            for i in range(3)
        ]
        assert memo.route(r, nodes, now=float(step)) == fresh.route(r, nodes, now=float(step))


@given(
    st.lists(st.integers(1, 30_000), max_size=6),
    st.integers(1, 30_000),
    st.integers(1, 30_000),
    st.integers(0, 6),
)
def test_one_more_queued_request_never_brings_the_predicted_finish_forward(
    queue: list[int], extra: int, prompt: int, position: int
) -> None:
    base = [queued(f"q{i}", t) for i, t in enumerate(queue)]
    grown = list(base)
    grown.insert(min(position, len(base)), queued("extra", extra))
    r = request(prompt, pages=0)
    settings = TtftSettings()
    before = estimate_ttft(r, view("p", queue=tuple(base)), settings)
    after = estimate_ttft(r, view("p", queue=tuple(grown)), settings)
    # Finish = c0 x iterations + c1 x tokens + c2 x pairs, each non-decreasing in the backlog (a job's
    # pairs do not depend on how it is chunked). The start alone may move earlier by a hair: the added
    # job can push the tail of an earlier one into the new request's iteration.
    assert after.wait + after.service >= before.wait + before.service - 1e-12


# --- the choice -------------------------------------------------------------------------------------

PROMPT = 64_000  # 1,000 pages
CACHED_PAGES = 900  # 57,600 tokens of prefix


def holder_and_idle(holder_queue: tuple[QueuedPrefill, ...]) -> list[PrefillNodeView]:
    """p-holder holds the prefix in GPU memory; p-idle holds nothing and would fetch it from p-holder."""
    runs = (FetchRun(0, CACHED_PAGES, frozenset({NodeId("p-holder")})),)
    return [
        view("p-holder", own_gpu_pages=CACHED_PAGES, cluster_prefix_pages=CACHED_PAGES, queue=holder_queue),
        view("p-idle", cluster_prefix_pages=CACHED_PAGES, fetch_pages=CACHED_PAGES, fetch_sources=runs),
    ]


def test_routes_away_from_the_prefix_holder_when_its_queue_outweighs_the_exposed_fetch() -> None:
    busy = tuple(queued(f"q{i}", 30_000) for i in range(4))  # several seconds of prefill
    decision = TtftRouter().route(request(PROMPT), holder_and_idle(busy), now=0.0)
    assert decision.node == "p-idle"
    assert decision.reason is RouteReason.LOWEST_PREDICTED_TTFT
    x = CACHED_PAGES * PAGE
    assert (decision.fetch_tokens, decision.recompute_tokens) == (x, 0)
    assert decision.fetch_timing is FetchTiming.WHILE_QUEUED
    assert decision.fetch_from == (FetchRun(0, CACHED_PAGES, frozenset({NodeId("p-holder")})),)
    idle = decision.score_of(NodeId("p-idle")).terms
    assert idle["wait"] == 0.0
    assert idle["exposed_fetch"] == pytest.approx(0.45 + 1e-6 * x)
    assert idle["copy_price"] == pytest.approx(1e-6 * x)
    holder = decision.score_of(NodeId("p-holder")).terms
    assert holder["wait"] > idle["exposed_fetch"] + idle["copy_price"]
    assert holder["x"] == 0.0 and holder["exposed_fetch"] == 0.0


def test_routes_to_the_prefix_holder_when_its_queue_is_shorter_than_the_exposed_fetch() -> None:
    light = (queued("q0", 2_000),)
    decision = TtftRouter().route(request(PROMPT), holder_and_idle(light), now=0.0)
    assert decision.node == "p-holder"
    assert (decision.fetch_tokens, decision.recompute_tokens) == (0, 0)
    assert decision.cached_tokens == CACHED_PAGES * PAGE
    assert decision.uncached_tokens == PROMPT - CACHED_PAGES * PAGE
    assert decision.fetch_timing is FetchTiming.NONE and decision.fetch_from is None


def test_a_fetch_hidden_by_the_wait_costs_only_its_copy_price() -> None:
    settings = TtftSettings()
    r = request(PROMPT)
    v = view("p", cluster_prefix_pages=CACHED_PAGES, fetch_pages=CACHED_PAGES,
             queue=tuple(queued(f"q{i}", 30_000) for i in range(4)))
    est = estimate_ttft(r, v, settings)
    assert est.wait > settings.fetch_time(est.fetch_tokens)
    assert est.exposed_fetch == 0.0
    assert est.total == pytest.approx(est.wait + est.service + 1e-6 * est.fetch_tokens)


FREE_FETCH = TtftSettings(fetch_fixed_s=0.0, fetch_per_token_s=0.0, copy_price_s_per_token=0.0)
NO_RESTORE_MODEL = CoefficientPrefillModel(PrefillCoefficients(c0=0.02, c1=2e-5, c2=1e-10, c3=0.0))


@pytest.mark.parametrize(
    ("views", "expected"),
    [
        # equal predicted TTFT: the node with the prefix in its own memory wins, even with the larger id
        (
            [("p-b", dict(own_gpu_pages=0, fetch_pages=100)), ("p-z", dict(own_gpu_pages=100))],
            "p-z",
        ),
        # host memory counts as own memory
        (
            [("p-b", dict(own_gpu_pages=10, fetch_pages=90)), ("p-z", dict(own_gpu_pages=10, own_host_pages=90))],
            "p-z",
        ),
        # same own prefix: the smaller node id
        ([("p-c", dict(own_gpu_pages=100)), ("p-a", dict(own_gpu_pages=100))], "p-a"),
    ],
)
def test_ties_go_to_the_longest_own_prefix_then_node_id(views: list[tuple[str, dict[str, int]]], expected: str) -> None:
    nodes = [view(n, cluster_prefix_pages=100, model=NO_RESTORE_MODEL, **kw) for n, kw in views]
    decision = TtftRouter(FREE_FETCH).route(request(100 * PAGE + 10), nodes, now=0.0)
    totals = {s.node: s.score for s in decision.diagnostics}
    assert len(set(totals.values())) == 1
    assert decision.node == expected


def test_no_fetch_below_the_minimum_the_node_recomputes_past_its_own_run() -> None:
    r = request(20 * PAGE + 5)
    # holds pages 0-9, pages 10-16 only elsewhere: 7 pages = 448 tokens < 512
    v = view("p", own_gpu_pages=10, cluster_prefix_pages=17, fetch_pages=7)
    decision = TtftRouter().route(r, [v], now=0.0)
    assert decision.fetch_tokens == 0 and decision.fetch_timing is FetchTiming.NONE
    assert decision.cached_tokens == 10 * PAGE
    assert decision.recompute_tokens == 7 * PAGE
    assert decision.uncached_tokens == r.prompt_tokens - 10 * PAGE
    # 8 pages = 512 tokens: fetched
    v = view("p", own_gpu_pages=10, cluster_prefix_pages=18, fetch_pages=8)
    decision = TtftRouter().route(r, [v], now=0.0)
    assert (decision.fetch_tokens, decision.cached_tokens, decision.recompute_tokens) == (8 * PAGE, 18 * PAGE, 0)


def test_the_last_prompt_token_is_always_computed() -> None:
    r = request(10 * PAGE)
    est = estimate_ttft(r, view("p", own_gpu_pages=10, cluster_prefix_pages=10), TtftSettings())
    assert (est.cached_tokens, est.uncached_tokens) == (10 * PAGE - 1, 1)


def test_restored_tokens_are_the_cached_prefix_outside_gpu_memory() -> None:
    r = request(100 * PAGE)
    est = estimate_ttft(
        r, view("p", own_gpu_pages=20, own_host_pages=30, cluster_prefix_pages=90, fetch_pages=40), TtftSettings()
    )
    assert est.restore_tokens == (90 - 20) * PAGE


@pytest.mark.parametrize(
    ("age", "source", "wait_positive"),
    [(0.0, StateSource.REPORTED, False), (5.0, StateSource.REPORTED, False),
     (5.01, StateSource.ROUTER_RECORD, True), (None, StateSource.ROUTER_RECORD, True)],
)
def test_a_state_older_than_5_s_is_replaced_by_the_routers_own_record(
    age: float | None, source: StateSource, wait_positive: bool
) -> None:
    # the report says the node is idle; the router's record says it sent it two requests
    v = view("p", state_age_s=age, router_in_flight=(queued("s0", 20_000), queued("s1", 20_000)))
    est = estimate_ttft(request(1000), v, TtftSettings())
    assert est.state is source
    assert (est.wait > 0) is wait_positive


def test_sum_of_service_times_wait_model_adds_eq3_times() -> None:
    v = view("p", running=(RunningPrefill(RequestId("R"), 1000, 4000),), queue=(queued("q", 3000, 500),))
    r = request(2000, pages=0)
    est = estimate_ttft(r, v, TtftSettings(wait_model=WaitModel.SUM_OF_SERVICE_TIMES))
    expected_wait = MODEL.prefill_request_time(Work(1000, 4000, 0)) + MODEL.prefill_request_time(Work(3000, 500, 0))
    assert est.wait == pytest.approx(expected_wait)
    assert est.service == pytest.approx(MODEL.prefill_request_time(Work(2000, 0, 100)))


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="no node model"):
        TtftRouter().route(request(1000), [PrefillNodeView(NodeId("p"), state_age_s=0.0)], now=0.0)
    with pytest.raises(ValueError, match="no prefill node"):
        TtftRouter().route(request(1000), [], now=0.0)
    with pytest.raises(ValueError, match="appears twice"):
        TtftRouter().route(request(1000), [view("p"), view("p")], now=0.0)
    with pytest.raises(ValueError, match="longer than request"):
        TtftRouter().route(request(1000, pages=2), [view("p", own_gpu_pages=5, cluster_prefix_pages=5)], now=0.0)
    with pytest.raises(ValueError, match="fetch_pages"):
        view("p", own_gpu_pages=5, cluster_prefix_pages=6, fetch_pages=2)
    with pytest.raises(ValueError, match="chunk_tokens"):
        TtftSettings(chunk_tokens=0)


# --- the invariant ----------------------------------------------------------------------------------

node_spec = st.tuples(
    st.integers(0, 40),  # own gpu pages
    st.integers(0, 40),  # own host pages
    st.integers(0, 60),  # more pages held only elsewhere
    st.lists(st.integers(1, 40_000), max_size=4),  # queue
    st.one_of(st.none(), st.floats(0, 10)),  # state age
    st.floats(0.0, 0.05),  # c0 (nodes differ)
)


@given(st.lists(node_spec, min_size=1, max_size=5), st.integers(1, 200), st.integers(1, 60))
def test_never_picks_a_node_whose_predicted_ttft_exceeds_anothers(
    specs: list[tuple[int, int, int, list[int], float | None, float]], prompt_pages: int, extra_tokens: int
) -> None:
    r = request(prompt_pages * PAGE + extra_tokens)
    nodes = []
    for i, (gpu, host, elsewhere, queue, age, c0) in enumerate(specs):
        gpu, host = min(gpu, prompt_pages), min(host, max(prompt_pages - gpu, 0))
        cluster = min(gpu + host + elsewhere, prompt_pages)
        model = CoefficientPrefillModel(PrefillCoefficients(c0=c0, c1=2e-5, c2=1e-10, c3=1e-6))
        nodes.append(view(f"p{i}", own_gpu_pages=gpu, own_host_pages=host, cluster_prefix_pages=cluster,
                          fetch_pages=cluster - gpu - host, state_age_s=age, model=model,
                          queue=tuple(queued(f"q{i}-{j}", t) for j, t in enumerate(queue)),
                          router_in_flight=tuple(queued(f"s{i}-{j}", t) for j, t in enumerate(queue[:1]))))
    router = TtftRouter()
    decision = router.route(r, nodes, now=0.0)
    totals = {s.node: s.score for s in decision.diagnostics}
    assert set(totals) == {v.node for v in nodes}
    assert all(totals[decision.node] <= t for t in totals.values())
    for s in decision.diagnostics:
        terms = s.terms
        assert terms["exposed_fetch"] >= 0 and terms["wait"] >= 0 and terms["service"] > 0
        assert math.isclose(s.score, terms["wait"] + terms["service"] + terms["exposed_fetch"] + terms["copy_price"])
    assert decision.cached_tokens + decision.uncached_tokens == r.prompt_tokens
    assert router.route(r, nodes, now=1.0) == decision  # stateless
