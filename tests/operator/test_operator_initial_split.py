"""Placing collocated node agents: the initial split, a node that joins later, and a failed placement.

The end-to-end tests start REAL `evolving-infra node-agent serve` processes in collocated mode
(`node_agent_processes.start_agents`) and check, over each process's own `GetState`, the phase and the
switch generation the operator gave it. The pure planner gets hypothesis properties.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.node_agent.engine.outputs import SwitchState
from evolving_infra.operator import nodes, placement
from evolving_infra.operator.agents import AgentError, AgentState, AgentUnavailable
from evolving_infra.operator.reconcile import reconcile
from evolving_infra.operator.spec import InitialSplit
from evolving_infra.operator.status import NodeState, NodeStatus, TargetSplit, format_split


def _harness() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


H = _harness()
agents_mod = H.load_helper("fake_node_agent")
processes = H.load_helper("node_agent_processes")
NS = H.NAMESPACE


# --- the pure planner --------------------------------------------------------------------------------


def _node(name: str, phase: Phase = Phase.DECODE, generation: int = 0) -> NodeStatus:
    return NodeStatus(name=name, pod=f"pod-{name}", address=f"10.0.0.1:{name[-1]}", phase=phase, state=NodeState.SERVING, switch_generation=generation)


def _answer(name: str, mode: NodeMode, generation: int = 0) -> AgentState:
    return AgentState(node=name, mode=mode, switch_state=SwitchState.SERVING, generation=generation)


@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_with_no_node_placed_the_plan_is_the_initial_split_by_name(sizes: tuple[int, int]) -> None:
    count, prefill = sizes
    names = [f"node-{i:02d}" for i in range(count)]
    tracked = [_node(n) for n in reversed(names)]
    answers: dict[str, AgentState | AgentError] = {n: _answer(n, NodeMode.COLLOCATED) for n in names}
    plan = placement.plan_placement(tracked, answers, InitialSplit(prefill=prefill, decode=count - prefill), None)
    assert plan is not None and plan.initial
    assert [m.node for m in plan.moves] == names
    assert [m.target for m in plan.moves] == [Phase.PREFILL] * prefill + [Phase.DECODE] * (count - prefill)
    assert {m.generation for m in plan.moves} == {1}
    assert plan.split == format_split(prefill, count - prefill)


@given(
    st.lists(st.sampled_from([NodeMode.PREFILL, NodeMode.DECODE, NodeMode.COLLOCATED, None]), min_size=1, max_size=10),
    st.integers(0, 10),
    st.integers(0, 5),
)
def test_placement_moves_only_unplaced_nodes_and_reaches_the_split_where_it_can(
    modes: Sequence[NodeMode | None], want: int, generation: int
) -> None:
    """None: the agent does not answer and no switch ever placed it."""
    want = min(want, len(modes))
    names = [f"n{i}" for i in range(len(modes))]
    tracked = [_node(n, Phase.PREFILL if m is NodeMode.PREFILL else Phase.DECODE, generation if m in (NodeMode.PREFILL, NodeMode.DECODE) else 0)
               for n, m in zip(names, modes, strict=True)]  # fmt: skip
    answers: dict[str, AgentState | AgentError] = {
        n: _answer(n, m, generation) if m is not None else AgentUnavailable(n, "UNAVAILABLE", "down") for n, m in zip(names, modes, strict=True)
    }
    target = TargetSplit(prefill=want, decode=len(modes) - want, split=format_split(want, len(modes) - want), switch_generation=generation or 1)
    plan = placement.plan_placement(tracked, answers, InitialSplit(prefill=0, decode=len(modes)), target)
    if NodeMode.COLLOCATED not in modes:
        assert plan is None
        return
    assert plan is not None
    free = {n for n, m in zip(names, modes, strict=True) if m in (NodeMode.COLLOCATED, None)}
    assert {m.node for m in plan.moves} == free  # served phases are never moved here
    assert len({m.generation for m in plan.moves}) == 1 and plan.moves[0].generation > generation
    placed_prefill = sum(1 for m in modes if m is NodeMode.PREFILL)
    planned_prefill = sum(1 for m in plan.moves if m.target is Phase.PREFILL)
    assert placed_prefill + planned_prefill == min(max(want, placed_prefill), placed_prefill + len(free))
    assert plan.initial == (len(free) == len(modes))


def test_a_silent_node_a_switch_placed_keeps_its_phase() -> None:
    tracked = [_node("a", Phase.PREFILL, 3), _node("b")]
    answers: dict[str, AgentState | AgentError] = {"a": AgentUnavailable("a", "UNAVAILABLE", "down"), "b": _answer("b", NodeMode.COLLOCATED)}
    plan = placement.plan_placement(tracked, answers, InitialSplit(prefill=1, decode=1), None)
    assert plan is not None and not plan.initial
    assert [(m.node, m.target, m.generation) for m in plan.moves] == [("b", Phase.DECODE, 4)]


# --- real node agents -----------------------------------------------------------------------------------


@contextmanager
def _collocated_agents(names: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Real node agent processes started collocated (as in a pod), stopped with SIGTERM at the end."""
    handles = {hd.node: hd for hd in processes.start_agents(dict.fromkeys(names, NodeMode.COLLOCATED))}
    try:
        yield handles
    finally:
        codes = {node: handle.stop() for node, handle in handles.items()}
        assert all(code == 0 for code in codes.values()), f"node agents did not exit cleanly on SIGTERM: {codes}"


