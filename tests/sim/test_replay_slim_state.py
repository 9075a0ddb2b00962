"""The replayer's slim state answers like the plain form: a `RequestSpec` that keeps the trace's own record equals,
hashes, prints and pickles as a copy of its fields does, and a plan built from a loaded trace equals the plan of
plain copies of its records; the per-agent replay state (positions in arrays) gives the same effects whether an
agent's requests are one contiguous run of the trace or interleaved with other agents'."""

from __future__ import annotations

import pickle
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.sim.replay import (
    AgentFinished,
    AgentReplayer,
    AgentStarted,
    BranchEnded,
    Effect,
    IssueRequest,
    ReplayMode,
    ReplayPlan,
    RequestSpec,
)
from evolving_infra.sim.replay_loop import run_replay
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Request, Trace
from evolving_infra.traces.testing import TraceShape, trace_records
from tests.traces.agent_blocks import agent_blocks, flatten

SHAPE = TraceShape(max_agents=4, max_steps=8)
SERVICE = [0.0, 0.5, 1.0, 2.5]


def copied(r: Request, workload: str) -> RequestSpec:
    """The spec as a copy of the record's fields (the form every spec had before slim specs)."""
    return RequestSpec(id=r.id, agent=r.agent, workload=workload, branch=r.branch, after=tuple(dict.fromkeys(r.after)),
                       delay_s=float(r.delay_s), prompt_tokens=int(r.prompt_tokens),
                       output_tokens=int(r.output_tokens), index=r.index)  # fmt: skip


FIELDS = ("id", "agent", "workload", "branch", "after", "delay_s", "prompt_tokens", "output_tokens", "index")


@settings(max_examples=80)
@given(records=trace_records(SHAPE))
def test_a_slim_spec_answers_like_a_copy(records: list[dict[str, Any]]) -> None:
    trace = trace_from_records(records)
    for r in trace.requests:
        workload = trace.workload(r)
        slim, copy = RequestSpec.of_record(r, workload), copied(r, workload)
        for name in FIELDS:
            assert getattr(slim, name) == getattr(copy, name) and type(getattr(slim, name)) is type(getattr(copy, name))
        assert slim == copy and hash(slim) == hash(copy) and repr(slim) == repr(copy)
        assert pickle.loads(pickle.dumps(slim)) == slim
        other = RequestSpec.of_record(replace(r, output_tokens=r.output_tokens + 1), workload)
        assert other != slim and slim != RequestSpec.of_record(r, workload + "x")
        with pytest.raises(AttributeError):
            slim.workload = "other"


def plain(trace: Trace) -> SimpleNamespace:
    """The trace as plain objects (no `Request` records), so the plan copies every field."""
    requests = [SimpleNamespace(id=r.id, agent=r.agent, branch=r.branch, after=list(r.after), delay_s=r.delay_s,
                                prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens) for r in trace.requests]
    return SimpleNamespace(agents=list(trace.agents.values()), requests=requests, branch_ends=list(trace.branch_ends))


@settings(max_examples=80)
@given(records=trace_records(SHAPE))
def test_the_plan_of_a_loaded_trace_equals_the_plan_of_plain_copies(records: list[dict[str, Any]]) -> None:
    trace = trace_from_records(records)
    slim, copies = ReplayPlan.from_trace(trace), ReplayPlan.from_trace(plain(trace))
    assert slim.agents == copies.agents and dict(slim.requests) == dict(copies.requests)
    assert [repr(s) for s in slim.requests.values()] == [repr(s) for s in copies.requests.values()]


def without_index(effect: Effect) -> tuple[Any, ...]:
    """An effect with its request's trace index left out (regrouping the records renumbers the requests)."""
    if isinstance(effect, IssueRequest):
        s = effect.request
        return ("issue", s.id, s.agent, s.workload, s.branch, s.after, s.delay_s, s.prompt_tokens, s.output_tokens,
                effect.at, effect.since)  # fmt: skip
    assert isinstance(effect, BranchEnded | AgentStarted | AgentFinished)
    return (type(effect).__name__, effect)


@settings(max_examples=80)
@given(records=trace_records(SHAPE), closed=st.booleans(), limit=st.integers(1, 3),
       service=st.lists(st.sampled_from(SERVICE), min_size=8, max_size=8))  # fmt: skip
def test_interleaved_agents_replay_as_contiguous_ones(records: list[dict[str, Any]], closed: bool, limit: int,
                                                      service: list[float]) -> None:  # fmt: skip
    interleaved = trace_from_records(records)
    head, blocks = agent_blocks(records)
    grouped = trace_from_records(flatten(head, blocks))
    position: dict[str, int] = {r.id: i for i, r in enumerate(interleaved.requests)}
    mode = ReplayMode.closed_loop(limit) if closed else ReplayMode.open_loop(max_active=limit)

    def cost(spec: RequestSpec) -> float:
        return service[position[spec.id] % len(service)]

    got = run_replay(AgentReplayer(interleaved, mode), cost)
    expected = run_replay(AgentReplayer(grouped, mode), cost)
    assert [without_index(e) for e in got.effects] == [without_index(e) for e in expected.effects]
    assert got.completed == expected.completed
    issued = [e.request for e in got.effects if isinstance(e, IssueRequest)]
    assert sorted(s.id for s in issued) == sorted(position), "every request is issued once"
    assert all(s.index == position[s.id] for s in issued)
