"""Two node agents (prefill, decode) behind SGLang's worker API in PD mode, driven as the SGLang gateway drives
SGLang workers: one request to both at once with the prefill worker's bootstrap address; the decode node pulls
the prompt's pages from the prefill node and generates. In-process, loopback only, bounded in time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from evolving_infra.core.types import NodeMode
from evolving_infra.node_agent.service import NodeAgent, NodeAgentSettings
from evolving_infra.node_agent.service.sglang_http import make_app
from evolving_infra.node_agent.service.sglang_node import NodeAgentSglang
from evolving_infra.node_agent.transfer import TransportKind, TransportSettings


def settings(node: str, mode: NodeMode, **extra: Any) -> NodeAgentSettings:
    values: dict[str, Any] = dict(
        node=node, mode=mode, grpc_port=0, metrics_port=0, speed_up=20.0, l2_pages=2048, l1_pages=2048,
        page_bytes=4096, state_interval_s=0, transfer=TransportSettings(kind=TransportKind.GRPC),
        decode_pull_timeout_s=10, insecure=True,
    )  # fmt: skip
    values.update(extra)
    return NodeAgentSettings(**values)


async def pd_roundtrip() -> dict[str, Any]:
    pre = NodeAgent(settings("pre", NodeMode.PREFILL))
    await pre.start()
    dec = NodeAgent(settings("dec", NodeMode.DECODE, peers={"pre": pre.address}))
    await dec.start()
    pb, db = NodeAgentSglang(pre), NodeAgentSglang(dec)
    pc = TestClient(TestServer(make_app(pb, pb.identity())))
    dc = TestClient(TestServer(make_app(db, db.identity())))
    await pc.start_server()
    await dc.start_server()
    out: dict[str, Any] = {}
    try:
        info = await (await pc.get("/server_info")).json()
        out["prefill_info"] = (info["disaggregation_mode"], info["disaggregation_bootstrap_port"])
        out["decode_mode"] = (await (await dc.get("/server_info")).json())["disaggregation_mode"]
        host, port = info["host"], info["disaggregation_bootstrap_port"]
        prompt = list(range(1, 64 * 20 + 11))  # 20 full pages and 10 tokens
        body = {"input_ids": prompt, "rid": "r1", "sampling_params": {"max_new_tokens": 17},
                "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 42}  # fmt: skip
        legs = await asyncio.wait_for(
            asyncio.gather(pc.post("/generate", json=body), dc.post("/generate", json=body)), 30
        )
        out["statuses"] = [r.status for r in legs]
        prefill, decode = [await r.json() for r in legs]
        out["prefill_tokens"] = prefill["meta_info"]["completion_tokens"]
        out["decode_tokens"] = decode["meta_info"]["completion_tokens"]
        out["moved"] = dec.metrics.transfer_bytes.labels("grpc")._value.get()
        bad = await dc.post("/generate", json={**body, "rid": "r2", "bootstrap_port": 1})
        out["bad"] = (bad.status, (await bad.json())["error"]["message"])
    finally:
        await pc.close()
        await dc.close()
        await dec.close()
        await pre.close()
    return out


@pytest.mark.asyncio
async def test_pd_request_through_the_sglang_api_of_two_node_agents() -> None:
    out = await pd_roundtrip()
    assert out["prefill_info"][0] == "prefill" and out["prefill_info"][1] > 0
    assert out["decode_mode"] == "decode"
    assert out["statuses"] == [200, 200]
    assert out["prefill_tokens"] == 0 and out["decode_tokens"] == 17
    assert out["moved"] == 20 * 4096  # the prompt's full pages, pulled from the prefill node
    assert out["bad"][0] == 400 and "configured peers" in out["bad"][1]


async def through_the_gateway(smg: str) -> dict[str, Any]:
    import subprocess

    import aiohttp
    from aiohttp import web

    from evolving_infra.peers.smg_judge import free_port

    pre = NodeAgent(settings("pre", NodeMode.PREFILL))
    await pre.start()
    dec = NodeAgent(settings("dec", NodeMode.DECODE, peers={"pre": pre.address}))
    await dec.start()
    urls, runners = [], []
    for node in (pre, dec):
        backend = NodeAgentSglang(node)
        port = free_port()
        runner = web.AppRunner(make_app(backend, backend.identity()), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        urls.append(f"http://127.0.0.1:{port}")
        runners.append(runner)
    gate = free_port()
    cmd = [smg, "launch", "--host", "127.0.0.1", "--port", str(gate), "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(free_port()), "--pd-disaggregation",
           "--prefill", urls[0], pre.address.rsplit(":", 1)[1], "--decode", urls[1], "--prefill-policy", "cache_aware",
           "--worker-startup-check-interval", "1", "--shutdown-grace-period-secs", "1", "--log-level", "warn"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            for _ in range(120):
                try:
                    async with s.get(f"http://127.0.0.1:{gate}/workers") as r:
                        if len((await r.json())["workers"]) >= 2:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.25)
            body = {"input_ids": list(range(1, 64 * 20 + 11)), "sampling_params": {"max_new_tokens": 9}}
            async with s.post(f"http://127.0.0.1:{gate}/generate", json=body) as r:
                out["status"], out["generate"] = r.status, await r.json()
        out["moved"] = dec.metrics.transfer_bytes.labels("grpc")._value.get()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        for runner in runners:
            await runner.cleanup()
        await dec.close()
        await pre.close()
    return out


def _smg() -> str | None:
    from evolving_infra.peers.smg_judge import SmgUnavailable, find_smg

    try:
        return str(find_smg())
    except SmgUnavailable:
        return None


@pytest.mark.asyncio
@pytest.mark.skipif(_smg() is None, reason="optional peer smg unavailable (scripts/peers/setup-smg.sh)")
async def test_the_real_gateway_drives_two_node_agents_in_pd_mode() -> None:
    """smg 1.13 with --pd-disaggregation in front of a prefill and a decode node agent: one /generate comes back
    with its tokens, and the decode node pulled the prompt's pages from the prefill node (the bootstrap stand-in)."""
    out = await asyncio.wait_for(through_the_gateway(str(_smg())), 90)
    assert out["status"] == 200 and out["generate"]["meta_info"]["completion_tokens"] == 9
    assert out["moved"] == 20 * 4096
