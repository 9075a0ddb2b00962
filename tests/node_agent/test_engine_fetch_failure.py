"""A peer fetch that fails is recomputed, never made up: the pages that did not arrive are not landed in host
memory, the prefill's reused prefix ends at the first of them (so it computes the rest and is charged for
it), and the pool's accounting holds (property-tested over which pages fail)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, RequestId, Tier
from evolving_infra.node_agent.engine import FetchRun, IterationKind

from tests.node_agent.test_engine_prefill import CHAIN, PAGE, engine, request


def fetched_prefill(failed: frozenset[PageHash]) -> tuple[int, float, frozenset[PageHash]]:
    """(cached tokens at the start, prefill iteration seconds, host pages once the fetch ended) for a 16-page
    fetch of a 24-page prompt."""
    e = engine()
    plan = (FetchRun(0, 16, frozenset({NodeId("peer")}), tuple(CHAIN[:24])),)
    effects = e.submit_prefill(request("r", 24 * PAGE + 10, plan), 0.0)
    assert effects.fetches
    assert e.fetch_completed(RequestId("r"), 0.5, failed).applied
    landed = e.resident(Tier.HOST)
    out = e.step(1.0)
    assert out.kind is IterationKind.PREFILL
    e.check_invariants()
    return out.prefills_started[0].cached_tokens, out.duration, landed


def test_failed_fetch_pages_are_recomputed_not_landed() -> None:
    whole, whole_s, host = fetched_prefill(frozenset())
    assert whole == 16 * PAGE and set(CHAIN[:16]) <= host
    cut, cut_s, host = fetched_prefill(frozenset({CHAIN[5], CHAIN[9]}))
    assert cut == 5 * PAGE  # the prefix ends at the first page that did not arrive
    assert CHAIN[5] not in host and CHAIN[9] not in host and CHAIN[4] in host  # only what arrived landed
    assert cut_s > whole_s  # 11 more pages computed, and charged
    none, _, _ = fetched_prefill(frozenset(CHAIN[:16]))
    assert none == 0


@settings(max_examples=50, deadline=None)
@given(st.sets(st.integers(0, 15)))
def test_any_set_of_failed_pages_keeps_the_pool_conserved(indices: set[int]) -> None:
    failed = frozenset(CHAIN[i] for i in indices)
    cached, _, _ = fetched_prefill(failed)
    first = min(indices, default=16)
    assert cached == first * PAGE
