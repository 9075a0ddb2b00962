"""Dense page labels (`PageLabels.DENSE`) name pages as content hashes do: two pages get equal labels exactly when
they get equal hashes, whatever is asked first or released, while the trace grows, and on generated workloads with
forks, sub-agents and compactions; labels are consecutive per request and a pure function of the trace."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.traces.content import ContentModel, PageLabels
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Relation, Trace
from evolving_infra.traces.testing import TraceShape, trace_records, traces
from evolving_infra.workloads import generate

from .agent_blocks import agent_blocks, flatten, growing

PAGE_SIZES = st.integers(1, 8)
DEEP = TraceShape(max_agents=3, max_steps=14, max_tokens=40)
DENSE = PageLabels.DENSE


def pairs(hashed: ContentModel, dense: ContentModel, rid: str) -> list[tuple[int, int]]:
    """(hash, label) of every page of the request's context, checking that the four views agree in length."""
    out = []
    for view in ("context_pages", "prompt_pages", "produced_pages", "own_pages"):
        h, d = getattr(hashed, view)(rid), getattr(dense, view)(rid)
        assert len(h) == len(d) and d.dtype == np.uint64 and not d.flags.writeable
        out += zip(h.tolist(), d.tolist())
    return out


def assert_bijection(seen: list[tuple[int, int]]) -> None:
    """Every hash has one label and every label one hash."""
    by_hash: dict[int, int] = {}
    by_label: dict[int, int] = {}
    for h, d in seen:
        assert by_hash.setdefault(h, d) == d, f"hash {h:#x} has labels {by_hash[h]} and {d}"
        assert by_label.setdefault(d, h) == h, f"label {d} names hashes {by_label[d]:#x} and {h:#x}"


@given(trace=traces(DEEP), size=PAGE_SIZES, data=st.data())
def test_labels_and_hashes_name_the_same_pages_in_any_order_with_releases(trace: Trace, size: int,
                                                                          data: st.DataObject) -> None:  # fmt: skip
    hashed = ContentModel(trace, size)
    dense = ContentModel(trace, size, lazy=True, labels=DENSE, cache_size=data.draw(st.integers(0, 3)))
    whole = ContentModel(trace, size, labels=DENSE)  # eager: every request in file order
    ids = [r.id for r in trace.requests]
    seen: list[tuple[int, int]] = []
    for rid in data.draw(st.permutations(ids)):
        seen += pairs(hashed, dense, rid)
        assert np.array_equal(dense.context_pages(rid), whole.context_pages(rid))
        if data.draw(st.booleans()):
            dense.release(data.draw(st.lists(st.integers(0, len(ids) - 1), max_size=3)))
    assert_bijection(seen)
    labels = [d for _, d in seen]
    assert all(0 < d < 1 << 44 for d in labels)


@given(trace=traces(DEEP), size=PAGE_SIZES)
def test_labels_number_the_prefixes_then_each_requests_own_pages_in_file_order(trace: Trace, size: int) -> None:
    dense = ContentModel(trace, size, labels=DENSE)
    expected = 1
    for p in trace.prefixes.values():
        assert dense.prefix_pages(p.name).tolist() == list(range(expected, expected + p.tokens // size))
        expected += p.tokens // size
    for r in trace.requests:
        own = dense.own_pages(r.id).tolist()
        assert own == list(range(expected, expected + len(own)))
        assert len(own) == max(0, r.context_tokens // size - r.keep // size)
        expected += len(own)


@settings(max_examples=30)
@given(records=trace_records(DEEP), size=PAGE_SIZES, data=st.data())
def test_labels_over_a_growing_trace_equal_those_over_the_whole(records: list[dict[str, Any]], size: int,
                                                               data: st.DataObject) -> None:  # fmt: skip
    head, blocks = agent_blocks(records)
    whole = ContentModel(trace_from_records(flatten(head, blocks)), size, labels=DENSE)
    trace = growing(head, blocks)
    lazy = ContentModel(trace, size, lazy=True, labels=DENSE)
    for i in range(len(blocks)):
        agent = trace.agent_at(i)
        for r in data.draw(st.permutations(agent.requests)):
            assert np.array_equal(lazy.context_pages(r.id), whole.context_pages(r.id))
        if data.draw(st.booleans()):
            lazy.release(r.index for r in agent.requests)
    for r in trace.requests:  # released agents are labelled again, to the same values
        assert np.array_equal(lazy.context_pages(r.id), whole.context_pages(r.id))


@pytest.mark.parametrize("kind", ["cc", "osworld", "putnam"])
def test_generated_workloads_labels_and_hashes_name_the_same_pages(kind: str) -> None:
    """Real forks, sub-agents and compactions (CC), screenshots dropped from the context (OSWorld), shared
    problem prompts (Putnam), at the simulator's page sizes."""
    trace = trace_from_records(generate(kind, 3, seed=5))
    if kind == "cc":
        assert {Relation.FORK, Relation.SUB_AGENT, Relation.REWRITE} <= {r.relation for r in trace.requests}
    for size in (16, 64):
        hashed = ContentModel(trace, size)
        dense = ContentModel(trace, size, lazy=True, labels=DENSE, cache_size=4)
        seen = [pair for r in reversed(trace.requests) for pair in pairs(hashed, dense, r.id)]
        assert_bijection(seen)
        shared = len(seen) - len({h for h, _ in seen})
        assert shared > 0  # pages shared between requests (the case the bijection is about)


@given(trace=traces(DEEP), size=PAGE_SIZES, namespace=st.integers(1, 2**64 - 1))
def test_another_namespace_gets_other_labels(trace: Trace, size: int, namespace: int) -> None:
    root = ContentModel(trace, size, labels=DENSE)
    other = ContentModel(trace, size, labels=DENSE, namespace=namespace)
    for r in trace.requests:
        a, b = root.context_pages(r.id), other.context_pages(r.id)
        assert np.array_equal(a, b & np.uint64((1 << 44) - 1))  # the same numbers under a tag
        assert not set(a.tolist()) & set(b.tolist())
