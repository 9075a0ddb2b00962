"""Who a gateway request is (the documented order), and the binding table's idle expiry: pure, no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.fleet.binding import Partition, Requirements
from evolving_infra.gateway.errors import GatewayError
from evolving_infra.gateway.identity import Identity, UserSource, resolve_identity
from evolving_infra.gateway.table import BindingTable


def identify(headers: dict[str, str], body: dict[str, object] | None = None, key: str | None = None,
             key_reqs: Requirements = Requirements()) -> Identity:  # fmt: skip
    return resolve_identity(
        headers, body, "rid-1", key_name=key, key_requirements=key_reqs,
        user_header="x-evolving-user", requirements_header="x-evolving-requirements",
    )  # fmt: skip


@pytest.mark.parametrize(
    "headers,body,key,user,source",
    [
        ({"x-evolving-user": "u", "x-evolving-branch-id": "b"}, {"user": "v"}, "alice", "key:alice", UserSource.API_KEY),
        ({"X-Evolving-User": "u", "x-evolving-branch-id": "b"}, {"user": "v"}, None, "user:u", UserSource.USER_HEADER),
        ({"x-evolving-branch-id": "b"}, {"user": "v"}, None, "user:v", UserSource.BODY_USER),
        ({"x-evolving-branch-id": "b", "x-evolving-parent-branch-id": "p"}, None, None, "branch:-/p", UserSource.PARENT_BRANCH),
        ({"x-dynamo-trajectory-id": "t"}, None, None, "branch:-/t", UserSource.BRANCH),
        ({"x-evolving-tenant": "acme"}, {"prompt_cache_key": "k"}, None, "branch:4:acme/k", UserSource.BRANCH),
        ({}, {"messages": []}, None, "request:rid-1", UserSource.REQUEST),
    ],
)
def test_the_user_key_follows_the_documented_order(
    headers: dict[str, str], body: dict[str, object] | None, key: str | None, user: str, source: UserSource
) -> None:
    got = identify(headers, body, key)
    assert (got.user_key, got.source) == (user, source)


def test_branches_are_scoped_by_tenant_and_bad_input_is_a_400() -> None:
    got = identify({"x-evolving-branch-id": "b", "x-evolving-tenant": "t", "x-evolving-branch-finished": "true"})
    assert got.branch == "1:t/b" and got.finish_after and got.parent is None
    assert identify({}).branch is None  # ephemeral: nothing to pin
    for headers in ({"x-evolving-branch-id": "b", "x-evolving-parent-branch-id": "b"}, {"x-evolving-requirements": "region"},
                    {"x-evolving-user": " padded "}):  # fmt: skip
        with pytest.raises(GatewayError) as info:
            identify(headers)
        assert info.value.status == 400
    narrowed = identify({"x-evolving-requirements": "region=eu"}, key="k", key_reqs=Requirements.parse("region=eu|us"))
    assert narrowed.requirements == Requirements.parse("region=eu")
    with pytest.raises(GatewayError, match="fixed"):
        identify({"x-evolving-requirements": "region=ap"}, key="k", key_reqs=Requirements.parse("region=eu|us"))


def _identity(user: str, branch: str | None, finish: bool = False) -> Identity:
    return Identity(f"user:{user}", UserSource.USER_HEADER, branch, None, finish, Requirements())


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.booleans(), st.floats(0, 50)), max_size=60))
def test_a_branch_in_flight_is_never_unpinned(steps: list[tuple[int, int, bool, float]]) -> None:
    table = BindingTable([Partition("a"), Partition("b")], load_factor=1.25, user_idle_s=10.0, branch_idle_s=10.0)
    now, open_requests = 0.0, []
    for user, branch, finish_now, dt in steps:
        now += dt
        ident = _identity(str(user), f"b{branch}")
        got = table.route(ident, now)
        open_requests.append((ident, got.partition))
        if finish_now:  # end the oldest request
            done, _ = open_requests.pop(0)
            table.done(done, now)
        table.sweep(now)
        for ident_open, partition in open_requests:  # every branch with a request in flight keeps its pin
            assert table.binder.branch_partition(ident_open.branch or "") == partition


def test_idle_users_and_branches_expire_and_finished_branches_unpin() -> None:
    table = BindingTable([Partition("a"), Partition("b")], load_factor=1.25, user_idle_s=10.0, branch_idle_s=20.0)
    first = _identity("u", "b1")
    table.route(first, 0.0)
    table.done(first, 1.0)
    assert table.sweep(5.0) == (0, 0)
    assert table.sweep(11.0) == (1, 0) and table.binder.partition_of("user:u") is None
    assert table.binder.branch_partition("b1") is not None
    assert table.sweep(21.0) == (0, 1) and table.binder.branch_partition("b1") is None
    last = _identity("u", "b2", finish=True)
    table.route(last, 30.0)
    table.done(last, 31.0)
    assert table.binder.branch_partition("b2") is None  # the finished flag ends the pin when the request ends
