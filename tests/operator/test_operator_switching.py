"""Properties of the switch protocol's decisions, node tracking and condition bookkeeping (pure parts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.node_agent.engine.outputs import SwitchState
from evolving_infra.operator import conditions, nodes, switch_plan
from evolving_infra.operator.agents import AgentState, AgentUnavailable
from evolving_infra.operator.conditions import Want
from evolving_infra.operator.settings import OperatorSettings
from evolving_infra.operator.spec import InitialSplit
from evolving_infra.operator.status import ConditionStatus, ConditionType, NodeState, NodeStatus, TargetSplit, format_split

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeStatus], int]:
    """Tracked nodes (random phases, some unreachable) and a generation newer than all of theirs."""
    size = draw(st.integers(1, 12))
    old = draw(st.integers(0, 5))
    out = [
        NodeStatus(
            name=f"n{i:02d}",
            address=f"10.0.0.{i}:50051",
            phase=draw(st.sampled_from(list(Phase))),
            state=draw(st.sampled_from([NodeState.SERVING, NodeState.UNREACHABLE])),
            switch_generation=old,
        )
        for i in range(size)
    ]
    return out, old + draw(st.integers(1, 3))


def _target(prefill: int, total: int, generation: int, moving: list[str] | None = None) -> TargetSplit:
    return TargetSplit(
        prefill=prefill, decode=total - prefill, split=format_split(prefill, total - prefill),
        switch_generation=generation, moving=moving or [],
    )  # fmt: skip


def _apply(tracked: list[NodeStatus], moves: tuple[switch_plan.Move, ...]) -> list[NodeStatus]:
    for move in moves:
        tracked = switch_plan.apply_move(tracked, move)
    return tracked


@given(clusters(), st.data())
def test_a_plan_reaches_the_target_with_the_fewest_moves(cluster: tuple[list[NodeStatus], int], data: st.DataObject) -> None:
    tracked, g = cluster
    prefill = data.draw(st.integers(0, len(tracked)))
    plan = switch_plan.plan_switch(tracked, _target(prefill, len(tracked), g))
    assert not plan.problems and not plan.stale
    before, _ = nodes.count(tracked)
    assert len(plan.moves) == abs(prefill - before)
    assert len({m.node for m in plan.moves}) == len(plan.moves)
    assert all(m.generation == g and m.target is switch_plan.flip(m.source) for m in plan.moves)
    assert nodes.count(_apply(tracked, plan.moves))[0] == prefill
    chosen = {m.node for m in plan.moves}
    if any(n.state is NodeState.UNREACHABLE for n in tracked if n.name in chosen):
        source = plan.moves[0].source
        passed_over = [n for n in tracked if n.name not in chosen and n.phase is source]
        assert all(n.state is NodeState.UNREACHABLE for n in passed_over)  # reachable nodes are chosen first


@given(clusters(), st.data())
def test_a_retry_makes_only_the_moves_still_missing(cluster: tuple[list[NodeStatus], int], data: st.DataObject) -> None:
    tracked, g = cluster
    prefill = data.draw(st.integers(0, len(tracked)))
    target = _target(prefill, len(tracked), g)
    first = switch_plan.plan_switch(tracked, target)
    done = data.draw(st.lists(st.sampled_from(first.moves), unique=True)) if first.moves else []
    second = switch_plan.plan_switch(_apply(tracked, tuple(done)), target)
    assert set(second.moves) == set(first.moves) - set(done)
    assert set(second.switched) == {m.node for m in done}
    assert switch_plan.plan_switch(_apply(tracked, first.moves), target).done


@given(clusters(), st.data())
def test_a_moving_list_is_followed_or_refused(cluster: tuple[list[NodeStatus], int], data: st.DataObject) -> None:
    tracked, g = cluster
    moving = data.draw(st.lists(st.sampled_from([n.name for n in tracked]), unique=True, min_size=1))  # empty: operator picks
    flipped = _apply(tracked, tuple(switch_plan.Move(n.name, n.address, n.phase, switch_plan.flip(n.phase), g) for n in tracked if n.name in moving))
    reached = nodes.count(flipped)[0]
    prefill = data.draw(st.integers(0, len(tracked)))
    plan = switch_plan.plan_switch(tracked, _target(prefill, len(tracked), g, moving))
    if prefill == reached:
        assert {m.node for m in plan.moves} == set(moving) and not plan.problems
    else:
        assert plan.problems and not plan.moves


@given(clusters(), st.data())
def test_a_rollback_restores_every_switched_node_and_makes_the_target_stale(cluster: tuple[list[NodeStatus], int], data: st.DataObject) -> None:
    tracked, g = cluster
    target = _target(data.draw(st.integers(0, len(tracked))), len(tracked), g)
    plan = switch_plan.plan_switch(tracked, target)
    done = data.draw(st.lists(st.sampled_from(plan.moves), unique=True)) if plan.moves else []
    back = switch_plan.plan_rollback(_apply(tracked, tuple(done)), g)
    assert {m.node for m in back} == {m.node for m in done}
    assert all(m.generation == g + 1 for m in back)
    restored = _apply(_apply(tracked, tuple(done)), back)
    assert [n.phase for n in restored] == [n.phase for n in tracked]
    again = switch_plan.plan_switch(restored, target)
    assert again.stale == bool(done) and (not again.moves if done else True)


def test_a_target_older_than_a_node_moves_nothing() -> None:
    tracked = [NodeStatus(name="a", phase=Phase.PREFILL, state=NodeState.SERVING, switch_generation=7)]
    plan = switch_plan.plan_switch(tracked, _target(0, 1, 6))
    assert plan.stale and not plan.moves and "older than node(s) a" in plan.problems[0]
    assert "tracks 1" in switch_plan.plan_switch(tracked, _target(1, 2, 8)).problems[0]
    fresh = [NodeStatus(name="a", phase=Phase.PREFILL, state=NodeState.SERVING)]
    assert switch_plan.plan_switch(fresh, _target(0, 1, 0)).stale  # generation 0 would be ambiguous on retry
    assert switch_plan.plan_switch(fresh, _target(0, 1, 1)).moves[0].node == "a"


def test_unknown_nodes_fill_the_initial_split_and_agents_win() -> None:
    pods = {f"n{i}": nodes.AgentPod(f"n{i}", f"p{i}", f"10.0.0.{i}:1", True) for i in range(4)}
    answers = {
        "n3": AgentState("n3", NodeMode.PREFILL, SwitchState.SERVING, 2),
        "n1": AgentUnavailable("10.0.0.1:1", "UNAVAILABLE", "down"),
    }
    tracked = nodes.track(pods, None, answers, InitialSplit(prefill=2, decode=2))
    assert [(n.name, n.phase, n.state, n.switch_generation) for n in tracked] == [
        ("n0", Phase.PREFILL, NodeState.UNREACHABLE, 0),
        ("n1", Phase.DECODE, NodeState.UNREACHABLE, 0),
        ("n2", Phase.DECODE, NodeState.UNREACHABLE, 0),
        ("n3", Phase.PREFILL, NodeState.SERVING, 2),
    ]
    # Known phases stick when the agent cannot tell.
    again = nodes.track(pods, tracked, {}, InitialSplit(prefill=4, decode=0))
    assert [n.phase for n in again] == [n.phase for n in tracked]


def test_pods_give_addresses_from_their_grpc_port() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n", "containers": [{"ports": [{"name": "grpc", "containerPort": 7000}]}]},
        "status": {"podIP": "fd00::1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert nodes.agent_pod(pod, 50051) == nodes.AgentPod("n", "p", "[fd00::1]:7000", True)
    assert nodes.agent_pod({**pod, "spec": {}}, 50051) is None


@given(st.lists(st.tuples(st.sampled_from(list(ConditionType)), st.booleans(), st.sampled_from(["A", "B"])), max_size=12))
def test_conditions_change_their_time_only_on_a_status_change(steps: list[tuple[ConditionType, bool, str]]) -> None:
    current: list = []
    for i, (ctype, value, reason) in enumerate(steps):
        want = Want(ctype, ConditionStatus.TRUE if value else ConditionStatus.FALSE, reason)
        old = conditions.find(current, ctype)
        now = T0 + timedelta(seconds=i + 1)
        merged = conditions.merge(current, [want], now, 1)
        new = conditions.find(merged, ctype)
        assert new is not None and new.status is want.status and new.reason == reason
        if old is not None and old.status is want.status:
            assert new.last_transition_time == old.last_transition_time
        else:
            assert new.last_transition_time == now
        assert conditions.merge(merged, [want], now + timedelta(seconds=5), 1) == merged
        assert [c.type for c in merged] == [t for t in ConditionType if conditions.find(merged, t)]
        current = merged


def test_backoff_doubles_up_to_its_cap() -> None:
    settings = OperatorSettings(switch_backoff_seconds=2, switch_backoff_max_seconds=10)
    assert [settings.switch_backoff(a) for a in range(5)] == [2, 4, 8, 10, 10]
