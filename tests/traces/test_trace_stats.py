"""Statistics: counts per workload, and h* by structure, by page hashes and by brute force all agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.loader import load_trace, trace_from_records
from evolving_infra.traces.records import Trace
from evolving_infra.traces.stats import ideal_hit_tokens, ideal_hit_tokens_from_pages, trace_stats
from evolving_infra.traces.testing import traces

from .oracle import ideal_hits

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "traces" / "sample-agents.jsonl"


def _req(rid: str, agent: str, branch: str, spec: dict[str, object], out: int, **extra: object) -> dict[str, object]:
    return {"kind": "request", "id": rid, "agent": agent, "branch": branch, "input": spec, "output_tokens": out,
            **extra}  # fmt: skip


HAND = [
    {"kind": "prefix", "name": "S", "tokens": 6},
    {"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0},
    {"kind": "agent", "agent": "b", "workload": "osworld", "start_s": 2},
    _req("r1", "a", "a.m", {"shared": "S", "keep": 6, "new": 3}, 2),
    _req("r2", "a", "a.m", {"base": "r1", "keep": 11, "new": 2}, 1, after=["r1"], delay_s=2.0),
    _req("r3", "b", "b.m", {"shared": "S", "keep": 6, "new": 5}, 1),
    _req("r4", "a", "a.m", {"base": "r2", "keep": 8, "new": 4}, 1, after=["r2"], delay_s=1.0),
    _req("r5", "a", "a.f", {"base": "r2", "keep": 14, "new": 2}, 1, after=["r4"]),
]


def test_hand_computed_ideal_hit_rate() -> None:
    """Pages of P = 4 tokens; S = prefix tokens, Nk / Ok = fresh / output tokens of rk.

    r1: prompt S0-5 N1_0-2 (9 tokens, 2 full pages: [S0-3], [S4-5 N1_0-1]); nothing earlier: 0 hits.
        produces (9 + 2 - 1) // 4 = 2 pages.
    r2: prompt = r1's context (11) + N2_0-1 = 13 tokens, 3 full pages; pages 0, 1 are r1's: 8 hit tokens.
        Page 2 = [N1_2 O1_0 O1_1 N2_0] is new. Produces (13 + 1 - 1) // 4 = 3 pages.
    r3: prompt S0-5 N3_0-4 (11 tokens, 2 pages): page 0 = [S0-3] produced by r1: 4 hit tokens.
    r4: keeps 8 tokens of r2 then N4_0-3: 3 pages: pages 0, 1 (r1's) hit, page 2 is fresh: 8 hit tokens.
    r5: keeps r2's whole context (14) + N5_0-1: 4 pages: pages 0-2 produced by r1/r2: 12 hit tokens.
    Prompt tokens 9 + 13 + 11 + 12 + 16 = 61; hits 0 + 8 + 4 + 8 + 12 = 32; h* = 32 / 61.
    """
    trace = trace_from_records(HAND)
    stats = trace_stats(trace, 4)
    assert ideal_hit_tokens(trace, 4).tolist() == [0, 8, 4, 8, 12]
    assert (stats.prompt_tokens, stats.ideal_hit_tokens) == (61, 32)
    assert stats.ideal_hit_rate == pytest.approx(32 / 61)
    assert (stats.agents, stats.branches, stats.requests) == (2, 3, 5)
    assert (stats.roots, stats.appends, stats.forks, stats.sub_agents, stats.compactions) == (2, 1, 1, 0, 1)
    assert stats.output_tokens == 6 and stats.mean_delay_s == pytest.approx(3.0 / 5)
    cc, osw = stats.by_workload["cc"], stats.by_workload["osworld"]
    assert (cc.requests, cc.prompt_tokens, cc.ideal_hit_tokens, cc.branches) == (4, 50, 28, 2)
    assert (osw.requests, osw.prompt_tokens, osw.ideal_hit_tokens, osw.agents) == (1, 11, 4, 1)


def test_last_output_token_page_is_produced_only_by_a_later_request() -> None:
    """P = 4. r1: 3 prompt + 1 output = 4-token context; it produces (4 - 1) // 4 = 0 pages.
    r2 keeps all 4 (page 0 holds r1's last output token): miss; r2 produces it. r3 does the same: hit."""
    records = [
        {"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0},
        _req("r1", "a", "m", {"new": 3}, 1),
        _req("r2", "a", "m", {"base": "r1", "keep": 4, "new": 1}, 1),
        _req("r3", "a", "f", {"base": "r1", "keep": 4, "new": 2}, 1),
    ]
    assert ideal_hit_tokens(trace_from_records(records), 4).tolist() == [0, 0, 4]


@given(trace=traces(), size=st.integers(1, 8))
def test_structural_page_hash_and_brute_force_hit_rates_agree(trace: Trace, size: int) -> None:
    want = ideal_hits(trace, size)
    assert ideal_hit_tokens(trace, size).tolist() == want
    assert ideal_hit_tokens_from_pages(ContentModel(trace, size)).tolist() == want


@given(trace=traces(), size=st.integers(1, 8))
def test_counts_add_up_over_workloads(trace: Trace, size: int) -> None:
    stats = trace_stats(trace, size)
    assert stats.requests == len(trace.requests) == sum(c.requests for c in stats.by_workload.values())
    assert stats.roots + stats.appends + stats.forks + stats.sub_agents + stats.compactions == stats.requests
    assert stats.agents == len(trace.agents) and stats.branches == len(trace.branches)
    assert 0 <= stats.ideal_hit_tokens <= stats.prompt_tokens
    assert sum(c.ideal_hit_tokens for c in stats.by_workload.values()) == stats.ideal_hit_tokens
    d = stats.to_dict()
    assert d["ideal_hit_rate"] == stats.ideal_hit_rate and set(d["by_workload"]) == set(stats.by_workload)


def test_empty_trace_has_zero_rates() -> None:
    stats = trace_stats(trace_from_records([]))
    assert stats.requests == 0 and stats.ideal_hit_rate == 0.0 and stats.mean_delay_s == 0.0
    assert ideal_hit_tokens_from_pages(ContentModel(trace_from_records([]))).tolist() == []


def test_bundled_sample_has_every_pattern() -> None:
    trace = load_trace(SAMPLE)
    stats = trace_stats(trace)
    assert set(stats.by_workload) == {"cc", "putnam", "osworld"}
    assert 6 <= stats.agents <= 10 and len(trace.prefixes) >= 2 and trace.branch_ends
    assert stats.forks >= 1 and stats.sub_agents >= 1 and stats.compactions >= 1 and stats.appends >= 10
    waits = [r for r in trace.requests if any(trace.request(a).branch != r.branch for a in r.after)]
    assert waits, "a parent waits on its sub-agents through `after`"
    assert np.array_equal(ideal_hit_tokens(trace), ideal_hit_tokens_from_pages(ContentModel(trace)))
