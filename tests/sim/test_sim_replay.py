"""The agent replayer on small hand-written traces (loaded by the real trace loader where possible)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from evolving_infra.sim.replay import (
    AgentFinished,
    AgentReplayer,
    AgentStarted,
    BranchEnded,
    IssueRequest,
    PlanError,
    ReplayError,
    ReplayKind,
    ReplayMode,
    ReplayPlan,
)
from evolving_infra.sim.replay_loop import run_replay
from evolving_infra.traces.loader import trace_from_records


def agent(a: str, start_s: float = 0.0, workload: str = "cc") -> dict[str, Any]:
    return {"kind": "agent", "agent": a, "workload": workload, "start_s": start_s}


def req(rid: str, branch: str, after: list[str] | None = None, delay: float = 0.0, out: int = 4) -> dict[str, Any]:
    return {
        "kind": "request",
        "id": rid,
        "agent": rid.split(".")[0],
        "branch": branch,
        "after": after or [],
        "delay_s": delay,
        "input": {"new": 10},
        "output_tokens": out,
    }


def end(branch: str, after: str) -> dict[str, Any]:
    return {"kind": "branch_end", "branch": branch, "after": after}


def issues(effects: list) -> dict[str, IssueRequest]:
    return {e.request.id: e for e in effects if isinstance(e, IssueRequest)}


def test_dependency_and_delay_give_the_issue_time() -> None:
    trace = trace_from_records(
        [agent("a"), req("a.r1", "a.main"), req("a.r2", "a.main", ["a.r1"], delay=3.0)]
    )
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(1))
    first = replayer.start(0.0)
    assert [type(e) for e in first] == [AgentStarted, IssueRequest]
    assert issues(first)["a.r1"].at == 0.0
    assert replayer.next_wakeup() is None
    assert replayer.completed("a.r1", 2.0) == []
    assert replayer.next_wakeup() == 5.0
    assert replayer.due(4.999) == []
    issued = replayer.due(5.0)
    assert [(e.request.id, e.at, e.since) for e in issued] == [("a.r2", 5.0, 5.0)]
    assert replayer.in_flight == 1 and replayer.issued_requests == 2
    tail = replayer.completed("a.r2", 6.0)
    assert tail == [BranchEnded("a.main", "a", 6.0), AgentFinished("a", "cc", 6.0)]
    assert replayer.done


def test_parent_waits_for_all_sub_agents_then_its_delay() -> None:
    trace = trace_from_records(
        [
            agent("a"),
            req("a.p1", "a.main"),
            req("a.s1", "a.sub1", ["a.p1"]),
            req("a.s2", "a.sub2", ["a.p1"], delay=0.5),
            req("a.s3", "a.sub2", ["a.s2"]),
            end("a.sub1", "a.s1"),
            req("a.p2", "a.main", ["a.s1", "a.s3"], delay=1.0),
            end("a.sub2", "a.s3"),
        ]
    )
    service = {"a.p1": 1.0, "a.s1": 10.0, "a.s2": 2.0, "a.s3": 3.0, "a.p2": 1.0}
    log = run_replay(AgentReplayer(trace, ReplayMode.closed_loop(1)), lambda r: service[r.id])
    issued = issues(log.effects)
    assert issued["a.s1"].at == 1.0 and issued["a.s2"].at == 1.5
    assert issued["a.s3"].at == 3.5  # s2 completes at 3.5, no delay
    # s1 completes at 11.0 and s3 at 6.5: the parent resumes 1 s after the later one.
    assert issued["a.p2"].at == 12.0
    ends = [(e.branch, e.at) for e in log.effects if isinstance(e, BranchEnded)]
    assert ends == [("a.sub2", 6.5), ("a.sub1", 11.0), ("a.main", 13.0)]
    assert log.completed["a.p2"] == 13.0


def test_branch_end_takes_effect_at_its_request_even_if_the_agent_goes_on() -> None:
    trace = trace_from_records(
        [
            agent("a"),
            req("a.r1", "a.main"),
            req("a.f1", "a.fork", ["a.r1"]),
            end("a.fork", "a.f1"),
            req("a.r2", "a.main", ["a.f1"], delay=5.0),
        ]
    )
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(1))
    replayer.start(0.0)
    replayer.completed("a.r1", 1.0)
    assert replayer.completed("a.f1", 2.0) == [BranchEnded("a.fork", "a", 2.0)]
    replayer.due(7.0)
    out = replayer.completed("a.r2", 8.0)
    assert out == [BranchEnded("a.main", "a", 8.0), AgentFinished("a", "cc", 8.0)]


def scheduled_trace(slices: int = 10, per_slice: int = 8, width: float = 100.0) -> Any:
    """Agents laid out for tasks of `width` s: `per_slice` starts per slice, the `cc` share moving 0.2 -> 0.8
    (cc and codex interleaved within a slice)."""
    records: list[dict[str, Any]] = []
    for i in range(slices):
        cc = round(per_slice * (0.2 + 0.6 * i / (slices - 1)))
        labels = sorted(range(per_slice), key=lambda k: (k * cc) % per_slice)[:cc]
        for k in range(per_slice):
            name = f"s{i}k{k}"
            records += [agent(name, i * width + k * width / per_slice, "cc" if k in labels else "codex"),
                        req(f"{name}.r1", f"{name}.main")]
    return trace_from_records(records)


@pytest.mark.parametrize("slower", [1.0, 3.0, 7.0])
def test_a_schedule_following_loop_keeps_to_the_schedule_however_long_tasks_last(slower: float) -> None:
    trace = scheduled_trace()
    start_s = {a.agent: a.start_s for a in trace.agents.values()}

    def service(spec: Any) -> float:  # tasks last `slower` times what the trace was laid out for (+- 40 %)
        return 100.0 * slower * (0.6 + 0.8 * (spec.index * 7 % 11) / 10)

    def started(mode: ReplayMode) -> tuple[list[AgentStarted], AgentReplayer]:
        replayer = AgentReplayer(trace, mode)
        log = run_replay(replayer, service)
        return [e for e in log.effects if isinstance(e, AgentStarted) and e.at < 1_000.0], replayer

    following, replayer = started(ReplayMode.closed_loop(8, skip_late_s=100.0))
    plain, _ = started(ReplayMode.closed_loop(8))
    assert replayer.done
    assert all(start_s[e.agent] + 100.0 >= e.at for e in following)  # never more than a slice late
    if slower == 1.0:
        assert replayer.skipped_agents == 0 and following == plain
        return
    assert replayer.skipped_agents > 0
    # Agents started in the span's second half: on the schedule with skipping, far behind it without.
    second = [e for e in following if e.at >= 500.0]
    plain_second = [e for e in plain if e.at >= 500.0]
    assert second and all(start_s[e.agent] >= e.at - 100.0 >= 400.0 for e in second)
    assert all(start_s[e.agent] < 1_000.0 / slower * 1.5 for e in plain_second)

    def cc_share(events: list[AgentStarted]) -> float:
        return sum(e.workload == "cc" for e in events) / len(events)

    assert cc_share(second) >= 0.5 > cc_share(plain_second) if plain_second else cc_share(second) >= 0.5


def test_closed_loop_replaces_finished_agents_in_file_order_ignoring_start_s() -> None:
    records: list[dict[str, Any]] = []
    for name, start in (("a", 300.0), ("b", 200.0), ("c", 100.0), ("d", 0.0)):
        records += [agent(name, start), req(f"{name}.r1", f"{name}.main")]
    trace = trace_from_records(records)
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(2))
    first = replayer.start(0.0)
    assert [e.agent for e in first if isinstance(e, AgentStarted)] == ["a", "b"]
    assert replayer.active_agents == 2
    out = replayer.completed("b.r1", 4.0)
    assert [type(e) for e in out] == [BranchEnded, AgentFinished, AgentStarted, IssueRequest]
    assert out[2] == AgentStarted("c", "cc", 4.0, 4.0) and out[3].request.id == "c.r1"
    out = replayer.completed("a.r1", 5.0)
    assert [e.agent for e in out if isinstance(e, AgentStarted)] == ["d"]
    assert replayer.exhausted and replayer.active_agents == 2
    assert [e.agent for e in replayer.completed("c.r1", 6.0) if isinstance(e, AgentStarted)] == []
    replayer.completed("d.r1", 7.0)
    assert replayer.done and replayer.active_agents == 0 and replayer.finished_agents == 4


def test_open_loop_starts_agents_at_their_start_s_from_the_origin() -> None:
    trace = trace_from_records(
        [agent("a", 5.0), req("a.r1", "a.main", delay=1.0), agent("b", 2.0), req("b.r1", "b.main")]
    )
    replayer = AgentReplayer(trace, ReplayMode.open_loop())
    assert replayer.start(10.0) == []
    assert replayer.next_wakeup() == 12.0
    out = replayer.due(12.0)
    assert out[0] == AgentStarted("b", "cc", 12.0, 12.0) and issues(out)["b.r1"].at == 12.0
    out = replayer.due(15.0)
    assert out == [AgentStarted("a", "cc", 15.0, 15.0)]
    assert replayer.next_wakeup() == 16.0
    assert issues(replayer.due(20.0))["a.r1"].at == 16.0  # late polling keeps the exact issue time


def test_open_loop_admission_cap_queues_arrivals_and_charges_the_wait() -> None:
    trace = trace_from_records(
        [
            agent("a", 0.0),
            req("a.r1", "a.main"),
            agent("b", 1.0),
            req("b.r1", "b.main", delay=0.5),
            req("b.r2", "b.main", ["b.r1"], delay=2.0),
            agent("c", 2.0),
            req("c.r1", "c.main"),
        ]
    )
    replayer = AgentReplayer(trace, ReplayMode.open_loop(max_active=1))
    replayer.start(0.0)
    assert replayer.due(3.0) == []  # b and c arrived but wait for admission
    assert replayer.waiting_agents == 2 and replayer.active_agents == 1
    out = replayer.completed("a.r1", 5.0)
    assert out[:2] == [BranchEnded("a.main", "a", 5.0), AgentFinished("a", "cc", 5.0)]
    assert out[2] == AgentStarted("b", "cc", 5.0, 1.0)  # FIFO: b arrived first
    assert replayer.waiting_agents == 1
    b1 = issues(replayer.due(5.5))["b.r1"]
    assert (b1.at, b1.since) == (5.5, 1.5)  # latency counts from arrival + delay
    replayer.completed("b.r1", 6.0)
    b2 = issues(replayer.due(8.0))["b.r2"]
    assert (b2.at, b2.since) == (8.0, 8.0)  # only the first requests carry the admission wait
    out = replayer.completed("b.r2", 9.0)
    assert AgentStarted("c", "cc", 9.0, 2.0) in out
    assert issues(out)["c.r1"].since == 2.0
    replayer.completed("c.r1", 9.5)
    assert replayer.done and replayer.exhausted


def test_open_loop_arrivals_override_start_s() -> None:
    trace = trace_from_records([agent("a", 100.0), req("a.r1", "a.main"), agent("b", 0.0), req("b.r1", "b.main")])
    replayer = AgentReplayer(trace, ReplayMode.open_loop(arrivals=[1.0, 2.0]))
    replayer.start(0.0)
    assert [e.agent for e in replayer.due(1.0) if isinstance(e, AgentStarted)] == ["a"]
    assert [e.agent for e in replayer.due(2.0) if isinstance(e, AgentStarted)] == ["b"]
    with pytest.raises(ValueError, match="one per agent"):
        AgentReplayer(trace, ReplayMode.open_loop(arrivals=[1.0]))


# -- the protocol, without the loader ------------------------------------------------------------------


@dataclass(frozen=True)
class A:
    agent: str
    workload: str = "w"
    start_s: float = 0.0


@dataclass(frozen=True)
class R:
    id: str
    agent: str
    branch: str
    after: tuple[str, ...] = ()
    delay_s: float = 0.0
    prompt_tokens: int = 8
    output_tokens: int = 2


@dataclass(frozen=True)
class E:
    branch: str
    after: str


@dataclass
class T:
    agents: list[A]
    requests: list[R]
    branch_ends: list[E] = field(default_factory=list)


def test_agents_without_requests_finish_at_start_and_free_their_slot() -> None:
    trace = T([A("a"), A("b"), A("c")], [R("c.1", "c", "c.m")])
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(1))
    out = replayer.start(0.0)
    assert [type(e).__name__ for e in out] == [
        "AgentStarted", "AgentFinished", "AgentStarted", "AgentFinished", "AgentStarted", "IssueRequest"
    ]
    replayer.completed("c.1", 1.0)
    assert replayer.done


def test_driver_protocol_errors_are_specific() -> None:
    trace = T([A("a")], [R("a.1", "a", "a.m"), R("a.2", "a", "a.m", ("a.1",), 1.0)])
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(1))
    with pytest.raises(ReplayError, match="call start"):
        replayer.due(0.0)
    replayer.start(0.0)
    with pytest.raises(ReplayError, match="already called"):
        replayer.start(0.0)
    with pytest.raises(ReplayError, match="no such request"):
        replayer.completed("zz", 1.0)
    with pytest.raises(ReplayError, match="waiting"):
        replayer.completed("a.2", 1.0)
    replayer.completed("a.1", 1.0)
    with pytest.raises(ReplayError, match="scheduled"):
        replayer.completed("a.2", 1.5)
    with pytest.raises(ReplayError, match="completed"):
        replayer.completed("a.1", 1.5)
    with pytest.raises(ReplayError, match="backwards"):
        replayer.due(0.5)


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        (T([A("a"), A("a")], []), "defined twice"),
        (T([A("a")], [R("a.1", "b", "m")]), "agent 'b', which is not defined"),
        (T([A("a")], [R("a.1", "a", "m", ("a.2",)), R("a.2", "a", "m")]), "not an earlier request"),
        (T([A("a"), A("b")], [R("a.1", "a", "m"), R("b.1", "b", "n", ("a.1",))]), "same agent"),
        (T([A("a"), A("b")], [R("a.1", "a", "m"), R("b.1", "b", "m")]), "belongs to agent 'a'"),
        (T([A("a")], [R("a.1", "a", "m", delay_s=-1.0)]), "delay_s must be finite and >= 0"),
        (T([A("a")], [R("a.1", "a", "m", output_tokens=0)]), "output_tokens must be >= 1"),
        (T([A("a")], [R("a.1", "a", "m")], [E("x", "a.1")]), "no request belongs"),
        (T([A("a")], [R("a.1", "a", "m"), R("a.2", "a", "n")], [E("m", "a.2")]), "not a request of this branch"),
        (T([A("a")], [R("a.1", "a", "m")], [E("m", "a.1"), E("m", "a.1")]), "already has a branch_end"),
        (T([A("a", start_s=-2.0)], []), "start_s"),
    ],
)
def test_plan_refuses_traces_that_cannot_be_replayed(trace: T, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        ReplayPlan.from_trace(trace)


def test_mode_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        ReplayMode.closed_loop(0)
    with pytest.raises(ValueError, match="max_active"):
        ReplayMode.open_loop(max_active=0)
    with pytest.raises(ValueError, match="arrivals"):
        ReplayMode.open_loop(arrivals=[-1.0])
    with pytest.raises(ValueError, match="concurrency"):
        ReplayMode(ReplayKind.CLOSED_LOOP)
    with pytest.raises(ValueError, match="open-loop options"):
        ReplayMode(ReplayKind.CLOSED_LOOP, concurrency=2, max_active=3)
    with pytest.raises(ValueError, match="takes no concurrency"):
        ReplayMode(ReplayKind.OPEN_LOOP, concurrency=2)
    for bad in (-1.0, math.inf, math.nan, True, "10"):
        with pytest.raises(ValueError, match="skip_late_s"):
            ReplayMode.closed_loop(2, skip_late_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="closed-loop option"):
        ReplayMode(ReplayKind.OPEN_LOOP, skip_late_s=10.0)
