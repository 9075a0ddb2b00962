"""The agent clients' connection pool: connections are opened before the replay clock starts (one per agent, as
many as `warm_connections` allows) and the agents' first requests, issued together, reuse them instead of
paying for connection set-up.
Against a fake OpenAI-compatible server that notes each request's client port."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestServer

from evolving_infra.local.agents import AgentClients, ClientSettings
from evolving_infra.local.presets import PRESETS, PresetName
from evolving_infra.sim.replay import ReplayMode


def _server(seen: list[tuple[str, int]]) -> web.Application:
    def port(request: web.Request) -> int:
        peer = request.transport.get_extra_info("peername") if request.transport is not None else None
        return int(peer[1]) if peer else -1

    async def models(request: web.Request) -> web.Response:
        seen.append(("models", port(request)))
        await asyncio.sleep(0.05)  # every warm-up call is still open when the last one starts
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(("completion", port(request)))
        body = await request.json()
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        done = {"choices": [{"text": "x", "index": 0}]}
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}}
        for event in (done, usage):
            await answer.write(f"data: {json.dumps(event)}\n\n".encode())
        await answer.write(b"data: [DONE]\n\n")
        return answer

    async def finish(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/branches/{branch}/finish", finish)
    return app


def _replay(settings: ClientSettings) -> tuple[list[tuple[str, int]], int, int]:
    trace = PRESETS[PresetName.TINY].trace(0)
    seen: list[tuple[str, int]] = []

    async def main() -> tuple[int, int]:
        async with TestServer(_server(seen), host="127.0.0.1") as server:
            clients = AgentClients(trace, str(server.make_url("")), ReplayMode.closed_loop(4), settings)
            result = await clients.run(asyncio.Event())
            return clients.warmed, len(result.records)

    warmed, done = asyncio.run(main())
    return seen, warmed, done


def test_the_pool_is_opened_before_the_replay_and_its_connections_serve_the_requests() -> None:
    seen, warmed, done = _replay(ClientSettings(speed_up=100.0))
    agents = len(PRESETS[PresetName.TINY].trace(0).agents)
    assert warmed == agents == 4 and done == 13
    warm_ports = {p for kind, p in seen[:agents] if kind == "models"}
    assert len(warm_ports) == agents, seen[:agents]  # one connection per agent, all open before any request
    assert all(kind == "completion" for kind, _ in seen[agents:])
    first = [p for _, p in seen[agents : 2 * agents]]  # each agent's first request, issued together
    assert set(first) <= warm_ports  # none of them opened a connection (later ones may, when the pool is busy)


def test_no_warm_up_leaves_the_pool_to_open_connections_on_demand() -> None:
    seen, warmed, done = _replay(ClientSettings(speed_up=100.0, warm_connections=0))
    assert warmed == 0 and done == 13 and all(kind == "completion" for kind, _ in seen)
