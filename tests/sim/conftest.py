"""Shared checks for replay tests: the replayer's invariants, asserted on a finished `run_replay` log."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from evolving_infra.sim.replay import (
    AgentFinished,
    AgentReplayer,
    AgentStarted,
    BranchEnded,
    IssueRequest,
    ReplayKind,
    ReplayMode,
)
from evolving_infra.sim.replay_loop import ReplayLog
from evolving_infra.traces.records import Trace


def _check_replay(trace: Trace, mode: ReplayMode, replayer: AgentReplayer, log: ReplayLog) -> None:
    effects = log.effects

    # Effects come out in time order.
    times = [e.at for e in effects]
    assert times == sorted(times)

    # Every request issued exactly once, and completed.
    issued = {e.request.id: e for e in effects if isinstance(e, IssueRequest)}
    assert Counter(e.request.id for e in effects if isinstance(e, IssueRequest)) == Counter(r.id for r in trace.requests)
    assert set(log.completed) == {r.id for r in trace.requests}

    started = {e.agent: e for e in effects if isinstance(e, AgentStarted)}
    finished = [e.agent for e in effects if isinstance(e, AgentFinished)]
    assert sorted(finished) == sorted(trace.agents) and len(started) == len(trace.agents)

    for r in trace.requests:
        e = issued[r.id]
        if r.after:
            ready = max(log.completed[d] for d in r.after)
            assert e.at == ready + r.delay_s
            assert e.since == e.at
        else:
            assert e.at == started[r.agent].at + r.delay_s
            assert e.since == started[r.agent].arrived + r.delay_s
        assert log.completed[r.id] >= e.at

    # Every branch ends exactly once, when its branch_end's request completes, else with its agent.
    ended = Counter(e.branch for e in effects if isinstance(e, BranchEnded))
    assert ended == Counter(list(trace.branches))
    end_time = {e.branch: e.at for e in effects if isinstance(e, BranchEnded)}
    for branch in trace.branches.values():
        if branch.end is not None:
            assert end_time[branch.id] == log.completed[branch.end.after]
        else:
            agent_reqs = trace.agent_requests(branch.agent)
            assert end_time[branch.id] == max(log.completed[r.id] for r in agent_reqs)

    # Active agents stay within the mode's limit; closed loop starts agents in file order.
    active = 0
    peak = 0
    for e in effects:
        if isinstance(e, AgentStarted):
            active += 1
        elif isinstance(e, AgentFinished):
            active -= 1
        peak = max(peak, active)
    if mode.kind is ReplayKind.CLOSED_LOOP:
        assert peak <= mode.concurrency
        assert [e.agent for e in effects if isinstance(e, AgentStarted)] == list(trace.agents)
    else:
        if mode.max_active is not None:
            assert peak <= mode.max_active
        for a in trace.agents.values():
            assert started[a.agent].arrived == a.start_s
            assert started[a.agent].at >= a.start_s
    assert replayer.done and replayer.in_flight == 0 and replayer.active_agents == 0


@pytest.fixture(scope="session")
def check_replay() -> Callable[[Trace, ReplayMode, AgentReplayer, ReplayLog], None]:
    """Every request issued exactly once, exactly when its dependencies and delay allow; every branch and
    agent ends once, at the right time; the mode's limit on active agents holds; the replay is done."""
    return _check_replay
