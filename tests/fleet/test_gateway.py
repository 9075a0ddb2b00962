"""The gateway end to end on 127.0.0.1: two partition routers (the router's front end on `FakeBackend`),
partitions from AgentServingCluster files, completions and streams forwarded unchanged, branch headers
kept, 503 with a retry hint when the user's partition is down, metrics per partition, `/fleet`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from evolving_infra.fleet.source import FileSource
from evolving_infra.gateway.server import RunningGateway, start_gateway
from evolving_infra.gateway.settings import GatewaySettings
from evolving_infra.router.http import FakeBackend, RouterHttpSettings, create_app

MODEL = "evolving-emulated"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "list the files"}], "max_tokens": 6}


def cluster_doc(name: str, url: str, region: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.evolving-infra.io/v1alpha1",
        "kind": "AgentServingCluster",
        "metadata": {
            "name": name,
            "namespace": "agents",
            "labels": {"evolving-infra.io/partition": name, "region": region},
            "annotations": {"evolving-infra.io/router-url": url},
        },
        "spec": {
            "nodeSelector": {"matchLabels": {"evolving-infra.io/partition": name}},
            "nodeCount": 4,
            "gpusPerNode": 4,
            "engine": {"backend": "emulated", "profile": "glm-5.2-4xgb300-tp4"},
            "initialSplit": {"prefill": 2, "decode": 2},
        },
    }


@dataclass
class Fleet:
    gateway: RunningGateway
    routers: dict[str, TestServer]
    backends: dict[str, FakeBackend]
    session: aiohttp.ClientSession

    def url(self, path: str) -> str:
        return self.gateway.url + path


@asynccontextmanager
async def fleet(tmp: Path, backend: dict[str, Any] | None = None, **settings: Any) -> AsyncIterator[Fleet]:
    backends = {name: FakeBackend(**(backend or {})) for name in ("p0", "p1")}
    routers: dict[str, TestServer] = {}
    for name, backend in backends.items():
        app = create_app(RouterHttpSettings(tokenize_processes=0), backend, clock=lambda: 1_700_000_000.0)
        routers[name] = TestServer(app, host="127.0.0.1")
        await routers[name].start_server()
    regions = {"p0": "eu", "p1": "us"}
    path = tmp / "fleet.yaml"
    path.write_text(
        yaml.safe_dump_all([cluster_doc(n, str(s.make_url("")).rstrip("/"), regions[n]) for n, s in routers.items()])
    )
    options = {"port": 0, "admin_port": 0, "partition_files": (path,), "health_interval_s": 60.0, **settings}
    gateway = await start_gateway(GatewaySettings(**options), FileSource((path,)))
    try:
        async with aiohttp.ClientSession() as session:
            yield Fleet(gateway, routers, backends, session)
    finally:
        await gateway.stop()
        for server in routers.values():
            await server.close()


def run(tmp: Path, scenario: Callable[[Fleet], Awaitable[None]], backend: dict[str, Any] | None = None, **settings: Any) -> None:
    async def main() -> None:
        async with fleet(tmp, backend, **settings) as f:
            await scenario(f)

    asyncio.run(main())


def without_created(payload: Any) -> Any:
    return {k: v for k, v in payload.items() if k != "created"} if isinstance(payload, dict) else payload


def test_completions_and_streams_are_forwarded_unchanged(tmp_path: Path) -> None:
    async def scenario(f: Fleet) -> None:
        headers = {"x-evolving-user": "alice", "X-Request-Id": "req-1"}
        async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=headers) as via:
            assert via.status == 200
            partition = via.headers["x-evolving-partition"]
            got = await via.json()
        name = partition.split("/")[1]
        async with f.session.post(str(f.routers[name].make_url("/v1/chat/completions")), json=CHAT, headers=headers) as direct:
            want = await direct.json()
        assert got == want  # same router clock, same request id: byte-for-byte the router's answer
        assert got["choices"][0]["message"]["content"]

        stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        headers["X-Request-Id"] = "req-2"
        async with f.session.post(f.url("/v1/chat/completions"), json=stream, headers=headers) as via:
            assert via.headers["content-type"].startswith("text/event-stream")
            assert via.headers["x-evolving-partition"] == partition  # the user stays on its partition
            streamed = await via.read()
        async with f.session.post(str(f.routers[name].make_url("/v1/chat/completions")), json=stream, headers=headers) as direct:
            assert await direct.read() == streamed
        assert streamed.rstrip().endswith(b"data: [DONE]")

        # text completions too, and the partition router saw the gateway's partition header
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 3}
        async with f.session.post(f.url("/v1/completions"), json=body, headers={"x-evolving-user": "alice"}) as via:
            assert via.status == 200 and (await via.json())["object"] == "text_completion"
        async with f.session.get(f.url("/v1/models")) as models:
            assert (await models.json())["data"][0]["id"] == MODEL

    run(tmp_path, scenario)


def test_branch_headers_are_preserved_and_branches_stay_put(tmp_path: Path) -> None:
    async def scenario(f: Fleet) -> None:
        seen: set[str] = set()
        for turn in range(3):
            headers = {"x-evolving-branch-id": "agent-7", "x-evolving-tenant": "acme"}
            async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=headers) as r:
                assert r.status == 200
                assert r.headers["x-evolving-branch-id"] == "agent-7"
                assert r.headers["x-evolving-branch-source"] == "header:x-evolving-branch-id"
                seen.add(r.headers["x-evolving-partition"])
        assert len(seen) == 1
        home = seen.pop()
        # A sub-agent (parent named by Dynamo's alias header) joins its parent's partition.
        child = {"x-dynamo-trajectory-id": "sub-1", "x-dynamo-parent-trajectory-id": "agent-7", "x-evolving-tenant": "acme"}
        async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=child) as r:
            assert r.status == 200 and r.headers["x-evolving-partition"] == home
        backend = f.backends[home.split("/")[1]]
        last = backend.requests[-1]
        assert (last.branch.branch_id, last.branch.tenant) == ("sub-1", "acme")
        assert last.parent is not None and last.parent.branch_id == "agent-7"
        assert [r.branch.branch_id for r in backend.requests[:3]] == ["agent-7"] * 3
        # Finishing goes to the branch's partition and ends its pin there.
        async with f.session.post(f.url("/v1/branches/agent-7/finish"), headers={"x-evolving-tenant": "acme"}) as r:
            assert (await r.json())["status"] == "finished"
        async with f.session.post(f.url("/v1/branches/agent-7/finish"), headers={"x-evolving-tenant": "acme"}) as r:
            assert (await r.json())["status"] == "not_found"

    run(tmp_path, scenario)


def test_requirements_choose_the_partition(tmp_path: Path) -> None:
    async def scenario(f: Fleet) -> None:
        for user in ("u1", "u2", "u3", "u4"):
            for region, name in (("eu", "agents/p0"), ("us", "agents/p1")):
                headers = {"x-evolving-user": f"{user}-{region}", "x-evolving-requirements": f"region={region}"}
                async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=headers) as r:
                    assert r.headers["x-evolving-partition"] == name
        headers = {"x-evolving-user": "x", "x-evolving-requirements": "region=mars"}
        async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=headers) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "no_eligible_partition"
            assert r.headers["x-should-retry"] == "false"
        async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers={"x-evolving-requirements": "region"}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "x-evolving-requirements"

    run(tmp_path, scenario)


def test_a_down_partition_gets_503_with_a_retry_hint(tmp_path: Path) -> None:
    async def scenario(f: Fleet) -> None:
        headers = {"x-evolving-user": "bob"}
        async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=headers) as r:
            home = r.headers["x-evolving-partition"]
        home_port = f.routers[home.split("/")[1]].port
        await f.routers[home.split("/")[1]].close()  # the partition's router goes away
        for _ in range(2):  # the connection failure, then the remembered down state
            async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=headers) as r:
                assert r.status == 503
                assert r.headers["Retry-After"] == "7" and r.headers["x-should-retry"] == "true"
                error = (await r.json())["error"]
                assert error["code"] == "partition_unavailable" and home in error["message"]
        # A new user is bound to a partition that is up.
        other = ({"agents/p0", "agents/p1"} - {home}).pop()
        for i in range(5):
            async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers={"x-evolving-user": f"new-{i}"}) as r:
                assert r.status == 200 and r.headers["x-evolving-partition"] == other
        async with f.session.get(f.gateway.admin_url + "/metrics") as m:  # type: ignore[operator]
            text = await m.text()
        assert f'evolving_gateway_unavailable_total{{partition="{home}"}} 2.0' in text
        assert f'evolving_gateway_partition_up{{partition="{home}"}} 0.0' in text
        assert f'evolving_gateway_requests_total{{endpoint="chat_completions",partition="{other}",status="200"}}' in text
        async with f.session.get(f.url("/fleet")) as r:
            view = await r.json()
        rows = {row["partition"]: row for row in view["partitions"]}
        assert rows[home]["up"] is False and rows[other]["up"] is True
        assert rows[other]["users"] >= 5 and view["totals"]["gpus"] == 32
        async with f.session.get(f.url("/fleet?format=table&scrape=0")) as r:
            table = await r.text()
        assert "agents/p0" in table and "fleet: 2 partitions, 8 nodes, 32 GPUs" in table

        # The router comes back on its port: the next probe marks the partition up, and bob, who was
        # never moved, is served there again.
        app = create_app(RouterHttpSettings(tokenize_processes=0), FakeBackend())
        back = TestServer(app, host="127.0.0.1", port=home_port)
        await back.start_server()
        try:
            state = f.gateway.state
            await state.health.probe_all(f.session, {k: p.router_url for k, p in state.partitions.items()}, 5.0)
            async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=headers) as r:
                assert r.status == 200 and r.headers["x-evolving-partition"] == home, await r.text()
        finally:
            await back.close()
        await f.routers[other.split("/")[1]].close()
        await state.health.probe_all(f.session, {k: p.router_url for k, p in state.partitions.items()}, 5.0)
        async with f.session.get(f.url("/readyz")) as r:
            assert r.status == 503 and (await r.json())["reason"] == "every partition is down"

    run(tmp_path, scenario, retry_after_s=7.0)


def test_upstream_mode_sets_the_partition_header_for_httproutes(tmp_path: Path) -> None:
    """With --upstream every request goes to one listener (a Gateway API implementation) carrying the
    partition header its HTTPRoutes match; the body and the client's headers arrive unchanged."""
    seen: list[tuple[str, bytes, dict[str, str]]] = []

    async def listener(request: web.Request) -> web.StreamResponse:
        seen.append((request.path, await request.read(), dict(request.headers)))
        return web.json_response({"ok": True}, headers={"x-from": "listener"})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", listener)
        async with TestServer(app, host="127.0.0.1") as upstream:
            async with fleet(tmp_path, upstream_url=str(upstream.make_url("")).rstrip("/")) as f:
                raw = json.dumps(CHAT, separators=(",", ":")).encode()
                headers = {"content-type": "application/json", "x-evolving-user": "carol", "x-evolving-branch-id": "b9"}
                async with f.session.post(f.url("/v1/chat/completions"), data=raw, headers=headers) as r:
                    assert r.status == 200 and r.headers["x-from"] == "listener"
                    partition = r.headers["x-evolving-partition"]
        path, body, got = seen[0]
        assert path == "/v1/chat/completions" and body == raw
        assert got["x-evolving-partition"] == partition
        assert got["x-evolving-user"] == "carol" and got["x-evolving-branch-id"] == "b9"

    asyncio.run(main())


