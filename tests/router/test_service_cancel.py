"""A client that leaves mid-stream cancels its request everywhere: the router closes the decode stream, the
decode node drops the decode (GPU pages freed), and the router's own record of the node (decode jobs,
occupancy, in-flight gauge) is back to empty. Clients that leave before their first token, and requests
whose deadline passes in the prefill queue, have their prefills cancelled on the prefill node (`Cancel`).
In-process node agents and router on 127.0.0.1; every wait bounded."""

from __future__ import annotations

import asyncio
from typing import Any

from evolving_infra.core.types import NodeMode
from evolving_infra.node_agent.profiles import load_profile
from tests.router.test_service_live import PROMPT, Cluster, node_settings, run, until

LONG = load_profile(node_settings("p0", NodeMode.PREFILL).profile).chunk_tokens + 800
"""Words (tokens) in a long prompt: more than one chunk, so no prefill iteration takes two of them, and
requests accepted together stay queued behind the first however late the node's scheduler runs."""


def test_a_client_leaving_mid_stream_cancels_the_decode_and_corrects_the_counts() -> None:
    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": NodeMode.PREFILL, "d0": NodeMode.DECODE}, speed_up=5.0) as c:
            d0 = c.agents["d0"]
            idle_in_use = d0.engine.gauges().pool.l1.in_use
            body = {"model": "evolving-emulated", "prompt": PROMPT, "max_tokens": 20_000, "stream": True}
            response = await c.session.post(f"{c.server.url}/v1/completions", json=body,
                                            headers={"x-evolving-branch-id": "leaver"})  # fmt: skip
            assert response.status == 200
            for _ in range(3):
                await response.content.readline()
            out["running"] = d0.engine.gauges().decode_running
            out["router_jobs"] = len(c.router.core.nodes["d0"].decode_jobs)
            response.close()  # the client goes away
            await until(lambda: d0.engine.gauges().decode_running == 0, "the decode node to drop the decode")
            await until(lambda: not c.router.flights, "the router to end the flight")
            g = d0.engine.gauges()
            out["after"] = (g.decode_running, g.decode_queued, g.pool.l1.in_use - idle_in_use)
            out["router_after"] = (len(c.router.core.nodes["d0"].decode_jobs), len(c.router.core.nodes["d0"].bound))
            out["cancelled"] = d0.metrics.requests.labels("decode", "cancelled")._value.get()
            status, answer = await c.complete(PROMPT + " again", "next", max_tokens=4)
            out["next"] = (status, answer["usage"]["completion_tokens"])
        return out

    out = run(scenario)
    assert out["running"] == 1 and out["router_jobs"] == 1
    assert out["after"] == (0, 0, 0)
    assert out["router_after"] == (0, 0)
    assert out["cancelled"] == 1
    assert out["next"] == (200, 4)


def test_clients_leaving_before_their_prefill_ran_cancel_it_on_the_prefill_node() -> None:
    """Prefills queued (and one running) on a slowed-down prefill node; every client leaves before its first
    token: the router sends Cancel, the node drops them, and the router's record of the node is empty."""

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": NodeMode.PREFILL, "d0": NodeMode.DECODE}, speed_up=0.1) as c:
            p0 = c.agents["p0"]
            long_prompt = " ".join(f"x{i}" for i in range(LONG))
            responses = []
            for i in range(4):
                body = {"model": "evolving-emulated", "prompt": f"{i} {long_prompt}", "max_tokens": 8, "stream": True}
                responses.append(asyncio.ensure_future(c.session.post(f"{c.server.url}/v1/completions", json=body)))
            requests = p0.metrics.requests
            await until(lambda: requests.labels("prefill", "accepted")._value.get() == 4, "p0 to accept the prefills")
            out["queued"] = p0.engine.gauges().prefill_queued
            for pending in responses:
                pending.cancel()  # the clients go away before any token
            await until(lambda: not c.router.flights, "the router to end the flights")
            settled = lambda: sum(requests.labels("prefill", o)._value.get() for o in ("finished", "cancelled")) == 4  # noqa: E731
            await until(settled, "every prefill to finish or be cancelled")
            out["left"] = (p0.engine.gauges().prefill_queued, p0.engine.gauges().prefill_running)
            out["router_sent"] = len(c.router.core.nodes["p0"].sent)
            out["node"] = {o: requests.labels("prefill", o)._value.get() for o in ("accepted", "finished", "cancelled")}
            await until(lambda: c.router.metrics.prefill_cancels.labels(outcome="cancelled")._value.get()
                        == out["node"]["cancelled"], "the router to count the cancels")  # fmt: skip
            p0.engine.check_invariants()
        return out

    out = run(scenario)
    assert out["queued"] >= 2
    assert out["left"] == (0, 0)
    assert out["router_sent"] == 0
    node = out["node"]
    # the emulated engine applies an iteration when it launches, so only the prefills not yet launched can go
    assert node["accepted"] == 4 and node["finished"] + node["cancelled"] == 4 and node["cancelled"] >= 2


def test_a_request_past_its_deadline_in_the_prefill_queue_is_cancelled_there() -> None:
    """The router's request deadline passes while the prefill still waits on a slowed-down node: the client
    gets the deadline error, and the node drops the prefill instead of computing it for nobody."""
    from evolving_infra.router.http import RouterHttpSettings, start_server

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Cluster({"p0": NodeMode.PREFILL, "d0": NodeMode.DECODE}, speed_up=0.1) as c:
            await c.server.stop()
            c.server = await start_server(RouterHttpSettings(port=0, request_timeout_s=1.5), c.router)
            p0 = c.agents["p0"]
            long_prompt = " ".join(f"q{i}" for i in range(LONG))
            bodies = [{"model": "evolving-emulated", "prompt": f"{i} {long_prompt}", "max_tokens": 8} for i in range(3)]

            async def send(body: dict[str, Any]) -> int:
                async with c.session.post(f"{c.server.url}/v1/completions", json=body) as response:
                    await response.read()
                    return response.status

            out["statuses"] = sorted(await asyncio.gather(*(send(b) for b in bodies)))
            requests = p0.metrics.requests
            settled = lambda: sum(requests.labels("prefill", o)._value.get() for o in ("finished", "cancelled")) == 3  # noqa: E731
            await until(settled, "every prefill to finish or be cancelled")
            out["cancelled"] = requests.labels("prefill", "cancelled")._value.get()
            cancels = c.router.metrics.prefill_cancels.labels(outcome="cancelled")
            # the node counts a cancel before its answer reaches the router
            await until(lambda: cancels._value.get() >= out["cancelled"], "the router to count the cancels")
            out["router_cancels"] = cancels._value.get()
            out["left"] = (p0.engine.gauges().prefill_queued, len(c.router.core.nodes["p0"].sent))
        return out

    out = run(scenario)
    assert out["statuses"] == [504, 504, 504], out
    assert out["cancelled"] >= 1 and out["router_cancels"] == out["cancelled"]
    assert out["left"] == (0, 0)
