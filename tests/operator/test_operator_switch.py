"""The phase-switch protocol end to end: a target split in status drives SwitchPhase on gRPC node agents.

The node agents are real `evolving-infra node-agent serve` processes on 127.0.0.1 (emulated engine, small
memory, sped up; `node_agent_processes.start_agents`), started before the operator and stopped with
SIGTERM afterwards; the operator reaches them at the addresses it reads from their pods, and the tests ask
each process over `GetState` what it serves afterwards. Tests that need a failure a real agent does not
produce on demand (an UNAVAILABLE answer, a refusal of one target) use the fake servicer
(`fake_node_agent.start_agents`) and say so.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.operator import kube
from evolving_infra.operator.reconcile import reconcile


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


def target(prefill: int, decode: int, generation: int, moving: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"prefill": prefill, "decode": decode, "split": f"{prefill}P{decode}D", "switchGeneration": generation}
    if moving is not None:
        out["moving"] = moving
    return out


def _phases(name: str, unreachable: tuple[str, ...] = ()) -> dict[str, Phase]:
    """3 nodes: n0 and n1 prefill, n2 decode (minus the `unreachable` ones, which get no agent)."""
    phases = {f"{name}-n{i}": Phase.PREFILL if i < 2 else Phase.DECODE for i in range(3)}
    return {n: p for n, p in phases.items() if n not in unreachable}


@contextmanager
def _real_agents(name: str, unreachable: tuple[str, ...] = ()) -> Iterator[dict[str, Any]]:
    """Real node agent processes for the cluster's nodes, stopped (SIGTERM, bounded wait) at the end."""
    handles = {hd.node: hd for hd in processes.start_agents(_phases(name, unreachable))}
    try:
        yield handles
    finally:
        codes = {node: handle.stop() for node, handle in handles.items()}
        assert all(code == 0 for code in codes.values()), f"node agents did not exit cleanly on SIGTERM: {codes}"


async def _cluster(h: Any, name: str, pool: str, handles: Mapping[str, Any], unreachable: tuple[str, ...] = ()) -> None:
    """The cluster's 3 nodes, their agent pods at `handles` (a dead port for `unreachable` ones), router up."""
    nodes = sorted(_phases(name))
    for node in nodes:
        await h.add_node(node, pool)
    await h.create(H.cluster_object(name, pool))
    for node in nodes:
        if node in handles:
            await h.add_agent_pod(name, node, handles[node].host, handles[node].port)
        else:
            assert node in unreachable
            await h.add_agent_pod(name, node, "127.0.0.1", agents_mod.free_port())
    await h.wait_for("router deployment", lambda: h.emulator.live("apps/v1/deployments", NS, f"{name}-router"))
    await h.router_available(name)
    await reconcile(h.rt, NS, name)


