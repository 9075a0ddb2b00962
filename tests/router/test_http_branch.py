"""Branch, parent and tenant resolution (documented precedence), tenant separation, and the
branch-finished call and flag, through the HTTP front end and on the pure resolver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from evolving_infra.router.http import ApiError, BranchRef, FakeBackend, RouterHttpSettings, create_app
from evolving_infra.router.http.api import BodyHints
from evolving_infra.router.http.branch import ALIAS_HEADERS, BranchSource, resolve_branch
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.types import BranchId, RequestId

CHAT = {"messages": [{"role": "user", "content": "plan the refactor"}], "max_tokens": 2}


def exchange(
    calls: list[tuple[str, str, Any, dict[str, str]]], backend: FakeBackend
) -> list[tuple[int, dict, Any]]:
    """Run (method, path, json body, headers) calls in order; (status, headers, json) each."""
    out: list[tuple[int, dict, Any]] = []

    async def main() -> None:
        async with TestClient(TestServer(create_app(RouterHttpSettings(), backend))) as client:
            for method, path, body, headers in calls:
                resp = await client.request(method, path, json=body, headers=headers)
                out.append((resp.status, dict(resp.headers), await resp.json()))

    asyncio.run(main())  # closing the client runs the app's cleanup, which awaits pending branch finishes
    return out


ALIASES = [
    ({"x-evolving-branch-id": "b1"}, {}, "header:x-evolving-branch-id"),
    ({}, {"evolving": {"branch_id": "b1"}}, "body:evolving.branch_id"),
    ({"x-dynamo-trajectory-id": "b1"}, {}, "header:x-dynamo-trajectory-id"),
    ({"X-Dynamo-Session-ID": "b1"}, {}, "header:x-dynamo-session-id"),
    ({"X-SMG-Routing-Key": "b1"}, {}, "header:x-smg-routing-key"),
    ({"x-aibrix-session-key": "b1"}, {}, "header:x-aibrix-session-key"),
    ({}, {"prompt_cache_key": "b1"}, "body:prompt_cache_key"),
]


@pytest.mark.parametrize(("headers", "body", "source"), ALIASES)
def test_each_branch_alias_resolves_and_is_echoed(headers: dict[str, str], body: dict, source: str) -> None:
    backend = FakeBackend()
    [(status, resp_headers, _)] = exchange(
        [("POST", "/v1/chat/completions", {**CHAT, **body}, headers)], backend
    )
    assert status == 200
    assert resp_headers["x-evolving-branch-id"] == "b1"
    assert resp_headers["x-evolving-branch-source"] == source
    assert backend.requests[0].branch == BranchRef(BranchId("b1"))
    assert not backend.requests[0].ephemeral
    assert backend.finish_calls == [], "a named branch stays open until it is finished"


def test_parent_headers_and_alias_reach_the_backend() -> None:
    backend = FakeBackend()
    exchange(
        [
            (
                "POST",
                "/v1/chat/completions",
                CHAT,
                {"x-evolving-branch-id": "child", "x-evolving-parent-branch-id": "root"},
            ),
            (
                "POST",
                "/v1/chat/completions",
                CHAT,
                {"x-dynamo-trajectory-id": "sub", "x-dynamo-parent-trajectory-id": "root"},
            ),
            (
                "POST",
                "/v1/chat/completions",
                {**CHAT, "evolving": {"branch_id": "c2", "parent_branch_id": "root"}},
                {},
            ),
        ],
        backend,
    )
    assert [(r.branch.branch_id, r.parent) for r in backend.requests] == [
        ("child", BranchRef(BranchId("root"))),
        ("sub", BranchRef(BranchId("root"))),
        ("c2", BranchRef(BranchId("root"))),
    ]


def test_a_request_without_branch_gets_an_ephemeral_branch_finished_after_it() -> None:
    backend = FakeBackend()
    [(status, headers, _)] = exchange(
        [("POST", "/v1/chat/completions", CHAT, {"X-Request-Id": "r9"})], backend
    )
    assert status == 200
    assert headers["x-evolving-branch-id"] == "req-r9" and headers["x-evolving-branch-source"] == "generated"
    assert backend.requests[0].ephemeral
    assert backend.finish_calls == [BranchRef(BranchId("req-r9"))]
    assert backend.active_branches == frozenset()


def test_tenants_are_separate_namespaces() -> None:
    backend = FakeBackend(page_tokens=1)
    results = exchange(
        [
            (
                "POST",
                "/v1/chat/completions",
                CHAT,
                {"x-evolving-branch-id": "b", "x-evolving-tenant": "acme"},
            ),
            ("POST", "/v1/chat/completions", {**CHAT, "cache_salt": "globex"}, {"x-evolving-branch-id": "b"}),
            (
                "POST",
                "/v1/chat/completions",
                CHAT,
                {"x-evolving-branch-id": "b", "x-evolving-tenant": "acme"},
            ),
            ("POST", "/v1/branches/b/finish", None, {"x-evolving-tenant": "acme"}),
        ],
        backend,
    )
    _, other_tenant, same_tenant, finish = results
    assert [r.branch for r in backend.requests] == [
        BranchRef(BranchId("b"), "acme"),
        BranchRef(BranchId("b"), "globex"),
        BranchRef(BranchId("b"), "acme"),
    ]
    assert other_tenant[2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert same_tenant[2]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert finish[2] == {"object": "branch.finish", "branch_id": "b", "tenant": "acme", "status": "finished"}
    assert backend.active_branches == frozenset({BranchRef(BranchId("b"), "globex")})


def test_scoped_ids_never_collide_across_tenants() -> None:
    refs = [
        BranchRef(BranchId("a/b")),
        BranchRef(BranchId("b"), "a"),
        BranchRef(BranchId("a/b"), ""),
        BranchRef(BranchId("b"), "a/"),
        BranchRef(BranchId("/b"), "a"),
    ]
    assert len({r.scoped_id() for r in refs}) == len(refs)


def test_finish_call_is_idempotent_and_reaches_the_backend() -> None:
    backend = FakeBackend()
    results = exchange(
        [
            ("POST", "/v1/chat/completions", CHAT, {"x-evolving-branch-id": "work/1"}),
            ("POST", "/v1/branches/work%2F1/finish", None, {}),
            ("POST", "/v1/branches/work%2F1/finish", None, {}),
            ("POST", "/v1/branches/never-seen/finish", {"tenant": "acme"}, {}),
        ],
        backend,
    )
    statuses = [(s, b.get("status")) for s, _, b in results[1:]]
    assert statuses == [(200, "finished"), (200, "not_found"), (200, "not_found")]
    assert results[1][1]["x-evolving-branch-id"] == "work/1"
    assert backend.finish_calls == [
        BranchRef(BranchId("work/1")),
        BranchRef(BranchId("work/1")),
        BranchRef(BranchId("never-seen"), "acme"),
    ]


def test_finish_call_rejects_bad_input() -> None:
    results = exchange(
        [
            ("POST", "/v1/branches/ok/finish", {"tenant": 5}, {}),
            ("POST", "/v1/branches/ok/finish", {"tenant": "a"}, {"x-evolving-tenant": "b"}),
            ("POST", "/v1/branches/%20padded/finish", None, {}),
        ],
        FakeBackend(),
    )
    assert [(s, b["error"]["param"]) for s, _, b in results] == [
        (400, "tenant"),
        (400, "x-evolving-tenant"),
        (400, "branch_id"),
    ]


@pytest.mark.parametrize(
    ("headers", "body"),
    [({"x-evolving-branch-finished": "true"}, {}), ({}, {"evolving": {"branch_finished": True}})],
)
def test_finished_flag_finishes_the_branch_after_the_request(headers: dict, body: dict) -> None:
    backend = FakeBackend()
    results = exchange(
        [("POST", "/v1/chat/completions", {**CHAT, **body}, {"x-evolving-branch-id": "last", **headers})],
        backend,
    )
    assert results[0][0] == 200
    assert backend.requests[0].finish_after
    assert backend.finish_calls == [BranchRef(BranchId("last"))]
    assert backend.active_branches == frozenset()


def test_canonical_header_and_body_must_agree() -> None:
    [(status, _, body)] = exchange(
        [
            (
                "POST",
                "/v1/chat/completions",
                {**CHAT, "evolving": {"branch_id": "x"}},
                {"x-evolving-branch-id": "y"},
            )
        ],
        FakeBackend(),
    )
    assert status == 400
    assert body["error"]["code"] == "conflicting_values" and body["error"]["param"] == "x-evolving-branch-id"


# --- the pure resolver --------------------------------------------------------------------------------

_PRECEDENCE = [
    ("x-evolving-branch-id", BranchSource.HEADER),
    *ALIAS_HEADERS,
]


@given(
    present=st.lists(st.sampled_from(range(len(_PRECEDENCE))), unique=True),
    cache_key=st.booleans(),
    ours_in_body=st.booleans(),
)
def test_the_first_hint_in_precedence_order_wins(
    present: list[int], cache_key: bool, ours_in_body: bool
) -> None:
    headers = {_PRECEDENCE[i][0]: f"id-{i}" for i in present}
    hints = BodyHints(
        prompt_cache_key="from-key" if cache_key else None,
        branch_id=headers.get("x-evolving-branch-id") if ours_in_body else None,
    )
    resolved = resolve_branch(headers, hints, RequestId("r"))
    if present:
        first = min(present)
        source = _PRECEDENCE[first][1]
        if first == 0 and ours_in_body:
            source = BranchSource.BODY
        assert (resolved.branch.branch_id, resolved.source) == (f"id-{first}", source)
    elif cache_key:
        assert (resolved.branch.branch_id, resolved.source) == ("from-key", BranchSource.PROMPT_CACHE_KEY)
    else:
        assert resolved.ephemeral and resolved.branch.branch_id == "req-r"


@given(st.text(min_size=1, max_size=300))
def test_any_id_is_accepted_or_rejected_with_a_400_naming_it(value: str) -> None:
    try:
        resolved = resolve_branch({"x-evolving-branch-id": value}, BodyHints(), RequestId("r"))
    except ApiError as exc:
        assert exc.status == 400 and exc.param == "x-evolving-branch-id"
        return
    assert resolved.branch.branch_id == value and value.isascii() and value == value.strip()


def test_header_names_are_case_insensitive() -> None:
    resolved = resolve_branch(
        {"X-Evolving-Branch-Id": "a", "X-EVOLVING-TENANT": "t"}, BodyHints(), RequestId("r")
    )
    assert resolved.branch == BranchRef(BranchId("a"), "t")