def test_api_keys_identify_users_and_carry_their_requirements(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("alice:alice-key-0123456789abcdef\nbob:bob-key-0123456789abcdef0\n")
    key_reqs = tmp_path / "key-requirements.yaml"
    key_reqs.write_text("alice: region=us\n")

    async def scenario(f: Fleet) -> None:
        async with f.session.post(f.url("/v1/chat/completions"), json=CHAT) as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
        alice = {"Authorization": "Bearer alice-key-0123456789abcdef"}
        for user in ("u1", "u2", "u3"):  # the key is the user: the user header does not spread it
            async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers={**alice, "x-evolving-user": user}) as r:
                assert r.status == 200 and r.headers["x-evolving-partition"] == "agents/p1"  # region=us
        # A request may narrow its key's requirements, never widen them.
        widen = {**alice, "x-evolving-requirements": "region=eu"}
        async with f.session.post(f.url("/v1/chat/completions"), json=CHAT, headers=widen) as r:
            assert r.status == 400 and "region" in (await r.json())["error"]["message"]
        assert f.gateway.state.table.binder.partition_of("key:alice") == "agents/p1"
        async with f.session.get(f.url("/healthz")) as r:
            assert r.status == 200  # probes need no key

    run(tmp_path, scenario, api_key_file=keys, key_requirements_file=key_reqs)


def test_a_client_that_goes_away_mid_stream_closes_the_partition_stream(tmp_path: Path) -> None:
    async def scenario(f: Fleet) -> None:
        body = {**CHAT, "max_tokens": 200, "stream": True}
        async with f.session.post(f.url("/v1/chat/completions"), json=body, headers={"x-evolving-user": "dan"}) as r:
            partition = r.headers["x-evolving-partition"]
            await r.content.readline()  # the first event arrived; then the client hangs up
        backend = f.backends[partition.split("/")[1]]
        for _ in range(100):
            if backend.cancelled:
                break
            await asyncio.sleep(0.05)
        assert backend.cancelled == [backend.requests[-1].request_id]

    run(tmp_path, scenario, backend={"inter_token_delay_s": 0.02})
