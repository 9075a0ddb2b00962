"""The TTFT policy priced per node in closed form and with the kept backlogs, against the full queue replay.

- `extend_backlog` is bit-identical to replaying the longer queue; `BacklogStore` answers what a fresh replay
  answers whatever the sequence of state changes.
- `append_columns` equals `append_job` within the documented `APPEND_BOUND`; so does it on the rows `row_after`
  computes in closed form from the jobs (their integer fields equal the replayed summary's).
- `TtftRouter.route` over a `PrefillViewSet` (closed form, then exact re-pricing of the close nodes) chooses
  what the replay of every node's whole queue chooses, on random node states.
- `PrefixMatch.columns` equals the per-node lookups and fetch plans.
"""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evolving_infra.core.itermodel import PrefillCoefficients
from evolving_infra.core.kv_events import KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, RequestId, Tier, Work
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router import prefix_match
from evolving_infra.router.prefix_match import bits_of
from evolving_infra.router.routing import (
    CoefficientPrefillModel,
    PrefillNodeView,
    QueuedPrefill,
    ReplayJob,
    RouteRequest,
    RunningPrefill,
    TtftRouter,
    TtftSettings,
    append_job,
    replay_chunked_prefill,
)
from evolving_infra.router.routing.backlogs import APPEND_BOUND, BacklogStore, _row, append_columns, row_after
from evolving_infra.router.routing.inputs import StaticViews
from evolving_infra.router.routing.queue_replay import extend_backlog
from evolving_infra.router.routing.ttft import _parts_jobs, _queued_job, _state_parts, backlog_jobs, state_source

PAGE = 64

coefficients = st.builds(
    PrefillCoefficients,
    c0=st.floats(0.0, 0.1),
    c1=st.floats(0.0, 1e-4),
    c2=st.floats(0.0, 1e-9),
    c3=st.floats(0.0, 1e-5),
)
job_specs = st.lists(st.tuples(st.integers(1, 40_000), st.integers(0, 200_000), st.integers(0, 5_000)), max_size=8)


def jobs_of(specs: list[tuple[int, int, int]], tag: str = "j") -> list[ReplayJob]:
    return [ReplayJob(RequestId(f"{tag}{i}"), uc, c, r) for i, (uc, c, r) in enumerate(specs)]


@given(coefficients, job_specs, job_specs, st.integers(16, 16_384))
def test_extending_a_backlog_is_bit_identical_to_replaying_the_longer_queue(
    coef: PrefillCoefficients, first: list[tuple[int, int, int]], more: list[tuple[int, int, int]], chunk: int
) -> None:
    model = CoefficientPrefillModel(coef)
    jobs, extra = jobs_of(first, "a"), jobs_of(more, "b")
    backlog = replay_chunked_prefill(model, jobs, chunk).backlog
    for job in extra:
        backlog = extend_backlog(model, backlog, job)
    assert backlog == replay_chunked_prefill(model, jobs + extra, chunk).backlog


@given(coefficients, job_specs, st.lists(st.tuples(st.integers(1, 300_000), st.integers(0, 300_000)), min_size=1,
                                          max_size=6), st.integers(16, 16_384))  # fmt: skip
