"""The serving nodes a backend names reach the client: in the headers what is known at the first chunk (the
HTTP head is committed then), in the usage's `evolving` extension the last value named; nothing extra when
the backend names none."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from evolving_infra.router.http import CompletionRequest, FakeBackend, RouterHttpSettings, ServingNodes, TokenChunk, create_app


class NamingBackend(FakeBackend):
    """Names only the prefill node on the first chunk, both nodes and the queue wait on later ones."""

    async def _stream(self, request: CompletionRequest) -> AsyncIterator[TokenChunk]:
        first = True
        async for chunk in super()._stream(request):
            serving = ServingNodes("p0") if first else ServingNodes("p0", "d1", 0.25)
            first = False
            yield dataclasses.replace(chunk, serving=serving)


def answers(backend: FakeBackend) -> dict[bool, tuple[dict[str, str], dict[str, Any]]]:
    out: dict[bool, tuple[dict[str, str], dict[str, Any]]] = {}

    async def main() -> None:
        app = create_app(RouterHttpSettings(), backend, clock=lambda: 1_700_000_000.0)
        async with TestClient(TestServer(app)) as client:
            for stream in (False, True):
                body: dict[str, Any] = {"model": "evolving-emulated", "prompt": "a b c", "max_tokens": 4, "stream": stream}
                if stream:
                    body["stream_options"] = {"include_usage": True}
                response = await client.post("/v1/completions", json=body)
                assert response.status == 200
                heads = {k.lower(): v for k, v in response.headers.items() if k.lower().startswith("x-evolving-")}
                if stream:
                    text = await response.text()
                    payloads = [json.loads(b[6:]) for b in text.strip().split("\n\n") if b != "data: [DONE]"]
                    usage = payloads[-1]["usage"]
                else:
                    usage = (await response.json())["usage"]
                out[stream] = (heads, usage)

    asyncio.run(main())
    return out


def test_headers_carry_the_nodes_known_at_the_first_chunk_and_usage_the_last() -> None:
    out = answers(NamingBackend(tokens_per_chunk=1))
    streamed_heads, streamed_usage = out[True]
    assert streamed_heads["x-evolving-prefill-node"] == "p0" and "x-evolving-decode-node" not in streamed_heads
    assert streamed_usage["evolving"] == {"prefill_node": "p0", "decode_node": "d1", "queue_s": 0.25}
    full_heads, full_usage = out[False]  # a non-streaming answer's head is written at the end: both nodes
    assert (full_heads["x-evolving-prefill-node"], full_heads["x-evolving-decode-node"]) == ("p0", "d1")
    assert full_usage["evolving"] == streamed_usage["evolving"]


def test_a_backend_that_names_no_nodes_adds_nothing() -> None:
    out = answers(FakeBackend())
    for heads, usage in out.values():
        assert "x-evolving-prefill-node" not in heads and "x-evolving-decode-node" not in heads
        assert "evolving" not in usage
