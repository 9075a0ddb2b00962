"""Shared checks for replay tests: the replayer's invariants, asserted on a finished `run_replay` log."""

from __future__ import annotations

import math
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

    # Every agent starts and finishes once, but those a schedule-following closed loop skipped (never started).
    started = {e.agent: e for e in effects if isinstance(e, AgentStarted)}
    finished = [e.agent for e in effects if isinstance(e, AgentFinished)]
    assert len(started) == len([e for e in effects if isinstance(e, AgentStarted)])
    assert sorted(finished) == sorted(started)
    skipped = [a for a in trace.agents if a not in started]
    assert len(skipped) == replayer.skipped_agents
    if mode.skip_late_s is None:
        assert not skipped
    else:
        _check_skips(trace, mode.skip_late_s, started, max((e.at for e in effects), default=0.0))
    requests = [r for r in trace.requests if r.agent in started]

    # Every request of a started agent issued exactly once, and completed; no other request issued.
    issued = {e.request.id: e for e in effects if isinstance(e, IssueRequest)}
    assert Counter(e.request.id for e in effects if isinstance(e, IssueRequest)) == Counter(r.id for r in requests)
    assert set(log.completed) == {r.id for r in requests}

    for r in requests:
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
    assert ended == Counter([b.id for b in trace.branches.values() if b.agent in started])
    end_time = {e.branch: e.at for e in effects if isinstance(e, BranchEnded)}
    for branch in trace.branches.values():
        if branch.agent not in started:
            continue
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
        assert [e.agent for e in effects if isinstance(e, AgentStarted)] == [a for a in trace.agents if a in started]
    else:
        if mode.max_active is not None:
            assert peak <= mode.max_active
        for a in trace.agents.values():
            assert started[a.agent].arrived == a.start_s
            assert started[a.agent].at >= a.start_s
    assert replayer.done and replayer.in_flight == 0 and replayer.active_agents == 0


def _check_skips(trace: Trace, late: float, started: dict[str, AgentStarted], end: float) -> None:
    """A schedule-following closed loop (replay started at 0) starts an agent only while its `start_s` is at most
    `late` ago, and skips one only when that had passed when it was considered: no later than the next agent in
    file order started (or than the run's last effect, `end`)."""
    order = list(trace.agents)
    for i, name in enumerate(order):
        start_s = trace.agents[name].start_s
        if name in started:
            assert start_s + late >= started[name].at, f"{name} started {started[name].at - start_s} s late"
            continue
        later = [started[a].at for a in order[i + 1:] if a in started]
        assert start_s + late < (later[0] if later else end), f"{name} was skipped while still due"


@pytest.fixture(scope="session")
def check_replay() -> Callable[[Trace, ReplayMode, AgentReplayer, ReplayLog], None]:
    """Every request issued exactly once, exactly when its dependencies and delay allow; every branch and
    agent ends once, at the right time; the mode's limit on active agents holds; the replay is done."""
    return _check_replay
