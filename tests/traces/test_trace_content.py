"""The content model gives equal page hashes exactly to equal token prefixes, and shares what the spec says."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.traces.content import ContentModel, Origin
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Relation, Trace
from evolving_infra.traces.testing import TraceShape, traces

from .oracle import PageIds, contexts

PAGE_SIZES = st.integers(1, 8)


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def ancestors(trace: Trace, rid: str) -> set[str]:
    out: set[str] = set()
    base = trace.request(rid).base
    while base is not None:
        out.add(base)
        base = trace.request(base).base
    return out


@given(trace=traces(), size=PAGE_SIZES)
def test_equal_hashes_exactly_for_equal_token_prefixes(trace: Trace, size: int) -> None:
    model = ContentModel(trace, size)
    ids = PageIds()
    ctx = contexts(trace)
    hash_of: dict[int, int] = {}
    page_of: dict[int, int] = {}
    for r in trace.requests:
        want = ids.pages(ctx[r.id], size)
        got = [int(h) for h in model.context_pages(r.id)]
        assert len(got) == len(want) == r.context_tokens // size
        for w, g in zip(want, got, strict=True):
            assert hash_of.setdefault(w, g) == g, "equal token prefixes must hash equal"
            assert page_of.setdefault(g, w) == w, "different token prefixes must hash differently"
    for name, prefix in trace.prefixes.items():
        want = ids.pages([("P", name, k) for k in range(prefix.tokens)], size)
        assert [hash_of.get(w, int(h)) for w, h in zip(want, model.prefix_pages(name), strict=True)] == [
            int(h) for h in model.prefix_pages(name)
        ]


@given(trace=traces(), size=PAGE_SIZES)
def test_prompt_and_produced_pages_are_prefixes_of_the_context(trace: Trace, size: int) -> None:
    model = ContentModel(trace, size, cache_size=2)
    for r in trace.requests:
        ctx = model.context_pages(r.id)
        assert np.array_equal(model.prompt_pages(r.id), ctx[: r.prompt_tokens // size])
        assert np.array_equal(model.produced_pages(r.id), ctx[: (r.context_tokens - 1) // size])
        assert np.array_equal(model.own_pages(r.id), ctx[r.keep // size :])


@given(trace=traces(), size=PAGE_SIZES)
def test_a_request_shares_exactly_floor_keep_over_p_pages_with_its_source(trace: Trace, size: int) -> None:
    """Appends share all the base's full pages, forks share the parent's up to keep, compaction keeps only
    floor(keep / P) pages, sub-agents share only prefix pages."""
    model = ContentModel(trace, size)
    for r in trace.requests:
        mine = model.context_pages(r.id)
        if r.base is not None:
            source = model.context_pages(r.base)
        elif r.shared is not None:
            source = model.prefix_pages(r.shared)
        else:
            source = np.empty(0, dtype=np.uint64)
        assert lcp(mine, source) == r.keep // size
        if r.relation is Relation.APPEND:
            base = trace.request(r.base or "")
            assert np.array_equal(mine[: base.context_tokens // size], source)
        if r.relation is Relation.REWRITE and r.base is not None:
            assert not set(mine[r.keep // size :].tolist()) & set(source.tolist())
        if r.relation is Relation.SUB_AGENT:
            everything_else = {
                int(h) for s in trace.requests if s.id != r.id and r.id not in ancestors(trace, s.id)
                for h in model.context_pages(s.id)
            }  # fmt: skip
            prefix = set(source.tolist())
            assert {int(h) for h in mine if int(h) in everything_else} <= prefix


@given(trace=traces(), size=PAGE_SIZES)
def test_pages_with_fresh_tokens_appear_only_in_descendants(trace: Trace, size: int) -> None:
    model = ContentModel(trace, size)
    owner: dict[int, tuple[str, int]] = {}
    for r in trace.requests:
        kept = r.keep // size
        for j, h in enumerate(model.context_pages(r.id).tolist()):
            if j >= kept:
                assert h not in owner, "a page holding fresh tokens was seen before its request"
                owner[h] = (r.id, j)
            else:
                first, index = owner.get(h, ("", j))
                assert index == j
                assert first == "" or first in ancestors(trace, r.id)


def test_hand_built_pages_and_spans() -> None:
    trace = trace_from_records(
        [
            {"kind": "prefix", "name": "S", "tokens": 6},
            {"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0},
            {"kind": "request", "id": "r1", "agent": "a", "branch": "m",
             "input": {"shared": "S", "keep": 6, "new": 3}, "output_tokens": 2},
            {"kind": "request", "id": "r2", "agent": "a", "branch": "m",
             "input": {"base": "r1", "keep": 11, "new": 2}, "output_tokens": 1},
            {"kind": "request", "id": "r3", "agent": "a", "branch": "m",
             "input": {"base": "r2", "keep": 7, "new": 1}, "output_tokens": 1},
        ]
    )  # fmt: skip
    model = ContentModel(trace, 4)
    assert model.context_spans("r3", 0, 9) == [
        (Origin.PREFIX, 0, 0, 6), (Origin.NEW, 0, 0, 1), (Origin.NEW, 2, 0, 1), (Origin.OUTPUT, 2, 0, 1),
    ]  # fmt: skip
    p1, p2, p3 = (model.context_pages(r) for r in ("r1", "r2", "r3"))
    assert len(p1) == 2 and len(p2) == 3 and len(p3) == 2
    assert p1[0] == model.prefix_pages("S")[0]
    assert np.array_equal(p2[:2], p1) and p3[0] == p1[0] and p3[1] != p1[1]
    assert model.prompt_page_hashes("r2") == [int(h) for h in p2[:3]]
    assert len(model.produced_pages("r2")) == 3  # (11 + 2 + 1 - 1) // 4
    assert model.relation("r3") is Relation.REWRITE


def test_namespaces_separate_traces() -> None:
    trace = trace_from_records(
        [{"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0},
         {"kind": "request", "id": "r1", "agent": "a", "branch": "m", "input": {"new": 8}, "output_tokens": 1}]
    )  # fmt: skip
    assert not set(ContentModel(trace, 4).context_pages("r1").tolist()) & set(
        ContentModel(trace, 4, namespace=7).context_pages("r1").tolist()
    )


@pytest.mark.parametrize("size", [0, -3])
def test_bad_page_size_is_refused(size: int) -> None:
    trace = trace_from_records([])
    with pytest.raises(ValueError, match="positive integer"):
        ContentModel(trace, size)


@given(trace=traces(TraceShape(max_agents=2, max_steps=12, max_tokens=200)), size=st.sampled_from([16, 64]))
def test_larger_contexts_with_realistic_pages(trace: Trace, size: int) -> None:
    model = ContentModel(trace, size, cache_size=0)
    ids = PageIds()
    ctx = contexts(trace)
    seen: dict[int, int] = {}
    for r in trace.requests:
        for w, g in zip(ids.pages(ctx[r.id], size), model.context_pages(r.id).tolist(), strict=True):
            assert seen.setdefault(w, g) == g
    assert len(set(seen.values())) == len(seen)