async def _status(h: Any, name: str) -> dict[str, Any]:
    return (await h.cluster(name)).get("status") or {}


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or ()}


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_target_split_switches_the_moving_nodes_and_the_split_follows() -> None:
    with _real_agents("alpha") as handles:
        async with H.operator_running() as h:
            await _cluster(h, "alpha", "a", handles)
            assert (await _status(h, "alpha"))["split"] == "2P1D"
            await h.patch_status("alpha", {"targetSplit": target(1, 2, 1, ["alpha-n1"])})

            async def split_is(want: str) -> Any:
                status = await _status(h, "alpha")
                return status if status.get("split") == want and _conditions(status)["Adapting"]["status"] == "False" else None

            status = await h.wait_for("1P2D", lambda: split_is("1P2D"))
            # Each process serves what the operator asked; the others were never called (generation 0).
            assert handles["alpha-n1"].serving() == (NodeMode.DECODE, 1)
            assert handles["alpha-n0"].serving() == (NodeMode.PREFILL, 0)
            assert handles["alpha-n2"].serving() == (NodeMode.DECODE, 0)
            assert (status["prefill"], status["decode"], status["adapting"]) == (1, 2, False)
            nodes = {n["name"]: n for n in status["nodes"]}
            assert (nodes["alpha-n1"]["phase"], nodes["alpha-n1"]["switchGeneration"], nodes["alpha-n1"]["state"]) == ("decode", 1, "serving")
            assert _conditions(status)["Adapting"]["reason"] == "SplitConverged"
            assert status["targetSplit"]["split"] == "1P2D"  # the router's field is left alone
            await h.wait_for("event", lambda: h.events_of("PhaseSwitched"))
            (event,) = h.events_of("PhaseSwitched")
            assert event["type"] == "Normal" and event["involvedObject"]["name"] == "alpha"
            assert event["message"].startswith("node alpha-n1: prefill -> decode in ")
            assert "drain" in event["message"] and "generation 1" in event["message"]

            # Without a list of moving nodes the operator picks the fewest that reach the target.
            await h.patch_status("alpha", {"targetSplit": target(2, 1, 2)})
            await h.wait_for("2P1D", lambda: split_is("2P1D"))
            assert handles["alpha-n1"].serving() == (NodeMode.PREFILL, 2)
            assert handles["alpha-n0"].serving() == (NodeMode.PREFILL, 0)
            assert handles["alpha-n2"].serving() == (NodeMode.DECODE, 0)
            await h.wait_for("second event", lambda: len(h.events_of("PhaseSwitched")) == 2)
            assert [e["message"].split(" in ")[0] for e in h.events_of("PhaseSwitched")] == [
                "node alpha-n1: prefill -> decode", "node alpha-n1: decode -> prefill",
            ]  # fmt: skip
            assert len(h.events_of("SplitChanged")) == 2


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_failed_switch_is_retried_with_backoff() -> None:
    """Fake agents: a real node agent does not answer UNAVAILABLE once on demand."""
    async with H.operator_running() as h:
        handles = {hd.node: hd for hd in agents_mod.start_agents(_phases("beta"))}
        try:
            await _cluster(h, "beta", "b", handles)
            handles["beta-n0"].state.fail_switches = 1
            await h.patch_status("beta", {"targetSplit": target(1, 2, 5, ["beta-n0"])})

            async def converged() -> Any:
                status = await _status(h, "beta")
                return status.get("split") == "1P2D" and _conditions(status)["Adapting"]["reason"] == "SplitConverged"

            await h.wait_for("1P2D after a retry", converged)
            assert handles["beta-n0"].state.calls == [(Phase.DECODE, 5), (Phase.DECODE, 5)]
            assert _conditions(await _status(h, "beta"))["Degraded"]["status"] == "False"
        finally:
            for handle in handles.values():
                handle.stop()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_an_unreachable_agent_degrades_the_cluster_and_its_switch_is_rolled_back() -> None:
    with _real_agents("gamma", unreachable=("gamma-n0",)) as handles:
        async with H.operator_running() as h:
            await _cluster(h, "gamma", "c", handles, unreachable=("gamma-n0",))
            status = await _status(h, "gamma")
            nodes = {n["name"]: n for n in status["nodes"]}
            assert nodes["gamma-n0"]["state"] == "unreachable"
            degraded = _conditions(status)["Degraded"]
            assert (degraded["status"], degraded["reason"]) == ("True", "NodeAgentsUnreachable")
            assert "gamma-n0" in degraded["message"]
            assert _conditions(status)["NodeAgentsReady"]["status"] == "False"
            assert _conditions(status)["Ready"]["status"] == "True"  # both phases still have a serving node

            # n1 (reachable) switches; n0 never answers: retries, then n1 is switched back.
            await h.patch_status("gamma", {"targetSplit": target(0, 3, 3, ["gamma-n0", "gamma-n1"])})

            async def rolled_back() -> Any:
                status = await _status(h, "gamma")
                return status if _conditions(status)["Adapting"]["reason"] == "SwitchRolledBack" else None

            status = await h.wait_for("rollback", rolled_back)
            # n1 went to decode (generation 3) and was switched back under the next generation.
            assert handles["gamma-n1"].serving() == (NodeMode.PREFILL, 4)
            assert handles["gamma-n2"].serving() == (NodeMode.DECODE, 0)
            switched = [e["message"].split(" in ")[0] for e in h.events_of("PhaseSwitched")]
            assert switched[:1] == ["node gamma-n1: prefill -> decode"]
            assert status["split"] == "2P1D"
            degraded = _conditions(status)["Degraded"]
            assert (degraded["status"], degraded["reason"]) == ("True", "SwitchRolledBack")
            assert "gamma-n0" in degraded["message"] and "switched back: gamma-n1" in degraded["message"]
            await h.wait_for("rollback events", lambda: h.events_of("SwitchRolledBack"))
            # The operator keeps running and keeps reporting the truth.
            outcome = await reconcile(h.rt, NS, "gamma")
            assert outcome is not None and outcome.valid
            assert _conditions(await _status(h, "gamma"))["Degraded"]["reason"] == "SwitchRolledBack"


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_refused_switch_is_rolled_back_without_retries() -> None:
    """Fake agents: the test counts SwitchPhase calls, which a real node agent does not expose."""
    async with H.operator_running() as h:
        handles = {hd.node: hd for hd in agents_mod.start_agents(_phases("delta"))}
        try:
            await _cluster(h, "delta", "d", handles)
            handles["delta-n2"].state.reject_target = Phase.PREFILL
            await h.patch_status("delta", {"targetSplit": target(3, 0, 1, ["delta-n2"])})

            async def rolled_back() -> Any:
                return _conditions(await _status(h, "delta"))["Adapting"]["reason"] == "SwitchRolledBack"

            await h.wait_for("rollback", rolled_back)
            assert handles["delta-n2"].state.calls == [(Phase.PREFILL, 1)]  # one attempt, nothing to undo
            status = await _status(h, "delta")
            assert status["split"] == "2P1D" and _conditions(status)["Degraded"]["reason"] == "SwitchRolledBack"
            # The router's next target (a newer generation) succeeds and the cluster is no longer degraded.
            await h.patch_status("delta", {"targetSplit": target(1, 2, 2, ["delta-n0"])})

            async def converged() -> Any:
                status = await _status(h, "delta")
                return status if status.get("split") == "1P2D" and _conditions(status)["Adapting"]["reason"] == "SplitConverged" else None

            status = await h.wait_for("1P2D", converged)
            assert _conditions(status)["Degraded"]["status"] == "False"
        finally:
            for handle in handles.values():
                handle.stop()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_node_claimed_by_two_clusters_is_reported_on_the_later_one() -> None:
    async with H.operator_running() as h:
        for node in ("shared-0", "shared-1", "shared-2"):
            await h.add_node(node, "shared")
        first = await h.create(H.cluster_object("first", "shared", prefill=2, decode=1))
        await h.wait_for("first's children", lambda: h.emulator.live("apps/v1/daemonsets", NS, "first-node-agent"))
        second = H.cluster_object("second", "shared", prefill=1, decode=1)
        await h.create(second)

        async def conflict() -> Any:
            cond = _conditions(await _status(h, "second")).get("Degraded")
            return cond if cond and cond["reason"] == "PartitionConflict" else None

        cond = await h.wait_for("conflict", conflict)
        assert f"already belong to {NS}/first" in cond["message"]
        assert all(f"shared-{i}" in cond["message"] for i in range(3))
        daemonset = h.emulator.live("apps/v1/daemonsets", NS, "second-node-agent")
        terms = daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"] == [
            {"key": "metadata.name", "operator": "NotIn", "values": ["shared-0", "shared-1", "shared-2"]}
        ]
        first_status = await _status(h, "first")
        assert _conditions(first_status).get("Degraded", {}).get("reason") != "PartitionConflict"
        assert "affinity" not in h.emulator.live("apps/v1/daemonsets", NS, "first-node-agent")["spec"]["template"]["spec"]
        assert first["metadata"]["uid"] != (await h.cluster("second"))["metadata"]["uid"]
        assert await h.api.get(kube.CLUSTER, NS, "second") is not None
