"""The router's HTTP front end end to end against `FakeBackend`: OpenAI shapes, streaming, errors,
deadlines, disconnects, request identity, metrics, shutdown."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from evolving_infra.router.http import (
    DeadlineExceeded,
    FakeBackend,
    InvalidRequest,
    NoCapacity,
    NodeUnavailable,
    RouterHttpSettings,
    TokenChunk,
    create_admin_app,
    create_app,
    start_server,
)
from evolving_infra.router.http.tokenizer import BuiltinTokenizer

Scenario = Callable[[TestClient], Awaitable[None]]
MODEL = "evolving-emulated"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "write a haiku about caches"}]}


def run(scenario: Scenario, backend: FakeBackend | None = None, **settings: Any) -> FakeBackend:
    backend = backend if backend is not None else FakeBackend()

    async def main() -> None:
        app = create_app(RouterHttpSettings(**settings), backend, clock=lambda: 1_700_000_000.0)
        async with TestClient(TestServer(app)) as client:
            await scenario(client)

    asyncio.run(main())
    return backend


@dataclass
class AdminAnswer:
    status: int
    headers: dict[str, str]
    body: str

    async def text(self) -> str:
        return self.body


async def admin_get(client: TestClient, path: str) -> AdminAnswer:
    """GET `path` on the admin application of the front end under test (its own server)."""
    admin = create_admin_app(client.server.app)
    async with TestClient(TestServer(admin)) as admin_client:
        resp = await admin_client.get(path)
        return AdminAnswer(resp.status, dict(resp.headers), await resp.text())


async def metrics_text(client: TestClient) -> str:
    return (await admin_get(client, "/metrics")).body


def events(body: str) -> list[Any]:
    """Parse an SSE body into JSON payloads, with the literal `[DONE]` kept as a string."""
    assert body.endswith("\n\n"), "every event ends with a blank line"
    out: list[Any] = []
    for block in body.strip("\n").split("\n\n"):
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def wait_for(condition: Callable[[], bool], timeout_s: float = 3.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


# --- non-streaming shapes --------------------------------------------------------------------------


def test_chat_completion_has_the_openai_shape() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4})
        assert resp.status == 200
        body = await resp.json()
        rid = resp.headers["X-Request-Id"]
        assert body["id"] == f"chatcmpl-{rid}"
        assert body["object"] == "chat.completion"
        assert body["created"] == 1_700_000_000
        assert body["model"] == MODEL
        (choice,) = body["choices"]
        assert choice["index"] == 0 and choice["finish_reason"] == "length" and choice["logprobs"] is None
        assert choice["message"]["role"] == "assistant"
        words = choice["message"]["content"].split()
        assert len(words) == 4
        prompt_tokens = len(BuiltinTokenizer().apply_chat_template(CHAT["messages"]))
        assert body["usage"] == {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 4,
            "total_tokens": prompt_tokens + 4,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    run(scenario)


def test_completion_accepts_text_and_token_array_prompts_alike() -> None:
    ids = BuiltinTokenizer().encode("the quick brown fox")

    async def scenario(client: TestClient) -> None:
        texts = []
        for prompt in ("the quick brown fox", ids, [ids], ["the quick brown fox"]):
            resp = await client.post(
                "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 3}
            )
            assert resp.status == 200, await resp.text()
            body = await resp.json()
            assert body["object"] == "text_completion"
            assert body["id"].startswith("cmpl-")
            assert body["usage"]["prompt_tokens"] == 4
            texts.append(body["choices"][0]["text"])
        assert len(set(texts)) == 1, "the same tokens give the same deterministic answer"

    backend = run(scenario)
    assert all(r.prompt_token_ids == tuple(ids) for r in backend.requests)


def test_default_model_and_default_length_apply_when_omitted() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/chat/completions", json={"messages": CHAT["messages"]})
        body = await resp.json()
        assert body["model"] == MODEL
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == 8

    backend = run(scenario)
    assert backend.requests[0].max_tokens is None


def test_models_lists_the_backend_models() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.get("/v1/models")
        body = await resp.json()
        assert body["object"] == "list"
        assert [m["id"] for m in body["data"]] == ["a", "b"]
        assert all(m["object"] == "model" for m in body["data"])
        resp = await client.post("/v1/chat/completions", json={**CHAT, "model": "c"})
        assert resp.status == 404
        err = (await resp.json())["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
        assert resp.headers["x-should-retry"] == "false"

    run(scenario, FakeBackend(model_ids=("a", "b")), model_name="a")


# --- streaming ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_has_role_deltas_finish_usage_and_done(include_usage: bool) -> None:
    async def scenario(client: TestClient) -> None:
        body: dict[str, Any] = {**CHAT, "max_tokens": 5, "stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        resp = await client.post("/v1/chat/completions", json=body)
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        evs = events(await resp.text())
        assert evs[-1] == "[DONE]"
        chunks = evs[:-1]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert len({c["id"] for c in chunks}) == 1
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        if include_usage:
            usage_chunk = chunks.pop()
            assert usage_chunk["choices"] == []
            assert usage_chunk["usage"]["completion_tokens"] == 5
            assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            assert all(c["usage"] is None for c in chunks)
        else:
            assert all("usage" not in c for c in chunks)
        final = chunks.pop()
        assert final["choices"][0]["delta"] == {} and final["choices"][0]["finish_reason"] == "length"
        deltas = [c["choices"][0]["delta"]["content"] for c in chunks[1:]]
        assert len(deltas) == 5 and all(c["choices"][0]["finish_reason"] is None for c in chunks)

        plain = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5})
        assert "".join(deltas) == (await plain.json())["choices"][0]["message"]["content"]

    run(scenario)


def test_completion_stream_usage_chunk_reports_cached_tokens() -> None:
    ids = list(range(1000, 1040))

    async def scenario(client: TestClient) -> None:
        first = await client.post(
            "/v1/completions",
            json={"prompt": ids, "max_tokens": 2},
            headers={"x-evolving-branch-id": "agent-1"},
        )
        out = BuiltinTokenizer().encode((await first.json())["choices"][0]["text"])
        resp = await client.post(
            "/v1/completions",
            json={
                "prompt": ids + out + [7, 8, 9],
                "max_tokens": 3,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            headers={"x-evolving-branch-id": "agent-1"},
        )
        evs = events(await resp.text())
        assert evs[-1] == "[DONE]"
        assert evs[-2]["choices"] == [] and evs[-2]["object"] == "text_completion"
        assert evs[-2]["usage"] == {
            "prompt_tokens": 45,
            "completion_tokens": 3,
            "total_tokens": 48,
            "prompt_tokens_details": {"cached_tokens": 42},
        }
        assert evs[-3]["choices"][0]["finish_reason"] == "length"

    run(scenario, FakeBackend(page_tokens=1))


def test_multi_turn_chat_reuses_the_previous_prompt_and_reply() -> None:
    async def scenario(client: TestClient) -> None:
        headers = {"x-evolving-branch-id": "conv"}
        first = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 6}, headers=headers)
        one = await first.json()
        reply = one["choices"][0]["message"]
        turn2 = {**CHAT, "messages": [*CHAT["messages"], reply, {"role": "user", "content": "again"}]}
        second = await client.post("/v1/chat/completions", json={**turn2, "max_tokens": 6}, headers=headers)
        two = await second.json()
        assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == one["usage"]["total_tokens"]

    run(scenario, FakeBackend(page_tokens=1))


# --- errors from the backend ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "code", "retry", "retry_after"),
    [
        (NoCapacity("all prefill queues full", retry_after_s=2.5), 503, "no_capacity", "true", "3"),
        (NoCapacity("all prefill queues full"), 503, "no_capacity", "true", "1"),
        (NodeUnavailable("prefill node p3 is gone"), 503, "node_unavailable", "true", "1"),
        (DeadlineExceeded("queue wait too long"), 504, "deadline_exceeded", "true", None),
        (
            InvalidRequest("prompt longer than the context", param="messages"),
            400,
            "invalid_value",
            "false",
            None,
        ),
    ],
)
def test_backend_errors_map_to_documented_statuses(
    error: Exception, status: int, code: str, retry: str, retry_after: str | None
) -> None:
    async def scenario(client: TestClient) -> None:
        for stream in (False, True):
            resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
            assert resp.status == status
            err = (await resp.json())["error"]
            assert err["code"] == code and err["message"] == str(error)
            assert set(err) == {"message", "type", "param", "code"}
            assert resp.headers["x-should-retry"] == retry
            assert resp.headers.get("Retry-After") == retry_after
            assert "X-Request-Id" in resp.headers and "x-evolving-branch-id" in resp.headers

    run(scenario, FakeBackend(error=error))  # type: ignore[arg-type]


def test_error_after_first_token_ends_the_stream_with_an_error_event() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5, "stream": True})
        assert resp.status == 200
        evs = events(await resp.text())
        assert evs[-1] == "[DONE]"
        assert evs[-2] == {
            "error": {
                "message": "decode node went away",
                "type": "server_error",
                "param": None,
                "code": "node_unavailable",
            }
        }
        assert [e["choices"][0]["text"] != "" for e in evs[:-2]] == [True, True]

    run(scenario, FakeBackend(error=NodeUnavailable("decode node went away"), error_after_tokens=2))


def test_unexpected_backend_failure_is_a_500_that_says_do_not_retry() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 500
        assert resp.headers["x-should-retry"] == "false"
        assert (await resp.json())["error"]["code"] == "internal_error"

    run(scenario, FakeBackend(error=RuntimeError("bug")))  # type: ignore[arg-type]


class _RefusingBackend(FakeBackend):
    """Refuses in `complete` itself and in `finish_branch`, before any iterator exists."""

    def complete(self, request):  # type: ignore[no-untyped-def]
        raise NoCapacity("admission queue full", retry_after_s=4)

    async def finish_branch(self, branch):  # type: ignore[no-untyped-def]
        raise NodeUnavailable("directory shard unavailable")


def test_errors_raised_before_any_stream_exists_are_mapped_too() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.post(
            "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"x-evolving-branch-id": "b"}
        )
        assert resp.status == 503 and resp.headers["Retry-After"] == "4"
        resp = await client.post("/v1/branches/b/finish")
        assert resp.status == 503 and (await resp.json())["error"]["code"] == "node_unavailable"
        assert resp.headers["x-should-retry"] == "true"

    run(scenario, _RefusingBackend())


# --- deadline and disconnect -----------------------------------------------------------------------------


def test_deadline_before_the_first_token_is_a_504_and_closes_the_backend_stream() -> None:
    async def scenario(client: TestClient) -> None:
        for stream in (False, True):
            resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
            assert resp.status == 504
            assert (await resp.json())["error"]["code"] == "deadline_exceeded"

    backend = run(scenario, FakeBackend(first_token_delay_s=5.0), request_timeout_s=0.2)
    assert len(backend.cancelled) == 2 and not backend.completed


def test_deadline_during_a_stream_ends_it_with_an_error_event() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 500, "stream": True})
        assert resp.status == 200
        evs = events(await resp.text())
        assert evs[-1] == "[DONE]" and evs[-2]["error"]["code"] == "deadline_exceeded"
        assert len(evs) < 500

    # The first token must reach the client before the deadline even on a loaded CI machine (0.3 s was not
    # always enough), and 500 tokens at 0.05 s take 25 s, so the deadline still falls inside the stream.
    backend = run(scenario, FakeBackend(inter_token_delay_s=0.05), request_timeout_s=2.0)
    assert backend.cancelled and not backend.completed


def test_client_disconnect_cancels_the_backend_stream() -> None:
    backend = FakeBackend(inter_token_delay_s=0.02)

    async def scenario(client: TestClient) -> None:
        resp = await client.post(
            "/v1/completions", json={"prompt": "go", "max_tokens": 10_000, "stream": True}
        )
        assert resp.status == 200
        await resp.content.readline()
        resp.close()
        await wait_for(lambda: bool(backend.cancelled))
        await wait_for(lambda: bool(backend.finish_calls))  # the ephemeral branch is finished too
        assert backend.requests[0].request_id in backend.cancelled
        metrics = await metrics_text(client)
        assert 'evolving_requests_total{endpoint="completions",status="499"} 1.0' in metrics
        assert 'evolving_inflight_requests{endpoint="completions"} 0.0' in metrics

    run(scenario, backend)
    assert not backend.completed


# --- request identity and trace context -------------------------------------------------------------


def test_request_id_is_echoed_or_generated_on_every_response() -> None:
    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "harness-42"})
        assert resp.headers["X-Request-Id"] == "harness-42"
        assert (await resp.json())["id"] == "chatcmpl-harness-42"
        resp = await client.post(
            "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"X-Request-Id": "harness-43"}
        )
        assert resp.headers["X-Request-Id"] == "harness-43"
        for path in ("/v1/models", "/healthz", "/nope"):
            resp = await client.get(path)
            assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["X-Request-Id"])
        resp = await client.post("/v1/chat/completions", json={"bad": 1}, headers={"X-Request-Id": "r-1"})
        assert resp.status == 400 and resp.headers["X-Request-Id"] == "r-1"
        resp = await client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "x" * 200})
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "X-Request-Id"

    backend = run(scenario)
    assert backend.requests[0].request_id == "harness-42"


def test_traceparent_is_passed_through_and_invalid_ones_dropped() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def scenario(client: TestClient) -> None:
        await client.post(
            "/v1/chat/completions", json=CHAT, headers={"traceparent": good, "tracestate": "k=v"}
        )
        await client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": "00-zz-yy-01"})
        await client.post("/v1/chat/completions", json=CHAT)

    backend = run(scenario)
    assert [(r.traceparent, r.tracestate) for r in backend.requests] == [
        (good, "k=v"),
        (None, None),
        (None, None),
    ]


# --- metrics -----------------------------------------------------------------------------------------


def test_metrics_are_exposed_and_never_carry_ids() -> None:
    async def scenario(client: TestClient) -> None:
        secret = {
            "x-evolving-branch-id": "branch-SECRET-1",
            "X-Request-Id": "request-SECRET-2",
            "x-evolving-tenant": "tenant-SECRET-3",
        }
        await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3}, headers=secret)
        await client.post(
            "/v1/chat/completions",
            json={**CHAT, "max_tokens": 3, "stream": True},
            headers={"x-dynamo-trajectory-id": "traj-SECRET-4"},
        )
        await client.post(
            "/v1/branches/branch-SECRET-1/finish", headers={"x-evolving-tenant": "tenant-SECRET-3"}
        )
        await client.post("/v1/chat/completions", json={**CHAT, "model": "model-SECRET-5"})
        resp = await admin_get(client, "/metrics")
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
        assert "SECRET" not in text
        for name in (
            "evolving_time_to_first_token_seconds_bucket",
            "evolving_inter_token_latency_seconds_bucket",
            "evolving_request_duration_seconds_bucket",
            "evolving_input_tokens_total",
            "evolving_cached_tokens_total",
            "evolving_output_tokens_total",
            "evolving_inflight_requests",
        ):
            assert name in text, name
        assert 'evolving_requests_total{endpoint="chat_completions",status="200"} 2.0' in text
        assert 'evolving_requests_total{endpoint="chat_completions",status="404"} 1.0' in text
        assert 'evolving_output_tokens_total{endpoint="chat_completions"} 6.0' in text
        assert 'evolving_time_to_first_token_seconds_count{endpoint="chat_completions"} 2.0' in text
        assert 'evolving_inter_token_latency_seconds_count{endpoint="chat_completions"} 4.0' in text
        assert 'evolving_branch_finishes_total{outcome="finished",trigger="call"} 1.0' in text
        assert 'evolving_branch_resolutions_total{source="header:x-dynamo-trajectory-id"} 1.0' in text

    run(scenario)


def test_each_app_has_its_own_registry() -> None:
    async def scenario(client: TestClient) -> None:
        await client.post("/v1/chat/completions", json=CHAT)

    run(scenario)

    async def fresh(client: TestClient) -> None:
        text = await metrics_text(client)
        assert 'evolving_requests_total{endpoint="chat_completions"' not in text

    run(fresh)


# --- health and lifecycle ----------------------------------------------------------------------------


def test_readiness_follows_the_backend_and_draining() -> None:
    backend = FakeBackend(ready=False)

    async def scenario(client: TestClient) -> None:
        assert (await client.get("/healthz")).status == 200
        resp = await client.get("/readyz")
        assert resp.status == 503 and (await resp.json())["reason"] == "fake backend set not ready"
        backend.ready = True
        assert (await client.get("/readyz")).status == 200
        await client.app.shutdown()
        assert (await client.get("/readyz")).status == 503
        resp = await client.post("/v1/chat/completions", json=CHAT)
        assert resp.status == 503 and resp.headers["Retry-After"] == "2"
        assert (await resp.json())["error"]["code"] == "shutting_down"
        assert (await client.post("/v1/branches/b/finish")).status == 200

    run(scenario, backend, retry_after_s=2)


def test_graceful_stop_lets_an_inflight_stream_finish_then_refuses_connections() -> None:
    backend = FakeBackend(inter_token_delay_s=0.02)

    async def main() -> None:
        server = await start_server(RouterHttpSettings(port=0, shutdown_grace_s=5), backend)
        assert server.host == "127.0.0.1" and server.port > 0
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 20, "stream": True}
            ) as resp:
                await resp.content.readline()
                stopping = asyncio.create_task(server.stop())
                rest = (await resp.read()).decode()
            assert rest.rstrip().endswith("data: [DONE]")
            await stopping
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get(f"{server.url}/healthz")

    asyncio.run(main())
    assert len(backend.completed) == 1 and not backend.cancelled
    assert len(backend.finish_calls) == 1, "the pending ephemeral-branch finish ran before exit"


def test_rejected_requests_are_counted_with_their_status_and_finish_nothing() -> None:
    async def scenario(client: TestClient) -> None:
        await client.post("/v1/completions", json={"prompt": "word " * 2000})
        await client.post("/v1/completions", json={"prompt": "   "})
        text = await metrics_text(client)
        assert 'evolving_requests_total{endpoint="completions",status="413"} 1.0' in text
        assert 'evolving_requests_total{endpoint="completions",status="400"} 1.0' in text

    backend = run(scenario, max_body_bytes=4096)
    assert backend.requests == [] and backend.finish_calls == []


class _BrokenDecoder(BuiltinTokenizer):
    def decode(self, token_ids):  # type: ignore[no-untyped-def]
        raise RuntimeError("decoder bug")


class _EndlessStream:
    """An async iterator that is not a generator, so only an explicit `aclose` closes it."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self) -> _EndlessStream:
        return self

    async def __anext__(self) -> TokenChunk:
        await asyncio.sleep(0.01)
        return TokenChunk((1,))

    async def aclose(self) -> None:
        self.closed = True


class _EndlessBackend(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.streams: list[_EndlessStream] = []

    def complete(self, request):  # type: ignore[no-untyped-def]
        self.streams.append(_EndlessStream())
        return self.streams[-1]


@pytest.mark.parametrize("case", ["front-end failure", "deadline", "client gone"])
def test_the_backend_stream_is_closed_however_the_exchange_ends(case: str) -> None:
    backend = _EndlessBackend()

    async def main() -> None:
        tokenizer = _BrokenDecoder() if case == "front-end failure" else None
        settings = RouterHttpSettings(request_timeout_s=0.2 if case == "deadline" else 60)
        app = create_app(settings, backend, tokenizer=tokenizer)
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": case == "client gone"})
            if case == "client gone":
                await resp.content.readline()
                resp.close()
                await wait_for(lambda: backend.streams[0].closed)
            else:
                assert resp.status == (500 if case == "front-end failure" else 504)
                assert backend.streams[0].closed

    asyncio.run(main())
    assert [s.closed for s in backend.streams] == [True]
