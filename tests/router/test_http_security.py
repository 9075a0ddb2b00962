"""The HTTP front end's API keys, access log, admin port, admission limits and read timeouts, against
`FakeBackend` (in-process servers on 127.0.0.1; every wait bounded), plus bounded fuzzing of request
parsing (hypothesis): any body answers with a status below 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolving_infra.router.http import FakeBackend, RouterHttpSettings, create_app, start_server
from evolving_infra.router.http.security import ApiKeyFileError, ApiKeys
from evolving_infra.router.http.server import STATE
from evolving_infra.router.http.tokenizer import BuiltinTokenizer

KEY_A = "sk-alpha-0123456789abcdef"
KEY_B = "sk-bravo-0123456789abcdef"
CHAT = {"messages": [{"role": "user", "content": "a secret prompt about zebras"}], "max_tokens": 4}
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("GET", "/v1/models", None),
    ("POST", "/v1/branches/b1/finish", None),
    ("GET", "/metrics", None),
    ("GET", "/no/such/route", None),
]


def key_file(tmp: Path) -> Path:
    path = tmp / "keys"
    path.write_text(f"# keys\nalpha:{KEY_A}\n\n{KEY_B}\n")
    return path


def run_app(scenario: Any, backend: FakeBackend | None = None, tokenizer: Any = None, **values: Any) -> None:
    async def main() -> None:
        app = create_app(RouterHttpSettings(**values), backend or FakeBackend(), tokenizer=tokenizer)
        async with TestClient(TestServer(app)) as client:
            await asyncio.wait_for(scenario(client), 30)

    asyncio.run(main())


def test_key_file_parsing() -> None:
    keys = ApiKeys.parse(f"alpha:{KEY_A}\n{KEY_B}\n".encode())
    assert keys.identify(f"Bearer {KEY_A}") == "alpha"
    assert keys.identify(f"bearer {KEY_B}") == "key-2"
    assert keys.identify(KEY_A) is None
    assert keys.identify(f"Bearer {KEY_A}x") is None
    assert keys.identify(None) is None
    for bad in (b"", b"# only\n", b"short\n", b"a:" + KEY_A.encode() + b"\na:" + KEY_B.encode(), b"\xff" * 20):
        with pytest.raises(ApiKeyFileError):
            ApiKeys.parse(bad)


def test_without_a_key_every_route_but_the_probes_is_denied(tmp_path: Path) -> None:
    async def scenario(client: TestClient) -> None:
        for method, path, body in ROUTES:
            for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": f"Basic {KEY_A}"}):
                resp = await client.request(method, path, json=body, headers=headers)
                assert resp.status == 401, (method, path, headers)
                error = (await resp.json())["error"]
                assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
                assert set(error) == {"message", "type", "param", "code"}
                assert resp.headers["x-should-retry"] == "false"
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        for path in ("/healthz", "/readyz"):
            assert (await client.get(path)).status == 200
        for key in (KEY_A, KEY_B):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
            assert resp.status == 200
        resp = await client.get("/metrics", headers={"Authorization": f"Bearer {KEY_A}"})
        assert resp.status == 404  # never on the API port

    run_app(scenario, api_key_file=key_file(tmp_path))


def test_access_log_has_no_prompt_no_key_and_no_ids(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(client: TestClient) -> None:
        auth = {"Authorization": f"Bearer {KEY_A}"}
        await client.post("/v1/chat/completions", json=CHAT, headers=auth)
        await client.post("/v1/branches/branch-zz/finish", headers=auth)
        await client.get("/v1/models", headers={"Authorization": "Bearer nope-nope-nope-nope"})

    with caplog.at_level(logging.INFO, logger="evolving_infra.router.access"):
        run_app(scenario, api_key_file=key_file(tmp_path))
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "evolving_infra.router.access"]
    assert [(x["route"], x["status"], x["key"]) for x in lines] == [
        ("/v1/chat/completions", 200, "alpha"),
        ("/v1/branches/{branch_id}/finish", 200, "alpha"),
        ("/v1/models", 401, None),
    ]
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "evolving_infra.router.access")
    for secret in ("zebras", KEY_A, "nope-nope", "branch-zz"):
        assert secret not in text


def test_per_key_concurrency_limit(tmp_path: Path) -> None:
    backend = FakeBackend(first_token_delay_s=2.0)

    async def scenario(client: TestClient) -> None:
        a = {"Authorization": f"Bearer {KEY_A}"}
        b = {"Authorization": f"Bearer {KEY_B}"}
        limiter = client.server.app[STATE].limiter
        slow = [asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=a)) for _ in range(2)]
        for _ in range(1000):  # both held (bounded wait)
            if limiter.inflight.get("alpha") == 2:
                break
            await asyncio.sleep(0.005)
        over = await client.post("/v1/chat/completions", json=CHAT, headers=a)
        assert over.status == 429
        assert (await over.json())["error"]["code"] == "rate_limit_exceeded"
        assert int(over.headers["Retry-After"]) >= 1
        other = await client.post("/v1/chat/completions", json=CHAT, headers=b)  # another key is not held back
        assert other.status == 200
        assert [r.status for r in await asyncio.gather(*slow)] == [200, 200]
        again = await client.post("/v1/chat/completions", json=CHAT, headers=a)
        assert again.status == 200

    run_app(scenario, backend, api_key_file=key_file(tmp_path), max_concurrent_per_key=2)


def test_length_limits_are_400s_naming_the_limit() -> None:
    backend = FakeBackend()

    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**9})
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["param"] == "max_tokens" and "1000" in error["message"]
        resp = await client.post("/v1/completions", json={"prompt": "word " * 80, "max_tokens": 1})
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["param"] == "prompt" and "50" in error["message"]
        resp = await client.post("/v1/completions", json={"prompt": "word " * 30, "max_tokens": 900})
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["param"] == "max_tokens" and "the limit is 100" in error["message"]
        assert resp.headers["x-should-retry"] == "false"
        resp = await client.post("/v1/completions", json={"prompt": "word " * 30, "max_tokens": 20})
        assert resp.status == 200

    run_app(scenario, backend, max_tokens_cap=1000, max_prompt_tokens=50, context_tokens=100)
    assert len(backend.requests) == 1


class ThreadRecordingTokenizer(BuiltinTokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> list[int]:
        self.threads.append(threading.get_ident())
        return super().apply_chat_template(*args, **kwargs)


def test_large_bodies_are_tokenized_off_the_event_loop() -> None:
    tokenizer = ThreadRecordingTokenizer()
    loop_thread: list[int] = []

    async def scenario(client: TestClient) -> None:
        loop_thread.append(threading.get_ident())
        small = await client.post("/v1/chat/completions", json=CHAT)
        big = {**CHAT, "messages": [{"role": "user", "content": "many words " * 20_000}]}
        large = await client.post("/v1/chat/completions", json=big)
        assert (small.status, large.status) == (200, 200)

    run_app(scenario, tokenizer=tokenizer, offload_bytes=64 * 1024, tokenize_processes=0)
    assert tokenizer.threads[0] == loop_thread[0]
    assert tokenizer.threads[1] != loop_thread[0]


def test_large_bodies_go_to_worker_processes_with_the_same_result() -> None:
    backend = FakeBackend()
    big = {**CHAT, "messages": [{"role": "user", "content": "many words, " * 20_000}]}
    seen: dict[str, Any] = {}

    async def scenario(client: TestClient) -> None:
        offloader = client.server.app[STATE].offloader
        resp = await client.post("/v1/chat/completions", json=big)
        assert resp.status == 200
        seen["workers"] = len(offloader.pool._processes) if offloader.pool is not None else 0  # noqa: SLF001
        bad = await client.post("/v1/completions", json={"prompt": [2**40] + [1] * 30_000})
        seen["bad"] = (bad.status, (await bad.json())["error"]["param"])
        broken = await client.post("/v1/chat/completions", data=b'{"messages": [' + b" " * 70_000)
        seen["broken"] = broken.status

    run_app(scenario, backend, offload_bytes=64 * 1024, tokenize_processes=1)
    in_process = BuiltinTokenizer().apply_chat_template(big["messages"], None)
    assert backend.requests[0].prompt_token_ids == tuple(in_process)
    assert seen["workers"] == 1
    assert seen["bad"] == (400, "prompt")
    assert seen["broken"] == 400


def test_admin_port_serves_metrics_and_slow_heads_are_cut(tmp_path: Path) -> None:
    async def scenario() -> dict[str, Any]:
        values = dict(port=0, admin_port=0, api_key_file=key_file(tmp_path), header_read_timeout_s=0.3, body_read_timeout_s=0.3)
        server = await start_server(RouterHttpSettings(**values), FakeBackend(), extra_metrics=[lambda: b"extra_series 1\n"])
        out: dict[str, Any] = {}
        try:
            async with ClientSession() as session:
                async with session.get(f"{server.admin_url}/metrics") as resp:
                    out["admin"] = (resp.status, await resp.text())
                async with session.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY_A}"}) as resp:
                    out["api_metrics"] = resp.status
            loop = asyncio.get_running_loop()
            # slowloris: a request head that never completes is cut after header_read_timeout_s
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            started = loop.time()
            out["head_closed"] = await asyncio.wait_for(reader.read(), 10) == b""
            out["head_s"] = loop.time() - started
            writer.close()
            # a body that never arrives is a 408
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY_A.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )  # fmt: skip
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(4096), 10)
            out["body_status"] = answer.split(b"\r\n", 1)[0]
            writer.close()
        finally:
            await server.stop()
        return out

    out = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert out["admin"][0] == 200 and "evolving_requests_total" in out["admin"][1] and "extra_series 1" in out["admin"][1]
    assert out["api_metrics"] == 404
    assert out["head_closed"] and out["head_s"] < 5
    assert out["body_status"] == b"HTTP/1.1 408 Request Timeout"


# --- bounded fuzzing of request parsing --------------------------------------------------------------
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
_bodies = (
    st.binary(max_size=300)
    | _json_values.map(lambda v: json.dumps(v).encode())
    | st.fixed_dictionaries(
        {"messages": _json_values, "max_tokens": _json_values},
        optional={"model": _json_values, "stream": _json_values, "evolving": _json_values, "stop": _json_values,
                  "temperature": _json_values, "stream_options": _json_values, "n": _json_values},
    ).map(lambda v: json.dumps(v).encode())  # fmt: skip
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), _bodies), min_size=1, max_size=6))
def test_fuzzed_bodies_never_crash_the_front_end(cases: list[tuple[str, bytes]]) -> None:
    async def scenario(client: TestClient) -> None:
        for path, body in cases:
            resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
            assert resp.status < 500, (path, body, await resp.text())
            if resp.status >= 400:
                assert set((await resp.json())["error"]) == {"message", "type", "param", "code"}
            else:
                await resp.read()

    run_app(scenario)

