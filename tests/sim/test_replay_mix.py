"""Closed-loop replay holding the running agents' mix of workloads to a schedule (`AgentMix`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.sim.replay import (
    AgentFinished,
    AgentMix,
    AgentReplayer,
    AgentStarted,
    IssueRequest,
    ReplayMode,
    StreamedPlan,
)
from evolving_infra.sim.replay_loop import run_replay
from evolving_infra.traces.loader import trace_from_records

from .test_sim_replay import agent, req


def two_workloads(labels: list[str], starts: list[float] | None = None) -> Any:
    """One single-request agent per label, in file order."""
    records: list[dict[str, Any]] = []
    for i, label in enumerate(labels):
        records += [agent(f"g{i}", starts[i] if starts else 0.0, label), req(f"g{i}.r1", f"g{i}.main")]
    return trace_from_records(records)


def running_by_label(effects: list[Any]) -> list[tuple[float, dict[str, int]]]:
    """After each batch of effects at one time: the running agents per label."""
    running: dict[str, int] = {}
    out: list[tuple[float, dict[str, int]]] = []
    for e in effects:
        if isinstance(e, AgentStarted):
            running[e.workload] = running.get(e.workload, 0) + 1
        elif isinstance(e, AgentFinished):
            running[e.workload] -= 1
        else:
            continue
        if out and out[-1][0] == e.at:
            out[-1] = (e.at, dict(running))
        else:
            out.append((e.at, dict(running)))
    return out


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.sampled_from(["cc", "codex"]), min_size=30, max_size=120),
    share=st.sampled_from([0.2, 0.5, 0.75]),
    n=st.integers(2, 12),
    durations=st.lists(st.floats(1.0, 50.0), min_size=1, max_size=20),
)
def test_a_constant_mix_holds_every_label_within_one_agent_of_its_share(
    labels: list[str], share: float, n: int, durations: list[float]
) -> None:
    trace = two_workloads(labels)
    mix = AgentMix.of(100.0, {"cc": [share], "codex": [1.0 - share]})
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(n, mix=mix))
    log = run_replay(replayer, lambda spec: durations[spec.index % len(durations)] * (1 + (spec.index % 3)))
    assert replayer.done and replayer.skipped_agents == 0
    started = [e.agent for e in log.effects if isinstance(e, AgentStarted)]
    assert sorted(started) == sorted(f"g{i}" for i in range(len(labels)))  # every agent started exactly once
    issued = [e.request.id for e in log.effects if isinstance(e, IssueRequest)]
    assert len(issued) == len(set(issued)) == len(labels)
    # Each label's agents start in file order.
    for label in ("cc", "codex"):
        mine = [f"g{i}" for i, lab in enumerate(labels) if lab == label]
        assert [a for a in started if a in mine] == mine
    # Until one label has started its last agent, the running mix is the schedule's within one agent.
    start_at = {e.agent: e.at for e in log.effects if isinstance(e, AgentStarted)}
    last = {label: max(i for i, lab in enumerate(labels) if lab == label) for label in set(labels)}
    t_exhausted = min(start_at[f"g{i}"] for i in last.values()) if len(last) == 2 else 0.0
    for at, running in running_by_label(log.effects):
        if at >= t_exhausted:
            break
        for label, target in (("cc", share), ("codex", 1.0 - share)):
            assert abs(running.get(label, 0) - target * n) <= 1.0, (at, running)


def test_the_running_mix_follows_a_moving_schedule_where_file_order_does_not() -> None:
    # 400 agents, cc and codex alternating in the file; cc tasks last four times as long as codex ones.
    labels = ["cc" if i % 2 == 0 else "codex" for i in range(400)]
    trace = two_workloads(labels)

    def service(spec: Any) -> float:
        return 40.0 if spec.index % 2 == 0 else 10.0

    mix = AgentMix.of(100.0, {"cc": [0.2, 0.2, 0.8], "codex": [0.8, 0.8, 0.2]})
    following = running_by_label(run_replay(AgentReplayer(trace, ReplayMode.closed_loop(10, mix=mix)), service).effects)
    plain = running_by_label(run_replay(AgentReplayer(trace, ReplayMode.closed_loop(10)), service).effects)

    def cc_at(series: list[tuple[float, dict[str, int]]], t: float) -> int:
        return [r for at, r in series if at <= t][-1].get("cc", 0)

    assert cc_at(following, 0.0) == 2 and cc_at(following, 90.0) == 2  # the scheduled 20 % from the first fill
    assert cc_at(following, 250.0) == 8  # and 80 % once the schedule has moved
    assert cc_at(plain, 0.0) == 5 and cc_at(plain, 90.0) == 8  # file order: half, then long tasks pile up


def test_a_label_out_of_agents_yields_its_slots_and_the_run_ends() -> None:
    trace = two_workloads(["cc"] * 3 + ["codex"] * 20)
    mix = AgentMix.of(10.0, {"cc": [0.5], "codex": [0.5]})
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(4, mix=mix))
    first = replayer.start(0.0)
    assert [e.agent for e in first if isinstance(e, AgentStarted)] == ["g0", "g3", "g1", "g4"]
    log = run_replay(AgentReplayer(trace, ReplayMode.closed_loop(4, mix=mix)), lambda spec: 1.0)
    assert sum(isinstance(e, AgentFinished) for e in log.effects) == 23


def test_unnamed_labels_start_only_when_the_named_ones_have_none_left() -> None:
    trace = two_workloads(["other", "cc", "other", "cc"])
    mix = AgentMix.of(10.0, {"cc": [1.0]})
    log = run_replay(AgentReplayer(trace, ReplayMode.closed_loop(1, mix=mix)), lambda spec: 1.0)
    assert [e.agent for e in log.effects if isinstance(e, AgentStarted)] == ["g1", "g3", "g0", "g2"]


def test_late_agents_are_skipped_in_their_label_turn_too() -> None:
    trace = two_workloads(["cc", "codex", "cc", "codex", "cc", "codex"], [0.0, 0.0, 0.0, 50.0, 50.0, 50.0])
    mix = AgentMix.of(10.0, {"cc": [0.5], "codex": [0.5]})
    replayer = AgentReplayer(trace, ReplayMode.closed_loop(2, skip_late_s=5.0, mix=mix))
    log = run_replay(replayer, lambda spec: 30.0)
    started = [e.agent for e in log.effects if isinstance(e, AgentStarted)]
    # At 30 s, g2 (cc, due at 0 s) is too late and g4 takes the cc slot (g3 waits for codex's turn); at 60 s the
    # codex slot's waiting g5 (due at 50 s) is too late too.
    assert started == ["g0", "g1", "g4", "g3"]
    assert replayer.skipped_agents == 2 and replayer.done


def test_a_streamed_plan_replays_a_mix_as_the_whole_plan_does() -> None:
    from evolving_infra.traces.growing import GrowingTrace

    labels = ["cc" if i % 3 else "codex" for i in range(40)]
    head = [{"kind": "header", "version": 1, "name": "mix"}]

    def block(i: int) -> list[dict[str, Any]]:
        return [agent(f"g{i}", 0.0, labels[i]), req(f"g{i}.r1", f"g{i}.main")]

    mix = AgentMix.of(20.0, {"cc": [0.3, 0.7], "codex": [0.7, 0.3]})

    def service(spec: Any) -> float:
        return 5.0 + spec.index % 7

    whole = run_replay(AgentReplayer(two_workloads(labels), ReplayMode.closed_loop(6, mix=mix)), service)
    streamed = run_replay(
        AgentReplayer(StreamedPlan(GrowingTrace(head, block, len(labels))), ReplayMode.closed_loop(6, mix=mix)),
        service,
    )
    assert [(type(e), getattr(e, "agent", None), e.at) for e in whole.effects if not isinstance(e, IssueRequest)] == [
        (type(e), getattr(e, "agent", None), e.at) for e in streamed.effects if not isinstance(e, IssueRequest)
    ]


@pytest.mark.parametrize(
    ("step", "shares", "match"),
    [
        (0.0, {"cc": [1.0]}, "step_s"),
        (10.0, {}, "at least one"),
        (10.0, {"cc": [0.5, 0.6], "codex": [0.5]}, "same number"),
        (10.0, {"cc": [1.2], "codex": [-0.2]}, r"\[0, 1\]"),
        (10.0, {"cc": [0.5, 0.7], "codex": [0.5, 0.2]}, "point 1 add up to 0.9"),
    ],
)
def test_a_malformed_mix_is_refused_naming_the_problem(step: float, shares: dict[str, list[float]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AgentMix.of(step, shares)


def test_mix_is_a_closed_loop_option_and_interpolates_between_points() -> None:
    mix = AgentMix.of(100.0, {"cc": [0.2, 0.6], "codex": [0.8, 0.4]})
    assert mix.at(-5.0) == {"cc": 0.2, "codex": 0.8}
    assert mix.at(50.0) == pytest.approx({"cc": 0.4, "codex": 0.6})
    assert mix.at(1e6) == {"cc": 0.6, "codex": 0.4}
    with pytest.raises(ValueError, match="closed-loop option"):
        ReplayMode(ReplayMode.open_loop().kind, mix=mix)