async def _cluster(h: Any, name: str, pool: str, prefill: int, decode: int, pods: Mapping[str, tuple[str, int]]) -> None:
    """Nodes `name-n0..`, the cluster, agent pods at `pods` (node -> host, port), the router available."""
    for i in range(prefill + decode):
        await h.add_node(f"{name}-n{i}", pool)
    await h.create(H.cluster_object(name, pool, prefill=prefill, decode=decode))
    await reconcile(h.rt, NS, name)  # the children (what the create handler does when the operator runs)
    await h.wait_for("router deployment", lambda: h.emulator.live("apps/v1/deployments", NS, f"{name}-router"))
    await h.router_available(name)
    for node, (host, port) in sorted(pods.items()):
        await h.add_agent_pod(name, node, host, port)


async def _status(h: Any, name: str) -> dict[str, Any]:
    return (await h.cluster(name)).get("status") or {}


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or ()}


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_new_cluster_of_collocated_agents_reaches_its_initial_split() -> None:
    names = ["init-n0", "init-n1", "init-n2"]
    with _collocated_agents(names) as handles:
        assert {hd.serving() for hd in handles.values()} == {(NodeMode.COLLOCATED, 0)}
        async with H.operator_running() as h:
            await _cluster(h, "init", "i", 1, 2, {n: (hd.host, hd.port) for n, hd in handles.items()})
            # The running operator's handlers or this reconcile (whichever holds the lock first) place them.
            await reconcile(h.rt, NS, "init")

            async def converged() -> Any:
                status = await _status(h, "init")
                return status if _conditions(status).get("Adapting", {}).get("reason") == "SplitConverged" else None

            status = await h.wait_for("the initial split", converged)
            assert (status["split"], status["prefill"], status["decode"]) == ("1P2D", 1, 2)
            # The first node by name serves prefill, the rest decode, each told so with generation 1.
            assert handles["init-n0"].serving() == (NodeMode.PREFILL, 1)
            assert handles["init-n1"].serving() == (NodeMode.DECODE, 1)
            assert handles["init-n2"].serving() == (NodeMode.DECODE, 1)
            by_name = {n["name"]: n for n in status["nodes"]}
            assert [(by_name[n]["phase"], by_name[n]["switchGeneration"], by_name[n]["state"]) for n in names] == [
                ("prefill", 1, "serving"), ("decode", 1, "serving"), ("decode", 1, "serving"),
            ]  # fmt: skip
            conds = _conditions(status)
            assert (conds["Adapting"]["status"], conds["Adapting"]["reason"]) == ("False", "SplitConverged")
            assert "initial split 1P2D" in conds["Adapting"]["message"]
            assert conds["Degraded"]["status"] == "False" and conds["Ready"]["status"] == "True"
            assert "targetSplit" not in status  # the router's field stays the router's
            await h.wait_for("events", lambda: len(h.events_of("PhaseSwitched")) == 3 and h.events_of("InitialSplit"))
            messages = sorted(e["message"].split(" in ")[0] for e in h.events_of("PhaseSwitched"))
            assert messages == ["node init-n0: collocated -> prefill", "node init-n1: collocated -> decode", "node init-n2: collocated -> decode"]
            assert all("generation 1" in e["message"] for e in h.events_of("PhaseSwitched"))
            # Done: reconciling again calls no agent's SwitchPhase and writes nothing.
            writes = len(h.emulator.writes())
            again = await reconcile(h.rt, NS, "init", attempt=0)
            assert again is not None and not again.status_written and again.placed == ()
            assert len(h.emulator.writes()) == writes
            assert handles["init-n0"].serving() == (NodeMode.PREFILL, 1)
            assert len([e for e in h.events if e[1] == "PhaseSwitched"]) == 3


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_node_that_joins_later_takes_the_phase_the_split_lacks() -> None:
    names = ["join-n0", "join-n1", "join-n2"]
    with _collocated_agents(names) as handles:
        async with H.operator_running(run=False) as h:
            first = {n: (handles[n].host, handles[n].port) for n in names[:2]}
            await _cluster(h, "join", "j", 2, 1, first)
            outcome = await reconcile(h.rt, NS, "join")
            assert outcome is not None and outcome.placed == ("join-n0", "join-n1")
            assert (await _status(h, "join"))["split"] == "2P0D"
            assert handles["join-n1"].serving() == (NodeMode.PREFILL, 1)
            # The DaemonSet pod of the third node appears: it takes decode, the phase the split lacks.
            await h.add_agent_pod("join", "join-n2", handles["join-n2"].host, handles["join-n2"].port)
            outcome = await reconcile(h.rt, NS, "join")
            assert outcome is not None and outcome.placed == ("join-n2",)
            assert handles["join-n2"].serving() == (NodeMode.DECODE, 2)
            assert handles["join-n0"].serving() == (NodeMode.PREFILL, 1)
            assert (await _status(h, "join"))["split"] == "2P1D"
            assert [e[1] for e in h.events if e[0] == "Normal"] == ["PhaseSwitched", "PhaseSwitched", "InitialSplit", "PhaseSwitched", "NodePlaced"]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_an_unreachable_agent_is_retried_then_degrades_the_cluster() -> None:
    names = ["down-n1", "down-n2"]
    with _collocated_agents(names) as handles:
        async with H.operator_running(run=False) as h:
            pods = {n: (hd.host, hd.port) for n, hd in handles.items()} | {"down-n0": ("127.0.0.1", agents_mod.free_port())}
            await _cluster(h, "down", "d", 1, 2, pods)
            outcome = await reconcile(h.rt, NS, "down", attempt=0)
            assert outcome is not None and outcome.retry_delay == h.rt.settings.switch_backoff(0)
            # n0 (first by name) is planned prefill but cannot be told; the others are placed already.
            assert outcome.placed == ("down-n1", "down-n2")
            assert handles["down-n1"].serving() == (NodeMode.DECODE, 1)
            status = await _status(h, "down")
            conds = _conditions(status)
            assert (conds["Adapting"]["status"], conds["Adapting"]["reason"]) == ("True", "PlacementRetrying")
            assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", "PlacementFailed")
            assert "down-n0" in conds["Degraded"]["message"] and "attempt 1 of 3" in conds["Degraded"]["message"]
            # The last attempt gives up until the next resync: Adapting False, still Degraded, no crash.
            outcome = await reconcile(h.rt, NS, "down", attempt=2)
            assert outcome is not None and outcome.retry_delay is None and outcome.placed == ()
            conds = _conditions(await _status(h, "down"))
            assert (conds["Adapting"]["status"], conds["Adapting"]["reason"]) == ("False", "PlacementFailed")
            assert conds["Degraded"]["reason"] == "PlacementFailed"
            assert [e[1] for e in h.events if e[0] == "Warning"] == ["PlacementFailed"]
            assert nodes.count([NodeStatus.model_validate(n) for n in (await _status(h, "down"))["nodes"]]) == (1, 2)
