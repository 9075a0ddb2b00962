"""Decode binding: ours (KV room, then fewest requests) and the baselines round robin and power of two."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, RequestId
from evolving_infra.router.routing import (
    BindReason,
    DecodeNodeView,
    DecodePolicyName,
    PowerOfTwoBinder,
    RouteRequest,
    make_decode_binder,
)


def request(prompt: int = 1000, output: int = 200) -> RouteRequest:
    return RouteRequest(RequestId("r"), BranchId("b"), (PageHash(1),), prompt_tokens=prompt, output_tokens=output)


def decode(node: str, running: int, free: int) -> DecodeNodeView:
    return DecodeNodeView(NodeId(node), running_requests=running, free_kv_tokens=free)


@pytest.mark.parametrize(
    ("nodes", "expected", "reason"),
    [
        # fewest requests among those with room (needs 1,200 tokens)
        (
            [decode("d-a", 5, 10_000), decode("d-b", 2, 10_000), decode("d-c", 1, 1_199)],
            "d-b",
            BindReason.FEWEST_REQUESTS,
        ),
        # exactly enough room counts
        ([decode("d-a", 5, 10_000), decode("d-c", 1, 1_200)], "d-c", BindReason.FEWEST_REQUESTS),
        # tie on requests: smaller node id
        ([decode("d-z", 3, 10_000), decode("d-m", 3, 10_000)], "d-m", BindReason.FEWEST_REQUESTS),
        # nobody has room
        ([decode("d-a", 0, 100), decode("d-b", 0, 1_000)], None, BindReason.NO_KV_ROOM),
        # no decode node at all
        ([], None, BindReason.NO_DECODE_NODE),
    ],
)
def test_ours_binds_the_node_with_room_and_fewest_requests(
    nodes: list[DecodeNodeView], expected: str | None, reason: BindReason
) -> None:
    binder = make_decode_binder(DecodePolicyName.FEWEST_REQUESTS, random.Random(0))
    binding = binder.bind(request(), nodes, now=0.0)
    assert (binding.node, binding.reason, binding.kv_tokens) == (expected, reason, 1_200)


def test_round_robin_binder_cycles_and_ignores_room_unless_asked() -> None:
    binder = make_decode_binder("round-robin", random.Random(0))
    nodes = [decode("d-b", 9, 0), decode("d-a", 0, 0)]
    picks = []
    for _ in range(3):
        binding = binder.bind(request(), nodes, now=0.0)
        binder.on_bound(request(), binding, now=0.0)
        picks.append(binding.node)
    assert picks == ["d-a", "d-b", "d-a"]
    strict = make_decode_binder("round-robin", random.Random(0), require_room=True)
    assert strict.bind(request(), nodes, now=0.0).reason is BindReason.NO_KV_ROOM


def test_power_of_two_picks_the_less_loaded_of_two_seeded_draws() -> None:
    nodes = [decode("d-a", 0, 10**6), decode("d-b", 5, 10**6), decode("d-c", 10, 10**6)]
    binder = PowerOfTwoBinder(random.Random(42))
    picks = [binder.bind(request(), nodes, now=0.0).node for _ in range(300)]
    assert "d-c" not in picks  # the most loaded node loses every pair it is drawn into
    assert {"d-a", "d-b"} <= set(picks)
    replay = PowerOfTwoBinder(random.Random(42))
    assert [replay.bind(request(), nodes, now=0.0).node for _ in range(300)] == picks
    assert binder.bind(request(), nodes[:1], now=0.0).node == "d-a"


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5_000)), min_size=1, max_size=8), st.integers(0, 10**6))
def test_ours_never_binds_a_node_without_room_or_with_more_requests_than_a_roomy_one(
    specs: list[tuple[int, int]], seed: int
) -> None:
    nodes = [decode(f"d{i}", running, free) for i, (running, free) in enumerate(specs)]
    req = request(prompt=1_000, output=random.Random(seed).randint(0, 3_000))
    binding = make_decode_binder("fewest-requests", random.Random(seed)).bind(req, nodes, now=0.0)
    roomy = [v for v in nodes if v.free_kv_tokens >= binding.kv_tokens]
    if not roomy:
        assert binding.node is None and binding.reason is BindReason.NO_KV_ROOM
        return
    chosen = next(v for v in nodes if v.node == binding.node)
    assert chosen.free_kv_tokens >= binding.kv_tokens
    assert all(chosen.running_requests <= v.running_requests for v in roomy)
