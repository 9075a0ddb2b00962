"""`trace scale | merge | slice`: copies share only named prefixes (hypothesis), merges keep every input,
slices keep a valid range."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.loader import load_trace, trace_from_records
from evolving_infra.traces.records import Trace
from evolving_infra.traces.stats import ideal_hit_tokens
from evolving_infra.traces.testing import random_trace, traces
from evolving_infra.traces.transforms import MergeInput, merge, scale, slice_trace

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "sample-agents.jsonl"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), copies=st.integers(2, 3), page=st.sampled_from([4, 16]))
def test_scaled_copies_share_only_named_prefixes(trace: Trace, copies: int, page: int) -> None:
    scaled = trace_from_records(scale(trace, copies, 5.0))
    n = len(trace.requests)
    assert len(scaled.requests) == copies * n and len(scaled.agents) == copies * len(trace.agents)
    model = ContentModel(scaled, page)
    prefix_pages = set()
    for name in scaled.prefixes:
        prefix_pages.update(int(p) for p in model.prefix_pages(name))
    by_copy = [set() for _ in range(copies)]
    for i, r in enumerate(scaled.requests):
        by_copy[i // n].update(int(p) for p in model.produced_pages(r.id)) if n else None
    for a in range(copies):
        for b in range(a + 1, copies):
            assert by_copy[a] & by_copy[b] <= prefix_pages
    # The ideal hit structure: copy 0 is the original; every later copy gets the same, plus the prefix pages
    # that copy 0 produced before it.
    hits = ideal_hit_tokens(scaled, page)
    original = ideal_hit_tokens(trace, page)
    assert np.array_equal(hits[:n], original)
    for c in range(1, copies):
        assert np.array_equal(hits[c * n : (c + 1) * n], hits[n : 2 * n])
        assert (hits[c * n : (c + 1) * n] >= original).all()
    starts = [a.start_s for a in scaled.agents.values()]
    assert starts[len(trace.agents) :][: len(trace.agents)] == [a.start_s + 5.0 for a in trace.agents.values()]


def test_scale_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="copies"):
        scale(random_trace(1), 0)
    with pytest.raises(ValueError, match="stagger"):
        scale(random_trace(1), 2, -1.0)


def test_merge_keeps_every_input_and_relabels_workloads() -> None:
    sample = load_trace(SAMPLE)
    other = random_trace(7)
    merged = trace_from_records(merge([MergeInput(sample, "a"), MergeInput(other, "b", "coding", offset_s=3.0)]))
    assert len(merged.requests) == len(sample.requests) + len(other.requests)
    assert {a.workload for a in merged.agents.values() if a.agent.startswith("b/")} == {"coding"}
    assert {a.workload for a in merged.agents.values() if a.agent.startswith("a/")} == {
        a.workload for a in sample.agents.values()
    }
    assert [merged.agents[f"b/{a}"].start_s for a in other.agents] == [x.start_s + 3.0 for x in other.agents.values()]
    assert set(merged.prefixes) == {f"a/{p}" for p in sample.prefixes} | {f"b/{p}" for p in other.prefixes}
    # Each input's requests keep their structure (same relations, same lengths, in the same order).
    mine = [r for r in merged.requests if r.agent.startswith("b/")]
    assert [(r.relation, r.keep, r.new, r.output_tokens) for r in mine] == [
        (r.relation, r.keep, r.new, r.output_tokens) for r in other.requests
    ]
    with pytest.raises(ValueError, match="distinct"):
        merge([MergeInput(sample, "a"), MergeInput(other, "a")])


def test_slice_by_time_and_by_agents() -> None:
    sample = load_trace(SAMPLE)
    starts = sorted(a.start_s for a in sample.agents.values())
    records, report = slice_trace(sample, from_s=starts[2], to_s=starts[5])
    sliced = trace_from_records(records)
    expected = {a.agent for a in sample.agents.values() if starts[2] <= a.start_s < starts[5]}
    assert set(sliced.agents) == expected and report.agents == len(expected)
    assert min(a.start_s for a in sliced.agents.values()) == 0.0
    assert len(sliced.requests) == sum(1 for r in sample.requests if r.agent in expected)
    records, _ = slice_trace(sample, agents=(1, 3), rebase_time=False)
    assert list(trace_from_records(records).agents) == list(sample.agents)[1:3]


def test_slice_detaches_a_base_of_a_dropped_agent() -> None:
    records = [
        {"kind": "agent", "agent": "a", "workload": "w", "start_s": 0.0},
        {"kind": "request", "id": "a.r0", "agent": "a", "branch": "a.b", "input": {"new": 10}, "output_tokens": 2},
        {"kind": "agent", "agent": "b", "workload": "w", "start_s": 5.0},
        {"kind": "request", "id": "b.r0", "agent": "b", "branch": "b.b", "input": {"base": "a.r0", "keep": 12, "new": 3},
         "output_tokens": 1},
    ]  # fmt: skip
    out, report = slice_trace(trace_from_records(records), from_s=1.0)
    sliced = trace_from_records(out)
    assert report.detached == 1 and sliced.request("b.r0").prompt_tokens == 15 and sliced.request("b.r0").base is None
