"""Request validation of the completion endpoints: every malformed request is a 400 (or 404/405/413)
with an OpenAI-style error naming the offending parameter, and never a crash."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from evolving_infra.router.http import ApiError, FakeBackend, RouterHttpSettings, create_app
from evolving_infra.router.http.api import Endpoint, format_loc, parse_chat, parse_completion
from hypothesis import given
from hypothesis import strategies as st

USER = [{"role": "user", "content": "hello"}]


def post_all(
    requests: list[tuple[str, Any, dict[str, str]]], **settings: Any
) -> list[tuple[int, dict, dict]]:
    """POST each (path, body, headers) and return (status, json body, headers) per request."""
    out: list[tuple[int, dict, dict]] = []

    async def main() -> None:
        app = create_app(RouterHttpSettings(**settings), FakeBackend())
        async with TestClient(TestServer(app)) as client:
            for path, body, headers in requests:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                resp = await client.post(path, data=data, headers=headers)
                out.append((resp.status, await resp.json(), dict(resp.headers)))

    asyncio.run(main())
    return out


CHAT_CASES: list[tuple[Any, str | None, str]] = [
    (b"{not json", None, "invalid_json"),
    (b"", None, "invalid_json"),
    ([1, 2], None, "invalid_value"),
    ({}, "messages", "invalid_value"),
    ({"messages": []}, "messages", "invalid_value"),
    ({"messages": "hello"}, "messages", "invalid_value"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_value"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "invalid_value"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content",
        "invalid_value",
    ),
    ({"messages": USER, "max_tokens": -1}, "max_tokens", "invalid_value"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"messages": USER, "max_tokens": "5"}, "max_tokens", "invalid_value"),
    ({"messages": USER, "max_tokens": 2.5}, "max_tokens", "invalid_value"),
    ({"messages": USER, "max_completion_tokens": -3}, "max_completion_tokens", "invalid_value"),
    (
        {"messages": USER, "max_tokens": 3, "max_completion_tokens": 4},
        "max_completion_tokens",
        "conflicting_values",
    ),
    ({"messages": USER, "stream": "yes"}, "stream", "invalid_value"),
    ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    (
        {"messages": USER, "stream": True, "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
        "invalid_value",
    ),
    ({"messages": USER, "n": 2}, "n", "unsupported_parameter"),
    ({"messages": USER, "n": 0}, "n", "invalid_value"),
    ({"messages": USER, "logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"messages": USER, "temperature": 3}, "temperature", "invalid_value"),
    ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"messages": USER, "stop": 7}, "stop", "invalid_value"),
    ({"messages": USER, "model": ""}, "model", "invalid_value"),
    ({"messages": USER, "evolving": {"branchId": "x"}}, "evolving.branchId", "invalid_value"),
    ({"messages": USER, "evolving": {"branch_finished": "yes"}}, "evolving.branch_finished", "invalid_value"),
    ({"messages": USER, "evolving": {"branch_id": ""}}, "evolving.branch_id", "invalid_value"),
    ({"messages": USER, "evolving": {"branch_id": "a\nb"}}, "evolving.branch_id", "invalid_value"),
    (
        {"messages": USER, "evolving": {"branch_id": "a", "parent_branch_id": "a"}},
        "evolving.parent_branch_id",
        "invalid_value",
    ),
    ({"messages": USER, "prompt_cache_key": "k" * 300}, "prompt_cache_key", "invalid_value"),
]


def test_malformed_chat_requests_get_400s_naming_the_param() -> None:
    results = post_all([("/v1/chat/completions", body, {}) for body, _, _ in CHAT_CASES])
    for (body, param, code), (status, answer, headers) in zip(CHAT_CASES, results, strict=True):
        assert status == 400, (body, answer)
        err = answer["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "invalid_request_error"
        assert (err["param"], err["code"]) == (param, code), (body, err)
        assert headers["x-should-retry"] == "false"
        if param is not None:
            assert param.split("[")[0].split(".")[0] in err["message"], err["message"]


COMPLETION_CASES: list[tuple[Any, str | None, str]] = [
    ({}, "prompt", "invalid_value"),
    ({"prompt": ""}, "prompt", "invalid_value"),
    ({"prompt": []}, "prompt", "invalid_value"),
    ({"prompt": ["a", "b"]}, "prompt", "invalid_value"),
    ({"prompt": [[1, 2], [3]]}, "prompt", "invalid_value"),
    ({"prompt": [["a"]]}, "prompt", "invalid_value"),
    ({"prompt": [[]]}, "prompt", "invalid_value"),
    ({"prompt": [1, -2]}, "prompt", "invalid_value"),
    ({"prompt": [1, True]}, "prompt", "invalid_value"),
    ({"prompt": [1, "a"]}, "prompt", "invalid_value"),
    ({"prompt": {"text": "a"}}, "prompt", "invalid_value"),
    ({"prompt": [2**31]}, "prompt", "invalid_value"),
    ({"prompt": "   "}, "prompt", "invalid_value"),
    ({"prompt": "a", "echo": True}, "echo", "unsupported_parameter"),
    ({"prompt": "a", "best_of": 3}, "best_of", "unsupported_parameter"),
    ({"prompt": "a", "logprobs": 2}, "logprobs", "unsupported_parameter"),
    ({"prompt": "a", "suffix": "z"}, "suffix", "unsupported_parameter"),
    ({"prompt": "a", "n": 3}, "n", "unsupported_parameter"),
    ({"prompt": "a", "cache_salt": "t1", "evolving": {"tenant": "t2"}}, "cache_salt", "conflicting_values"),
]


def test_malformed_completion_requests_get_400s_naming_the_param() -> None:
    results = post_all([("/v1/completions", body, {}) for body, _, _ in COMPLETION_CASES])
    for (body, param, code), (status, answer, _) in zip(COMPLETION_CASES, results, strict=True):
        assert status == 400, (body, answer)
        assert (answer["error"]["param"], answer["error"]["code"]) == (param, code), (body, answer)


def test_batched_prompt_error_says_what_to_do() -> None:
    [(status, answer, _)] = post_all([("/v1/completions", {"prompt": ["a", "b"]}, {})])
    assert status == 400
    assert "batched prompts are not supported (2 given)" in answer["error"]["message"]


def test_bad_headers_get_400s_naming_the_header() -> None:
    cases = [
        ({"x-evolving-branch-finished": "maybe"}, "x-evolving-branch-finished"),
        ({"x-evolving-branch-id": "a", "x-evolving-parent-branch-id": "a"}, "x-evolving-parent-branch-id"),
        ({"x-evolving-tenant": "t" * 257}, "x-evolving-tenant"),
    ]
    results = post_all([("/v1/chat/completions", {"messages": USER}, h) for h, _ in cases])
    for (_, param), (status, answer, _) in zip(cases, results, strict=True):
        assert status == 400 and answer["error"]["param"] == param


def test_unknown_fields_are_ignored_and_text_parts_accepted() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                "whatever": 1,
            }
        ],
        "frequency_penalty": 0.5,
        "some_vendor_field": {"x": 1},
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    [(status, answer, _)] = post_all([("/v1/chat/completions", body, {})])
    assert status == 200, answer


def test_oversized_body_is_a_413() -> None:
    body = {"prompt": "word " * 2000}
    [(status, answer, headers)] = post_all([("/v1/completions", body, {})], max_body_bytes=4096)
    assert status == 413
    assert answer["error"]["code"] == "request_too_large" and headers["x-should-retry"] == "false"


def test_assistant_message_with_tool_calls_may_omit_content() -> None:
    msgs = [
        {"role": "user", "content": "what time is it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    ]
    parsed = parse_chat(json.dumps({"messages": msgs}).encode())
    assert parsed.endpoint is Endpoint.CHAT_COMPLETIONS
    assert parsed.messages is not None and "tool_calls" in parsed.messages[1]


def test_max_completion_tokens_wins_when_equal_or_alone() -> None:
    assert parse_chat(json.dumps({"messages": USER, "max_completion_tokens": 7}).encode()).max_tokens == 7
    assert (
        parse_chat(
            json.dumps({"messages": USER, "max_tokens": 7, "max_completion_tokens": 7}).encode()
        ).max_tokens
        == 7
    )


def test_format_loc() -> None:
    assert format_loc(("messages", 0, "content")) == "messages[0].content"
    assert format_loc(("stream_options", "include_usage")) == "stream_options.include_usage"
    assert format_loc(()) is None


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_fields = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "stream_options",
        "n",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "prompt_cache_key",
        "cache_salt",
        "evolving",
        "echo",
        "logprobs",
    ]
)


@given(st.dictionaries(_fields, _json, max_size=6), st.booleans())
def test_any_json_body_parses_or_fails_with_a_400(body: dict[str, Any], chat: bool) -> None:
    parse = parse_chat if chat else parse_completion
    try:
        parsed = parse(json.dumps(body).encode())
    except ApiError as exc:
        assert exc.status == 400
        required = "messages" if chat else "prompt"
        assert exc.param is None or exc.param.split("[")[0].split(".")[0] in {*body, required}
        return
    assert parsed.max_tokens is None or parsed.max_tokens >= 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_wrong_method_is_a_405_in_openai_shape(path: str) -> None:
    async def main() -> None:
        async with TestClient(TestServer(create_app(RouterHttpSettings(), FakeBackend()))) as client:
            resp = await client.get(path)
            assert resp.status == 405
            assert (await resp.json())["error"]["code"] == "method_not_allowed"

    asyncio.run(main())
