"""A growing trace loads agent blocks on demand with the loader's checks, and equals the whole trace."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.traces.errors import TraceError
from evolving_infra.traces.growing import GrowingTrace, GrowingTraceError, LoadedAgent
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.testing import trace_records
from evolving_infra.workloads import generate

from .agent_blocks import agent_blocks, flatten, growing


@given(records=trace_records(), loads=st.lists(st.integers(0, 4), max_size=4))
def test_the_loaded_part_equals_the_whole_trace(records: list[dict[str, Any]], loads: list[int]) -> None:
    head, blocks = agent_blocks(records)
    whole = trace_from_records(flatten(head, blocks), source="blocks")
    asked: list[int] = []
    trace = growing(head, blocks, asked)
    assert trace.agent_count == len(blocks) and trace.loaded_agents == 0 and not trace.requests
    for n in [*loads, len(blocks)]:
        trace.load(n)
        loaded = min(len(blocks), max([*asked, -1]) + 1)
        assert trace.loaded_agents == loaded
        count = len(trace.requests)
        assert list(trace.requests) == list(whole.requests[:count])  # same indices, relations, lines
        assert list(trace.agents.values()) == list(whole.agents.values())[:loaded]
    assert asked == list(range(len(blocks))), "each block is asked for once, in order"
    assert trace.snapshot() == whole
    assert list(trace.branch_ends) == list(whole.branch_ends)
    assert dict(trace.prefixes) == dict(whole.prefixes)
    for i in range(len(blocks)):
        agent = trace.agent_at(i)
        assert agent.index == i
        assert agent.requests == whole.agent_requests(agent.agent.agent)


def test_listeners_see_each_agent_once() -> None:
    head, blocks = agent_blocks(generate("putnam", 4, seed=1))
    trace = growing(head, blocks)
    trace.load(2)
    seen: list[int] = []
    released: list[int] = []
    trace.on_load(lambda a: seen.append(a.index))  # the two loaded already are replayed
    trace.on_release(lambda a: released.append(a.index))
    trace.load_all()
    trace.release(1)
    trace.release(1)
    assert seen == [0, 1, 2, 3] and released == [1]
    assert trace.request(trace.agent_at(1).requests[0].id).index == trace.agent_at(1).requests[0].index
    with pytest.raises(GrowingTraceError, match="outside"):
        trace.agent_at(4)


def test_release_of_an_agent_not_loaded_is_refused() -> None:
    head, blocks = agent_blocks(generate("putnam", 2, seed=1))
    trace = growing(head, blocks)
    with pytest.raises(GrowingTraceError, match="not loaded"):
        trace.release(0)


def _agent(name: str) -> dict[str, Any]:
    return {"kind": "agent", "agent": name, "workload": "w", "start_s": 0.0}


def _request(rid: str, agent: str, **input: Any) -> dict[str, Any]:
    return {"kind": "request", "id": rid, "agent": agent, "branch": f"{agent}.main",
            "input": input or {"new": 8}, "output_tokens": 2}  # fmt: skip


HEAD = [{"kind": "header", "version": 1}, {"kind": "prefix", "name": "sys", "tokens": 16}]


@pytest.mark.parametrize(
    ("blocks", "message"),
    [
        ([[_request("r", "a")]], "must start with its 'agent' record"),
        ([[_agent("a"), _agent("b")]], "second 'agent' record"),
        ([[_agent("a")], [_agent("b"), _request("r", "a")]], "of agent 'a'"),
        ([[_agent("a"), _request("r", "a")], [_agent("b"), {"kind": "branch_end", "branch": "a.main", "after": "r"}]],
         "another agent"),
        ([[_agent("a"), {"kind": "prefix", "name": "x", "tokens": 1}]], "only the head may"),
    ],
)
def test_a_block_with_other_agents_records_is_refused(blocks: list[list[dict[str, Any]]], message: str) -> None:
    trace = GrowingTrace(HEAD, lambda i: blocks[i], len(blocks))
    with pytest.raises(GrowingTraceError, match=message):
        trace.load_all()


def test_the_loaders_checks_apply_with_whole_file_line_numbers() -> None:
    blocks = [[_agent("a"), _request("a.r1", "a", shared="sys", keep=99, new=1)]]
    with pytest.raises(TraceError) as err:
        GrowingTrace(HEAD, lambda i: blocks[i], 1).load_all()
    assert err.value.line == 4 and "keeps 99 tokens of prefix 'sys'" in str(err.value)


def test_a_head_with_agents_is_refused() -> None:
    with pytest.raises(GrowingTraceError, match="the head holds only"):
        GrowingTrace([*HEAD, _agent("a")], lambda i: [], 0)


def test_loaded_agent_carries_its_branch_ends() -> None:
    blocks = [[_agent("a"), _request("r", "a"), {"kind": "branch_end", "branch": "a.main", "after": "r"}]]
    trace = GrowingTrace(HEAD, lambda i: blocks[i], 1)
    agent: LoadedAgent = trace.agent_at(0)
    assert [e.after for e in agent.branch_ends] == ["r"] and list(trace.branch_ends) == list(agent.branch_ends)
