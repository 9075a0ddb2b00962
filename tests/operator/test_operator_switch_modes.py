"""The operator carries a target split's switch mode to the node agents: the planned moves take the target's mode
and relaunch downtime, `call_moves` passes them to SwitchPhase, and against a live node agent a relaunch answers
once the node serves again while GetState calls the node unavailable (RELAUNCHING) meanwhile."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from evolving_infra.core.types import NodeMode, Phase, SwitchMode
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.operator import switch_plan
from evolving_infra.operator.agents import AgentRejected, AgentUnavailable, GrpcNodeAgentClient, SwitchResult
from evolving_infra.operator.placement import call_moves
from evolving_infra.operator.status import NodeState, NodeStatus, TargetSplit


def _nodes() -> list[NodeStatus]:
    return [
        NodeStatus(name=f"n{i}", address=f"10.0.0.{i}:50051", phase=phase, state=NodeState.SERVING, switch_generation=1)
        for i, phase in enumerate([Phase.PREFILL, Phase.PREFILL, Phase.DECODE])
    ]


@pytest.mark.parametrize(("mode", "downtime"), [(SwitchMode.RELAUNCH, 42.0), (SwitchMode.IN_PLACE_STRAND_KV, 0.0),
                                                (SwitchMode.IN_PLACE, 0.0)])  # fmt: skip
def test_planned_moves_carry_the_targets_mode_and_downtime_and_rollbacks_switch_in_place(mode: SwitchMode, downtime: float) -> None:
    target = TargetSplit(prefill=1, decode=2, split="1P2D", switch_generation=2, moving=["n0"], mode=mode,
                         relaunch_seconds=downtime)  # fmt: skip
    plan = switch_plan.plan_switch(_nodes(), target)
    assert [(m.node, m.target, m.mode, m.relaunch_s) for m in plan.moves] == [("n0", Phase.DECODE, mode, downtime)]
    switched = switch_plan.apply_move(_nodes(), plan.moves[0])
    assert all(m.mode is SwitchMode.IN_PLACE and m.relaunch_s == 0 for m in switch_plan.plan_rollback(switched, 2))


class RecordingAgents:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def switch_phase(self, address: str, target: Phase, generation: int, **how: Any) -> SwitchResult:
        self.calls.append((address, target, generation, how))
        return SwitchResult(target, generation, 0.0, 0.0, 0, False)


def test_call_moves_passes_the_mode_only_when_it_is_not_in_place() -> None:
    agents = RecordingAgents()
    rt: Any = SimpleNamespace(agents=agents, settings=SimpleNamespace(agent_concurrency=4))
    moves = [
        switch_plan.Move("a", "h:1", Phase.PREFILL, Phase.DECODE, 3),
        switch_plan.Move("b", "h:2", Phase.PREFILL, Phase.DECODE, 3, SwitchMode.RELAUNCH, 7.5),
    ]
    asyncio.run(call_moves(rt, moves))
    assert agents.calls == [
        ("h:1", Phase.DECODE, 3, {}),
        ("h:2", Phase.DECODE, 3, {"mode": SwitchMode.RELAUNCH, "relaunch_s": 7.5}),
    ]


async def _relaunch() -> dict[str, Any]:
    node = NodeAgent(NodeAgentSettings(
        node="op", mode=NodeMode.PREFILL, grpc_port=0, metrics_port=0, metrics_enabled=False, speed_up=4.0,
        l1_pages=256, l2_pages=256, page_bytes=4096, state_interval_s=0, insecure=True,
    ))  # fmt: skip
    await node.start()
    agents = GrpcNodeAgentClient(switch_deadline=10.0, state_deadline=5.0)
    out: dict[str, Any] = {}
    try:
        call = asyncio.ensure_future(agents.switch_phase(node.address, Phase.DECODE, 1, SwitchMode.RELAUNCH, 4.0))
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while not node.relaunching and loop.time() < end:
            await asyncio.sleep(0.01)
        try:
            await agents.get_state(node.address)
        except AgentUnavailable as error:
            out["during"] = error.code
        result = await call
        out["result"] = (result.phase, result.generation, result.switch_seconds >= 4.0)
        state = await agents.get_state(node.address)
        out["after"] = (state.mode, state.generation)
        try:
            await agents.switch_phase(node.address, Phase.PREFILL, 2, SwitchMode.IN_PLACE, 3.0)
        except AgentRejected as error:
            out["bad"] = error.code
    finally:
        agents.close()
        await node.close(grace=None)
    return out


def test_a_relaunch_through_the_operators_client_answers_once_the_node_serves_again() -> None:
    out = asyncio.run(asyncio.wait_for(_relaunch(), 60))
    assert out["during"] == "RELAUNCHING"
    assert out["result"] == (Phase.DECODE, 1, True)
    assert out["after"] == (NodeMode.DECODE, 1)
    assert out["bad"] == "BAD_SWITCH_MODE"
