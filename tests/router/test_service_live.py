"""The live router against real node agents on loopback: HTTP completions (streaming and not) through the router
to a prefill and a decode node agent, branch counts pushed to the nodes and released on branch finish, a dead
node agent failing its in-flight requests cleanly (re-routed before the first token) and leaving the directory,
a local phase switch with queued requests handed back and re-routed, and the Kubernetes applier's status write.

Node agents run in-process (grpc.aio on 127.0.0.1, engines sped up); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from evolving_infra.cli.router import shape_from_profile
from evolving_infra.core.types import NodeId, NodeMode, Phase, Tier
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.router.core import SplitChange, SwitchNode
from evolving_infra.router.core.control import PlannerDecided, SwitchOrder
from evolving_infra.router.http import RouterHttpSettings, start_server
from evolving_infra.router.planner import Outcome, PlannerDecision, SwitchMode
from evolving_infra.router.service import KubernetesSplitApplier, LiveRouter, LocalSplitApplier, NodeEndpoint, RouterSettings

DEADLINE = 30.0
PROMPT = " ".join(f"w{i}" for i in range(300))


def node_settings(node: str, mode: NodeMode, **extra: Any) -> NodeAgentSettings:
    values: dict[str, Any] = dict(
        node=node, mode=mode, grpc_port=0, metrics_port=0, metrics_enabled=False, speed_up=50.0, l2_pages=1024,
        l1_pages=1024, page_bytes=4096, state_interval_s=0.2, decode_pull_timeout_s=10, insecure=True,
    )
    values.update(extra)
    return NodeAgentSettings(**values)


async def until(check: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Cluster:
    """Node agents, a live router over them and its HTTP front end."""

    def __init__(self, modes: dict[str, NodeMode], speed_up: float = 50.0, speed_ups: dict[str, float] | None = None,
                 **router: Any) -> None:
        """`speed_ups` overrides `speed_up` for the nodes it names (a slow node keeps its queue long)."""
        rates = {n: (speed_ups or {}).get(n, speed_up) for n in modes}
        self.agents = {n: NodeAgent(node_settings(n, m, speed_up=rates[n])) for n, m in modes.items()}
        self.router_settings = router

    async def __aenter__(self) -> Cluster:
        for agent in self.agents.values():
            await agent.start()
        nodes = {n: a.address for n, a in self.agents.items()}
        self.settings = RouterSettings(nodes=nodes, prefill_routing="cache-aware", rpc_timeout_s=5.0, **self.router_settings)
        self.router = LiveRouter(self.settings, shape_from_profile(load_profile(self.settings.profile)),
                                 [NodeEndpoint(NodeId(n), a) for n, a in nodes.items()])
        await self.router.start()
        assert await self.router.wait_ready(DEADLINE)
        http = RouterHttpSettings(port=0, request_timeout_s=DEADLINE)
        self.server = await start_server(http, self.router)
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.server.stop()
        await self.router.close()
        for agent in self.agents.values():
            await agent.close(grace=None)

    async def complete(self, prompt: str, branch: str, max_tokens: int = 8, stream: bool = False) -> Any:
        body = {"model": "evolving-emulated", "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        headers = {"x-evolving-branch-id": branch}
        async with self.session.post(f"{self.server.url}/v1/completions", json=body, headers=headers) as response:
            if not stream:
                return response.status, await response.json()
            events = []
            async for line in response.content:
                text = line.decode().strip()
                if text.startswith("data: "):
                    events.append(text[6:])
            return response.status, events

    async def finish(self, branch: str) -> Any:
        async with self.session.post(f"{self.server.url}/v1/branches/{branch}/finish") as response:
            return response.status, await response.json()


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), 80))


def test_completions_stream_through_router_and_node_agents_and_branch_finish_releases_counts() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": NodeMode.PREFILL, "d0": NodeMode.DECODE}) as c:
            status, answer = await c.complete(PROMPT, "b1", max_tokens=8)
            out["first"] = (status, answer["usage"]["completion_tokens"], answer["choices"][0]["finish_reason"])
            text = answer["choices"][0]["text"]
            status, events = await c.complete(PROMPT + text + " more words here", "b1", max_tokens=6, stream=True)
            out["stream_done"] = (status, events[-1])
            usage = json.loads(events[-2])["usage"]
            out["cached"] = usage["prompt_tokens_details"]["cached_tokens"]
            out["stream_tokens"] = usage["completion_tokens"]
            branch = c.router.core.branches.state(next(iter(c.router.core.branches.branches())))
            pages = branch.path
            p0 = c.agents["p0"].engine.pool
            await until(lambda: p0.count(pages[0]) == 1, "the branch's count pushed to the prefill node")
            out["directory_has_p0"] = "p0" in c.router.core.directory.holders(pages[0], Tier.HOST)
            out["finish"] = await c.finish("b1")
            await until(lambda: p0.count(pages[0]) == 0, "the count released on the prefill node")
            out["finish_again"] = (await c.finish("b1"))[1]["status"]
            out["flights"] = len(c.router.flights)
        return out

    out = run(scenario)
    assert out["first"] == (200, 8, "length")
    assert out["stream_done"] == (200, "[DONE]") and out["stream_tokens"] == 6
    assert out["cached"] >= 256  # the second turn reuses the first turn's prompt pages
    assert out["directory_has_p0"]
    assert out["finish"][0] == 200 and out["finish"][1]["status"] == "finished"
    assert out["finish_again"] == "not_found" and out["flights"] == 0


def test_a_dead_node_agent_fails_over_before_the_first_token_and_leaves_the_directory() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": NodeMode.PREFILL, "p1": NodeMode.PREFILL, "d0": NodeMode.DECODE}) as c:
            await c.complete(PROMPT, "warm", max_tokens=4)
            holders = {n for n in ("p0", "p1") if c.router.core.directory.held_count(NodeId(n), Tier.HOST)}
            dead = holders.pop()
            await c.agents[dead].close(grace=None)
            await until(lambda: c.router.core.directory.held_count(NodeId(dead), Tier.HOST) == 0, "the dead node's pages dropped")
            out["accepting"] = [t.id for t in c.router.core.accepting(Phase.PREFILL)]
            status, answer = await c.complete(PROMPT + " next", "warm", max_tokens=4)
            out["after"] = (status, answer.get("usage", {}).get("completion_tokens"))
            out["dead"] = dead
        return out

    out = run(scenario)
    assert out["dead"] not in out["accepting"] and out["accepting"]
    assert out["after"] == (200, 4)


def test_a_decode_node_dying_mid_stream_ends_the_stream_with_an_error_within_the_deadline() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": NodeMode.PREFILL, "d0": NodeMode.DECODE}, speed_up=1.0) as c:
            loop = asyncio.get_running_loop()
            task = asyncio.ensure_future(c.complete(PROMPT, "long", max_tokens=5000, stream=True))
            await until(lambda: any(f.tokens_sent for f in c.router.flights.values()), "the first tokens", 20)
            killed = loop.time()
            await c.agents["d0"].close(grace=None)
            status, events = await asyncio.wait_for(task, 20)
            out["took"] = loop.time() - killed
            out["status"] = status
            out["error"] = [json.loads(e)["error"]["code"] for e in events if e.startswith("{") and "error" in json.loads(e)]
            out["flights"] = len(c.router.flights)
            # the failed decode call ends the stream; the directory forgets d0 when its event stream breaks, which
            # may come a moment later (two calls on one channel, no order between their failures)
            await until(lambda: not c.router.clients[NodeId("d0")].up, "the router to see d0's event stream end", 10)
            out["d0_pages"] = c.router.core.directory.held_count(NodeId("d0"), Tier.HOST)
        return out

    out = run(scenario)
    assert out["status"] == 200  # the stream had started
    assert out["error"] == ["node_unavailable"] and out["flights"] == 0 and out["d0_pages"] == 0
    assert out["took"] < 20


def test_local_split_applier_switches_a_prefill_node_and_reroutes_its_queued_requests() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        modes = {"p0": NodeMode.PREFILL, "p1": NodeMode.PREFILL, "d0": NodeMode.DECODE}
        async with Cluster(modes, speed_up=2.0, speed_ups={"p0": 0.5}) as c:  # p0 slow: its queue lasts under load
            tasks = [
                asyncio.ensure_future(c.complete(" ".join(f"x{i}y{j}" for j in range(6000)), f"s{i}", max_tokens=4))
                for i in range(8)
            ]
            p0 = c.agents["p0"].engine
            await until(lambda: p0.gauges().prefill_queued >= 1, "a request queued at p0")
            decision = PlannerDecision({"p0": Phase.DECODE, "p1": Phase.PREFILL, "d0": Phase.DECODE}, SwitchMode.IN_PLACE,
                                       Outcome.SWITCH, "test", None)  # type: ignore[arg-type]
            effects = c.router.control.decided(decision, c.router.now())
            orders = [e for e in effects if isinstance(e, SwitchOrder)]
            decided = next(e for e in effects if isinstance(e, PlannerDecided))
            assert [(o.node, o.phase) for o in orders] == [("p0", Phase.DECODE)]
            await LocalSplitApplier(c.router).apply(orders, decided, c.router.now())
            results = await asyncio.gather(*tasks)
            out["statuses"] = [s for s, _ in results]
            out["tokens"] = [a.get("usage", {}).get("completion_tokens", a) for _, a in results]
            out["p0"] = (c.router.core.nodes[NodeId("p0")].phase, c.agents["p0"].engine.mode)
            out["retries"] = {x.labels["reason"]: x.value for m in c.router.metrics.retries.collect() for x in m.samples
                              if x.name.endswith("_total")}
            out["handed"] = c.agents["p0"].metrics.requests.labels("prefill", "handed_back")._value.get()
        return out

    out = run(scenario)
    assert out["statuses"] == [200] * 8 and out["tokens"] == [4] * 8, out["tokens"]
    assert out["p0"] == (Phase.DECODE, NodeMode.DECODE)
    assert out["handed"] >= 1 and out["retries"].get("handed_back", 0) == out["handed"]  # re-routed, none lost


class FakeCustomObjects:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((args, kwargs))
        return {}


def test_kubernetes_split_applier_writes_status_only_with_the_routers_field_manager() -> None:
    from evolving_infra.operator.status import AgentServingClusterStatus

    async def scenario() -> Any:
        settings = RouterSettings(nodes={"p0": "127.0.0.1:1", "d0": "127.0.0.1:2"}, applier="kubernetes", cluster_name="asc")
        router = LiveRouter(settings, shape_from_profile(load_profile(settings.profile)),
                            [NodeEndpoint(NodeId("p0"), "127.0.0.1:1"), NodeEndpoint(NodeId("d0"), "127.0.0.1:2")])
        for n, phase in (("p0", Phase.PREFILL), ("d0", Phase.DECODE)):
            track = router.core.nodes[NodeId(n)]
            track.mode = NodeMode.of(phase)
            router.control.node_joined(NodeId(n), phase, 0.0)
        api = FakeCustomObjects()
        decision = PlannerDecision({"p0": Phase.DECODE, "d0": Phase.DECODE}, SwitchMode.IN_PLACE, Outcome.SWITCH, "why",
                                   None)  # type: ignore[arg-type]
        router.control.generation_seen(NodeId("p0"), 6)
        effects = router.control.decided(decision, 0.0)
        (decided,) = [e for e in effects if isinstance(e, PlannerDecided)]
        assert decided.change == SplitChange(decision, dict(decision.target), (SwitchNode(NodeId("p0"), Phase.DECODE, SwitchMode.IN_PLACE),))  # type: ignore[arg-type]
        orders = [e for e in effects if isinstance(e, SwitchOrder)]
        await KubernetesSplitApplier(router, api, "ns", "asc").apply(orders, decided, 0.0)
        return api.calls, router.core.nodes[NodeId("p0")].accepts(Phase.PREFILL)

    calls, p0_accepts_prefill = asyncio.run(scenario())
    ((args, kwargs),) = calls
    assert args[:5] == ("serving.evolving-infra.io", "v1alpha1", "ns", "agentservingclusters", "asc")
    assert kwargs == {"field_manager": "evolving-infra-router"}
    body = args[5]
    assert set(body) == {"status"}  # never the spec
    status = AgentServingClusterStatus.model_validate(body["status"])
    assert status.target_split is not None
    assert (status.target_split.split, status.target_split.switch_generation, status.target_split.moving) == ("0P2D", 7, ["p0"])
    assert not p0_accepts_prefill  # the router stops sending prefill work to the moving node at once
