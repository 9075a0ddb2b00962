"""Optional peer: the SGLang Model Gateway (`smg` 1.13 from scripts/peers/setup-smg.sh) routes a request stream
to workers speaking our SGLang API subset on loopback, while our cache-aware policy decides from the same
history. Skips with the reason when `smg` is missing; bounded in time. The causes logic is tested without it."""

from __future__ import annotations

import asyncio

import pytest

from evolving_infra.peers.smg_judge import Cause, Decision, SmgUnavailable, classify, find_smg, run_differential
from evolving_infra.router.routing.cache_aware import CacheAwareSettings
from evolving_infra.traces.testing import TraceShape, random_trace

try:
    find_smg()
    REASON = None
except SmgUnavailable as exc:
    REASON = str(exc)


def decision(gateway: str, ours: str, reason: str, loads: list[int], gloads: list[int] | None = None,
             char: float = 0.0, page: float = 0.0) -> Decision:  # fmt: skip
    names = [f"w{i}" for i in range(len(loads))]
    return Decision("r", gateway, ours, reason, dict(zip(names, loads, strict=True)),
                    dict(zip(names, gloads or loads, strict=True)), char, page)  # fmt: skip


def test_causes() -> None:
    assert classify(decision("w1", "w0", "low-match-least-loaded", [0, 0, 1]), 0.3) is Cause.TIE
    assert classify(decision("w1", "w0", "low-match-least-loaded", [0, 0], [1, 0]), 0.3) is Cause.LOAD_RACE
    assert classify(decision("w1", "w0", "low-match-least-loaded", [0, 1], char=0.35, page=0.2), 0.3) is (
        Cause.PAGE_ROUNDING
    )
    assert classify(decision("w1", "w0", "cache-match", [0, 1], char=0.9, page=0.8), 0.3) is Cause.HOLDER
    assert classify(decision("w1", "w0", "low-match-least-loaded", [0, 2]), 0.3) is Cause.OTHER


@pytest.mark.skipif(REASON is not None, reason=f"optional peer smg unavailable: {REASON}")
def test_gateway_differential() -> None:
    """Every request is placed by the real gateway and decided by ours; the load counts our policy keeps equal
    the gateway's own (GET /workers) at almost every decision, and where both route by cache they agree."""
    trace = random_trace(1, TraceShape(max_prefixes=2, max_agents=6, max_steps=10, max_tokens=500))
    report = asyncio.run(
        run_differential(trace, workers=3, concurrency=4, max_requests=40, settings=CacheAwareSettings(),
                         timeout_s=120)  # fmt: skip
    )
    assert report.requests == min(40, len(trace.requests))
    assert report.agreements + sum(report.causes.values()) == report.requests
    same_loads = sum(d.loads == d.gateway_loads for d in report.decisions)
    assert same_loads >= 0.9 * report.requests
    both_cache = [d for d in report.decisions if d.reason == "cache-match" and d.char_rate > 0.3]
    assert both_cache, "the stream must exercise cache hits"
    assert sum(d.gateway == d.ours for d in both_cache) >= 0.9 * len(both_cache)


def test_common_prefix() -> None:
    from evolving_infra.peers.smg_judge import char_match_rate, common_prefix

    assert common_prefix("abcdef", "abcxyz") == 3 and common_prefix("", "a") == 0 and common_prefix("ab", "ab") == 2
    assert char_match_rate("abcd", ["abxx", "abcz"]) == 0.75 and char_match_rate("q", []) == 0.0
