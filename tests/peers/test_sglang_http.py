"""Contract tests of the SGLang worker API subset (`node_agent.service.sglang_http`), from the request and
response shapes of SGLang's `http_server.py` / OpenAI completions and the worker fields `smg` reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.node_agent.service.sglang_http import (
    Bootstrap,
    RequestError,
    ServerIdentity,
    SglangRole,
    TimedBackend,
    make_app,
    parse_completion,
    parse_generate,
    word_tokens,
)

IDENTITY = ServerIdentity(model="m", page_size=64, bootstrap_port=8998, port=30000)


async def client_for(backend: TimedBackend) -> TestClient:
    client = TestClient(TestServer(make_app(backend, IDENTITY)))
    await client.start_server()
    return client


def sse_events(raw: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


@pytest.mark.asyncio
async def test_discovery_endpoints_have_the_documented_shapes() -> None:
    client = await client_for(TimedBackend())
    try:
        assert (await client.get("/health")).status == 200
        assert (await client.get("/health_generate")).status == 200
        models = await (await client.get("/v1/models")).json()
        assert models["object"] == "list" and models["data"][0]["id"] == "m"
        assert models["data"][0]["object"] == "model"
        for path in ("/server_info", "/get_server_info"):
            info = await (await client.get(path)).json()
            assert info["model_path"] == "m" and info["served_model_name"] == "m"
            assert info["page_size"] == 64 and info["disaggregation_mode"] == "null"
            assert info["disaggregation_bootstrap_port"] == 8998 and info["dp_size"] == 1
        for path in ("/model_info", "/get_model_info"):
            info = await (await client.get(path)).json()
            assert info["model_path"] == "m" and info["is_generation"] is True
        assert "version" in await (await client.get("/version")).json()
        for path in ("/loads", "/v1/loads?include=core,disagg,queues,memory"):
            loads = await (await client.get(path)).json()
            assert loads["dp_rank_count"] == 1 and isinstance(loads["timestamp"], str)
            (rank,) = loads["loads"]
            for key in ("dp_rank", "num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens",
                        "token_usage", "gen_throughput", "cache_hit_rate", "utilization", "max_running_requests"):
                assert key in rank  # fmt: skip
            assert loads["aggregate"]["total_running_reqs"] == 0
        metrics = await (await client.get("/metrics")).text()
        assert 'sglang:num_running_reqs{model_name="m"} 0' in metrics
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_generate_and_streaming() -> None:
    backend = TimedBackend()
    client = await client_for(backend)
    try:
        body = {"text": "a b c", "rid": "r1", "sampling_params": {"max_new_tokens": 3}}
        out = await (await client.post("/generate", json=body)).json()
        assert out["text"] == " t0 t1 t2" and out["output_ids"] == [0, 1, 2]
        meta = out["meta_info"]
        assert meta["id"] == "r1" and meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 3
        assert meta["finish_reason"] == {"type": "length", "length": 3}
        streamed = await client.post("/generate", json={**body, "rid": "r2", "stream": True})
        assert streamed.headers["Content-Type"].startswith("text/event-stream")
        chunks = sse_events(await streamed.text())
        assert [c["meta_info"]["completion_tokens"] for c in chunks] == [1, 2, 3]
        assert chunks[-1]["text"] == " t0 t1 t2"  # SGLang streams cumulative text
        assert chunks[0]["meta_info"]["finish_reason"] is None
        ids = await (await client.post("/generate", json={"input_ids": [5, 6, 7], "rid": "r3"})).json()
        assert ids["meta_info"]["prompt_tokens"] == 3 and ids["meta_info"]["completion_tokens"] == 128
        assert backend.served == ["r1", "r2", "r3"]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_openai_completions() -> None:
    client = await client_for(TimedBackend())
    try:
        out = await (await client.post("/v1/completions", json={"model": "m", "prompt": "x y", "max_tokens": 2})).json()
        assert out["object"] == "text_completion" and out["model"] == "m"
        assert out["choices"][0]["text"] == " t0 t1" and out["choices"][0]["finish_reason"] == "length"
        assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4,
                                "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
        streamed = await client.post("/v1/completions", json={"prompt": "x y", "max_tokens": 3, "stream": True})
        chunks = sse_events(await streamed.text())
        assert "".join(c["choices"][0]["text"] for c in chunks) == " t0 t1 t2"  # deltas
        assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "usage" in chunks[-1]
        wrong = await client.post("/v1/completions", json={"model": "other", "prompt": "x"})
        assert wrong.status == 400 and "other" in (await wrong.json())["error"]["message"]
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_prefix_cache_counts_whole_pages() -> None:
    backend = TimedBackend(page_tokens=4)
    client = await client_for(backend)
    try:
        words = " ".join(f"w{i}" for i in range(10))
        first = await (await client.post("/generate", json={"text": words, "sampling_params": {"max_new_tokens": 1}})).json()
        again = await (await client.post("/generate", json={"text": words + " z", "sampling_params": {"max_new_tokens": 1}})).json()
        assert first["meta_info"]["cached_tokens"] == 0
        assert again["meta_info"]["cached_tokens"] == 8  # two whole 4-token pages of the 10 shared tokens
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_prefill_role_returns_after_prefill() -> None:
    client = await client_for(TimedBackend(role=SglangRole.PREFILL))
    try:
        body = {"text": "a b", "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7}
        out = await (await client.post("/generate", json=body)).json()
        assert out["meta_info"]["completion_tokens"] == 0
        info = await (await client.get("/server_info")).json()
        assert info["disaggregation_mode"] == "prefill"
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1, 2], "JSON object"),
        ({"text": "a", "input_ids": [1]}, "exactly one of text or input_ids"),
        ({}, "exactly one of text or input_ids"),
        ({"text": ["a", "b"]}, "batched"),
        ({"text": "   "}, "empty"),
        ({"input_ids": [1, "x"]}, "list of integers"),
        ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
        ({"text": "a", "sampling_params": []}, "sampling_params"),
        ({"text": "a", "stream": "yes"}, "stream"),
        ({"text": "a", "bootstrap_host": "h"}, "bootstrap_port"),
        ({"text": "a", "bootstrap_host": "", "bootstrap_port": 1, "bootstrap_room": 1}, "bootstrap_host"),
    ],
)
@pytest.mark.asyncio
async def test_bad_generate_bodies_get_400(body: Any, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_generate(body)
    client = await client_for(TimedBackend())
    try:
        resp = await client.post("/generate", json=body)
        assert resp.status == 400
        assert message.split()[0] in (await resp.json())["error"]["message"]
        broken = await client.post("/generate", data=b"{not json", headers={"Content-Type": "application/json"})
        assert broken.status == 400
    finally:
        await client.close()


def test_parsers() -> None:
    job = parse_generate({"text": "a b", "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 3})
    assert job.bootstrap == Bootstrap("10.0.0.1", 8998, 3) and job.max_new_tokens == 128 and not job.stream
    completion = parse_completion({"prompt": [1, 2, 3], "max_tokens": 4, "stream": True}, "m")
    assert completion.input_ids == (1, 2, 3) and completion.max_new_tokens == 4 and completion.stream
    with pytest.raises(RequestError, match="prompt"):
        parse_completion({"prompt": ["a", "b"]}, "m")


@given(st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=5), min_size=1, max_size=20),
       st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=5), max_size=20))  # fmt: skip
def test_word_tokens_share_exactly_the_shared_words(a: list[str], b: list[str]) -> None:
    ta, tb = word_tokens(" ".join(a)), word_tokens(" ".join(a + b))
    assert len(ta) == len(a) and tb[: len(ta)] == ta
