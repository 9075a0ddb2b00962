"""The lazy content model hashes on demand and gives the eager model's hashes, whatever is asked first or
released, also while its trace grows agent by agent."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Relation, Trace
from evolving_infra.traces.testing import TraceShape, trace_records, traces
from evolving_infra.workloads import generate

from .agent_blocks import agent_blocks, flatten, growing

PAGE_SIZES = st.integers(1, 8)
DEEP = TraceShape(max_agents=3, max_steps=14, max_tokens=40)


def same_pages(lazy: ContentModel, eager: ContentModel, rid: str) -> None:
    assert np.array_equal(lazy.context_pages(rid), eager.context_pages(rid))
    assert np.array_equal(lazy.prompt_pages(rid), eager.prompt_pages(rid))
    assert np.array_equal(lazy.produced_pages(rid), eager.produced_pages(rid))
    assert np.array_equal(lazy.own_pages(rid), eager.own_pages(rid))


@given(trace=traces(DEEP), size=PAGE_SIZES, data=st.data())
def test_lazy_equals_eager_in_any_order_with_releases(trace: Trace, size: int, data: st.DataObject) -> None:
    eager = ContentModel(trace, size)
    lazy = ContentModel(trace, size, lazy=True, cache_size=data.draw(st.integers(0, 3)))
    assert lazy.held_requests() == 0 and lazy.hashed_requests == 0
    ids = [r.id for r in trace.requests]
    order = data.draw(st.permutations(ids))
    for rid in order:
        same_pages(lazy, eager, rid)
        if data.draw(st.booleans()):
            lazy.release(data.draw(st.lists(st.integers(0, len(ids) - 1), max_size=3)))
    assert lazy.held_requests() <= len(ids)


@given(trace=traces(DEEP), size=PAGE_SIZES)
def test_only_the_chain_asked_for_is_hashed(trace: Trace, size: int) -> None:
    """Asking for one request hashes it and at most its ancestors (its bases, down the chain)."""
    last = trace.requests[-1]
    chain = {last.index}
    base = last.base
    while base is not None:
        chain.add(trace.request(base).index)
        base = trace.request(base).base
    lazy = ContentModel(trace, size, lazy=True)
    lazy.context_pages(last.id)
    assert lazy.hashed_requests <= len(chain)
    held = {i for i in range(len(trace.requests)) if lazy._own[i] is not None}
    assert held <= chain
    assert (last.index in held) == (last.context_tokens // size > last.keep // size)


@settings(max_examples=30)
@given(records=trace_records(DEEP), size=PAGE_SIZES, data=st.data())
def test_lazy_over_a_growing_trace_equals_eager_over_the_whole(records: list[dict[str, Any]], size: int,
                                                               data: st.DataObject) -> None:  # fmt: skip
    head, blocks = agent_blocks(records)
    whole = trace_from_records(flatten(head, blocks))
    eager = ContentModel(whole, size)
    trace = growing(head, blocks)
    lazy = ContentModel(trace, size, lazy=True)
    for i in range(len(blocks)):
        agent = trace.agent_at(i)
        for r in data.draw(st.permutations(agent.requests)):
            same_pages(lazy, eager, r.id)
        if data.draw(st.booleans()):
            lazy.release(r.index for r in agent.requests)
    for r in whole.requests:  # released agents are hashed again, to the same values
        same_pages(lazy, eager, r.id)


@pytest.mark.parametrize("kind", ["cc", "osworld"])
def test_generated_workloads_lazy_equals_eager_backwards(kind: str) -> None:
    """Real forks, sub-agents and compactions (CC), screenshots dropped from the context (OSWorld), asked for
    from the last request back, with page sizes of the simulator."""
    trace = trace_from_records(generate(kind, 3, seed=5))
    relations = {r.relation for r in trace.requests}
    if kind == "cc":
        assert {Relation.FORK, Relation.SUB_AGENT, Relation.REWRITE} <= relations
    for size in (16, 64):
        eager = ContentModel(trace, size)
        lazy = ContentModel(trace, size, lazy=True, cache_size=4)
        for r in reversed(trace.requests):
            same_pages(lazy, eager, r.id)
        assert lazy.hashed_requests == len(trace.requests)
        assert lazy.memory_bytes() == eager.memory_bytes() - sum(a.nbytes for a in eager._cache.values()) + sum(
            a.nbytes for a in lazy._cache.values()
        )