def test_closed_form_append_is_within_the_bound_of_the_replay(
    coef: PrefillCoefficients, specs: list[tuple[int, int, int]], new: list[tuple[int, int]], chunk: int
) -> None:
    model = CoefficientPrefillModel(coef)
    backlog = replay_chunked_prefill(model, jobs_of(specs), chunk).backlog
    row = _row(model, backlog)
    assert row is not None
    uncached = np.array([uc for uc, _ in new], np.int64)
    context = np.array([c for _, c in new], np.int64)
    restore = context // 3
    start, finish = append_columns(np.array([row] * len(new)), uncached, context, restore, chunk)
    ints = np.array([row[6:]] * len(new), np.int64)  # the integer fields given apart (as the kept rows do)
    assert all(map(np.array_equal, (start, finish), append_columns(np.array([row] * len(new)), uncached, context,
                                                                   restore, chunk, ints)))  # fmt: skip
    for k, (uc, c) in enumerate(new):
        exact = append_job(model, backlog, ReplayJob(RequestId("n"), uc, c, c // 3))
        assert start[k] == exact.start
        assert abs(finish[k] - exact.finish) <= APPEND_BOUND * (1.0 + abs(exact.finish))


def assert_rows_agree(got: tuple[float, ...], replayed: tuple[float, ...]) -> None:
    """A closed-form row against the replayed summary's: the integer fields equal, the times within the bound."""
    assert got[:4] == replayed[:4] and got[6:] == replayed[6:]
    for k in (4, 5):
        assert abs(got[k] - replayed[k]) <= APPEND_BOUND * (1.0 + abs(replayed[k]))


long_job_lists = st.lists(st.tuples(st.integers(1, 40_000), st.integers(0, 200_000), st.integers(0, 5_000)),
                          max_size=60)  # fmt: skip


@given(coefficients, long_job_lists, job_specs, st.integers(16, 16_384), st.integers(0, 60))
def test_closed_form_rows_agree_with_the_replay(
    coef: PrefillCoefficients, first: list[tuple[int, int, int]], more: list[tuple[int, int, int]], chunk: int,
    cut: int,
) -> None:  # fmt: skip
    """`row_after` from nothing equals the replayed summary's row; so does one extended in closed form from a
    replayed row, or from a closed-form row, by more jobs (the store's three ways to a row)."""
    model = CoefficientPrefillModel(coef)
    jobs, extra = jobs_of(first, "a"), jobs_of(more, "b")
    replayed = _row(model, replay_chunked_prefill(model, jobs, chunk).backlog)
    assert replayed is not None
    assert_rows_agree(row_after(coef, None, jobs, chunk), replayed)
    longer = _row(model, replay_chunked_prefill(model, jobs + extra, chunk).backlog)
    assert longer is not None
    assert_rows_agree(row_after(coef, replayed, extra, chunk), longer)
    cut = min(cut, len(jobs))
    assert_rows_agree(row_after(coef, row_after(coef, None, jobs[:cut], chunk), jobs[cut:] + extra, chunk), longer)


@given(coefficients, long_job_lists, st.lists(st.tuples(st.integers(1, 300_000), st.integers(0, 300_000)),
                                               min_size=1, max_size=6), st.integers(16, 16_384))  # fmt: skip
def test_closed_form_rows_price_within_the_bound_of_the_replay(
    coef: PrefillCoefficients, specs: list[tuple[int, int, int]], new: list[tuple[int, int]], chunk: int
) -> None:
    """`append_columns` on a row computed in closed form from the jobs prices within `APPEND_BOUND` of
    `append_job` on the replayed summary (the slack the router's exact re-pricing relies on)."""
    model = CoefficientPrefillModel(coef)
    backlog = replay_chunked_prefill(model, jobs_of(specs), chunk).backlog
    row = row_after(coef, None, jobs_of(specs), chunk)
    uncached = np.array([uc for uc, _ in new], np.int64)
    context = np.array([c for _, c in new], np.int64)
    restore = context // 3
    start, finish = append_columns(np.array([row] * len(new)), uncached, context, restore, chunk)
    for k, (uc, c) in enumerate(new):
        exact = append_job(model, backlog, ReplayJob(RequestId("n"), uc, c, c // 3))
        assert abs(start[k] - exact.start) <= APPEND_BOUND * (1.0 + abs(exact.start))
        assert abs(finish[k] - exact.finish) <= APPEND_BOUND * (1.0 + abs(exact.finish))


def queued(rid: str, t_uc: int, t_c: int) -> QueuedPrefill:
    return QueuedPrefill(RequestId(rid), Work(t_uc=t_uc, t_c=t_c, t_out=10), min(t_c, 100))


@given(st.lists(st.tuples(st.sampled_from(["send", "report", "stale", "model"]), st.integers(1, 20_000)),
                max_size=25))  # fmt: skip
def test_the_store_answers_what_a_fresh_replay_answers(steps: list[tuple[str, int]]) -> None:
    """A node's state changes (requests sent, reports replacing the queue, a stale report, a new model); after
    every change the store's backlog equals a fresh replay of the same state."""
    store = BacklogStore(2048, _parts_jobs, _queued_job)
    settings_ = TtftSettings(chunk_tokens=2048)
    model = CoefficientPrefillModel(PrefillCoefficients(0.01, 2e-5, 1e-10, 1e-6))
    running: tuple[RunningPrefill, ...] = ()
    queue: tuple[QueuedPrefill, ...] = ()
    unreported: tuple[QueuedPrefill, ...] = ()
    age: float | None = 0.1
    for k, (what, tokens) in enumerate(steps):
        if what == "send":
            unreported = (*unreported, queued(f"s{k}", tokens, tokens // 2))
        elif what == "report":
            running = (RunningPrefill(RequestId(f"r{k}"), tokens, 1000),)
            queue, unreported, age = unreported[:1], unreported[1:], 0.1
        elif what == "stale":
            age = 60.0
        else:
            model = CoefficientPrefillModel(PrefillCoefficients(0.01, tokens * 1e-9, 1e-10, 1e-6))
        view = PrefillNodeView(NodeId("p"), running=running, queue=queue, unreported=unreported,
                               router_in_flight=(*queue, *unreported), state_age_s=age, model=model)  # fmt: skip
        router = TtftRouter(settings_)
        router.backlogs = store
        replays = store.replays
        entry = store.entry(view.node, state_source(view, settings_), model, _state_parts(view, state_source(view, settings_)))
        fresh = replay_chunked_prefill(model, backlog_jobs(view, settings_), 2048).backlog
        row = _row(model, fresh)
        assert row is not None and entry.row is not None
        assert_rows_agree(entry.row, row)
        assert store.replays == replays  # a linear model's row needs no replay ...
        kept = router._backlog(view)
        assert kept == fresh  # ... and its summary, replayed when read, is the fresh replay's
        assert store.replays <= replays + 1


node_states = st.tuples(
    st.integers(0, 40),  # own GPU pages
    st.integers(0, 40),  # own host pages beyond them
    st.integers(0, 60),  # cluster pages beyond the own prefix
    st.lists(st.integers(1, 30_000), max_size=4),  # queued uncached tokens
    st.integers(0, 30_000),  # running remaining tokens (0: none)
    st.sampled_from([0.1, 2.0, None, 30.0]),  # report age (None: never reported)
    st.integers(0, 2),  # which model
)


@settings(max_examples=150, deadline=None)
@given(st.lists(node_states, min_size=2, max_size=12), st.integers(1, 150), st.integers(0, 63),
       st.sampled_from([0, 512, 4096]))  # fmt: skip
def test_routing_over_columns_chooses_what_the_full_replay_chooses(
    states: list[tuple[int, int, int, list[int], int, float | None, int]], prompt_pages: int, extra: int, min_fetch: int
) -> None:
    models = [
        CoefficientPrefillModel(PrefillCoefficients(0.02, 2e-5, 1e-10, 1e-6)),
        CoefficientPrefillModel(PrefillCoefficients(0.01, 3e-5, 2e-10, 0.0)),
        CoefficientPrefillModel(PrefillCoefficients(0.02, 2e-5, 1e-10, 1e-6)),  # equal to the first: ties
    ]
    req = RouteRequest(RequestId("new"), BranchId("b"), tuple(PageHash(i + 1) for i in range(prompt_pages)),
                       prompt_pages * PAGE + extra, 100, page_tokens=PAGE)  # fmt: skip
    views = []
    for n, (gpu, host, more, queue, running, age, m) in enumerate(states):
        gpu = min(gpu, prompt_pages)
        host = min(host, prompt_pages - gpu)
        cluster = min(prompt_pages, gpu + host + more)
        q = tuple(queued(f"q{n}.{k}", uc, 0) for k, uc in enumerate(queue))
        views.append(PrefillNodeView(
            NodeId(f"p{n:02d}"), own_gpu_pages=gpu, own_host_pages=host, cluster_prefix_pages=cluster,
            fetch_pages=cluster - gpu - host, queue=q[:1], unreported=q[1:], router_in_flight=q,
            running=(RunningPrefill(RequestId(f"run{n}"), running, 500),) if running else (),
            state_age_s=age, model=models[m],
        ))  # fmt: skip
    s = TtftSettings(min_fetch_tokens=min_fetch)
    replayed = TtftRouter(s, memoize_backlogs=False).route(req, views, 0.0)
    columns = TtftRouter(s).route(req, StaticViews(views), 0.0)
    assert columns.node == replayed.node
    assert (columns.cached_tokens, columns.uncached_tokens, columns.fetch_tokens, columns.recompute_tokens) == (
        replayed.cached_tokens, replayed.uncached_tokens, replayed.fetch_tokens, replayed.recompute_tokens)  # fmt: skip
    assert columns.score_of(columns.node) == replayed.score_of(replayed.node)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([Tier.GPU, Tier.HOST]), st.integers(0, 30),
                          st.integers(1, 30)), max_size=20), st.integers(1, 60))  # fmt: skip
@example([(0, Tier.HOST, 0, 10), (1, Tier.GPU, 10, 10), (2, Tier.GPU, 0, 14)], 30)  # pooled 10 < held 20
@example([(0, Tier.HOST, 0, 20), (1, Tier.GPU, 0, 5), (2, Tier.GPU, 3, 9)], 20)  # all pooled: fetch by one product
def test_prefix_columns_equal_the_per_node_lookups(
    stores: list[tuple[int, Tier, int, int]], prompt: int
) -> None:
    directory = KvDirectory()
    pages = [PageHash(i + 1) for i in range(80)]
    for node, tier, lo, length in stores:
        chunk = pages[lo : lo + length]
        directory.store(NodeId(f"n{node}"), tier, pages[lo - 1] if lo else None, chunk, 0.0)
    match = directory.lookup(pages[:prompt])
    nodes = [NodeId(f"n{k}") for k in range(7)]  # n6 is unknown to the directory
    gpu, either, reach, fetch = match.columns(nodes)
    with patch.object(prefix_match, "FEW_HOLDER_BITS", -1):  # the array passes over every node: the same columns
        assert all(map(np.array_equal, (gpu, either, reach, fetch), match.columns(nodes)))
    assert all(c.dtype == np.int64 for c in (gpu, either, reach, fetch))
    for k, node in enumerate(nodes):
        assert gpu[k] == match.gpu.get(node, 0)
        assert either[k] == match.either.get(node, 0)
        assert match.gpu_pages(node) == gpu[k] and match.either_pages(node) == either[k]
        assert fetch[k] == match.fetch_plan(node).fetch_pages
    fresh = directory.lookup(pages[:prompt])  # per node, before and after the mappings of all nodes are built
    assert [fresh.reachable_for(node) for node in nodes] == reach.tolist()
    assert fresh.reachable == match.reachable and [fresh.reachable_for(node) for node in nodes] == reach.tolist()


@given(st.integers(0, 2**330), st.lists(st.booleans(), min_size=1, max_size=110))
def test_bits_of_lists_the_set_bits_of_known_nodes_lowest_first(mask: int, known: list[bool]) -> None:
    ids = tuple(NodeId(f"n{i}") if k else None for i, k in enumerate(known))
    want = [(b, ids[b // 3]) for b in range(mask.bit_length()) if mask >> b & 1 and b // 3 < len(ids)
            and ids[b // 3] is not None]  # fmt: skip
    assert bits_of(mask, ids) == want
