"""The policy registries: every policy by name, settings by keyword, and errors that name what is allowed."""

from __future__ import annotations

import random

import pytest

from evolving_infra.router.routing import (
    CacheAwareRouter,
    DecodePolicyName,
    DynamoKvRouter,
    PrefillPolicyName,
    TtftRouter,
    WaitModel,
    make_decode_binder,
    make_prefill_router,
)


def test_prefill_registry_builds_every_policy_by_name() -> None:
    for name in PrefillPolicyName:
        router = make_prefill_router(name)
        assert router.name is name
        assert make_prefill_router(name.value).name is name
    router = make_prefill_router("cache-aware", cache_threshold=0.5)
    assert isinstance(router, CacheAwareRouter) and router.settings.cache_threshold == 0.5
    router = make_prefill_router("ttft", wait_model="sum-of-service-times", copy_price_s_per_token=0.0)
    assert isinstance(router, TtftRouter) and router.settings.wait_model is WaitModel.SUM_OF_SERVICE_TIMES
    for decode_name in DecodePolicyName:
        assert make_decode_binder(decode_name.value, random.Random(0)).name is decode_name
    rng = random.Random(3)
    dynamo = make_prefill_router("dynamo-kv-pool", rng=rng)
    assert isinstance(dynamo, DynamoKvRouter) and dynamo.settings.with_memory_pool and dynamo.rng is rng


def test_registries_name_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="unknown prefill routing policy 'nope'; known: ttft, cache-aware"):
        make_prefill_router("nope")
    with pytest.raises(ValueError, match="unknown setting.*cache_treshold.*allowed: .*cache_threshold"):
        make_prefill_router("cache-aware", cache_treshold=0.5)
    with pytest.raises(ValueError, match="unknown setting.*with_memory_pool"):  # the policy's name fixes it
        make_prefill_router("dynamo-kv", with_memory_pool=True)
    with pytest.raises(ValueError, match="settings.wait_model: Input should be"):
        make_prefill_router("ttft", wait_model="guess")
    with pytest.raises(ValueError, match="unknown decode binding policy 'random'"):
        make_decode_binder("random", random.Random(0))
    with pytest.raises(ValueError, match="allowed: none"):
        make_decode_binder("fewest-requests", random.Random(0), require_room=False)
    with pytest.raises(ValueError, match="cache_threshold must lie in"):
        make_prefill_router("cache-aware", cache_threshold=1.5)
