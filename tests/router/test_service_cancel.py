"""A client that leaves mid-stream cancels its request everywhere: the router closes the decode stream, the
decode node drops the decode (GPU pages freed), and the router's own record of the node (decode jobs,
occupancy, in-flight gauge) is back to empty. In-process node agents and router on 127.0.0.1; every wait
bounded."""

from __future__ import annotations

from typing import Any

from evolving_infra.core.types import NodeMode
from tests.router.test_service_live import PROMPT, Cluster, run, until


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
