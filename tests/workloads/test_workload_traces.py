"""Every kind writes a trace the loader accepts, deterministically, within the context bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.traces.loader import load_trace, trace_from_records
from evolving_infra.traces.records import Relation
from evolving_infra.workloads import KINDS, generate, write_trace

KIND_NAMES = list(KINDS)


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_every_kind_is_a_valid_trace(kind: str, generated: dict[str, list[dict[str, object]]]) -> None:
    records = generated[kind]
    trace = trace_from_records(records, source=kind)
    assert trace.header is not None and trace.header.notes
    assert len(trace.agents) == sum(1 for r in records if r["kind"] == "agent")
    starts = [a.start_s for a in trace.agents.values()]
    assert starts == sorted(starts), "agents are in file order of start_s"
    for r in trace.requests:
        assert r.context_tokens <= 200_000


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_same_seed_same_bytes_and_loadable(kind: str, suffix: str, tmp_path: Path) -> None:
    a, b = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    write_trace(generate(kind, 12, seed=3), a)
    write_trace(generate(kind, 12, seed=3), b)
    assert a.read_bytes() == b.read_bytes()
    trace = load_trace(a)
    assert len(trace.agents) == 12


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_different_seeds_differ(kind: str) -> None:
    one, two = generate(kind, 12, seed=1), generate(kind, 12, seed=2)
    assert one[1:] != two[1:]


@pytest.mark.parametrize("kind", ["cc", "putnam", "osworld"])
def test_more_agents_keep_the_earlier_ones(kind: str) -> None:
    few, many = generate(kind, 5, seed=9), generate(kind, 9, seed=9)
    assert many[1 : len(few)] == few[1:]


def test_branch_kinds_match_the_loaders_reading(generated: dict[str, list[dict[str, object]]]) -> None:
    cc = trace_from_records(generated["cc"])
    relations = {r.relation for r in cc.requests}
    assert relations == set(Relation)
    putnam = trace_from_records(generated["putnam"])
    assert {r.relation for r in putnam.requests} == {Relation.ROOT, Relation.APPEND}
    ended = {e.branch for e in cc.branch_ends}
    for b in cc.branches.values():
        assert (b.id in ended) == (not b.id.endswith(".main")), "sub-agents and forks end; main branches do not"


@given(kind=st.sampled_from(KIND_NAMES), seed=st.integers(0, 2**31), agents=st.integers(4, 9))
def test_any_seed_gives_a_valid_trace(kind: str, seed: int, agents: int) -> None:
    trace = trace_from_records(generate(kind, agents, seed))
    assert len(trace.agents) == agents
    assert all(b.end is not None for b in trace.branches.values() if not b.id.endswith(".main"))


@given(
    kind=st.sampled_from(["cc", "osworld", "putnam"]),
    seed=st.integers(0, 2**31),
    max_context=st.integers(20_000, 120_000),
)
def test_small_context_bounds_hold(kind: str, seed: int, max_context: int) -> None:
    overrides: dict[str, object] = {"max_context_tokens": max_context}
    if kind == "cc":
        overrides.update(
            system_prefix_tokens=max_context // 8,
            subagent_prefix_tokens=max_context // 10,
            compact_at_tokens=max_context * 3 // 4,
            main_steps=120,
        )
    records = generate(kind, 3, seed, **overrides)
    trace = trace_from_records(records)
    assert max(r.context_tokens for r in trace.requests) <= max_context
