"""Baseline: the SGLang Model Gateway's cache-aware prefill routing, with its command-line defaults.

Rule (shared/baselines.md, "SGLang Model Gateway, cache-aware"):
1. Load = the gateway's own count of in-flight requests per worker (+1 when routed, -1 when the request
   finishes; the gateway never hears queue lengths or cache contents).
2. Imbalanced when (max load - min load) > `balance_abs_threshold` AND max load > min load x
   `balance_rel_threshold`: route to the least-loaded worker (the request still enters the tree).
3. Otherwise match the prompt against the approximate tree of what was sent to each worker; if the
   longest match / prompt length > `cache_threshold`, route to a worker holding that longest match
   (the most recently used one there, as the gateway's tree reports it; load is not considered among
   them); else to the least-loaded worker.
4. Every `eviction_interval_s` the tree is cut down to `max_tree_size` characters per worker, LRU leaves
   first.
Least-loaded ties go to the smallest node id. The matching unit is the page (see `approx_tree.py`).
It routes but moves no KV: the chosen worker recomputes what it lacks.

Boundary: pure policy state (tree, loads) changed only by the hooks; time passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.core.types import BranchId, RequestId
from evolving_infra.router.routing.approx_tree import ApproxPrefixTree
from evolving_infra.router.routing.base import (
    NodeScore,
    PrefillPolicyName,
    RouteReason,
    RoutingDecision,
    by_node,
    decision_without_fetch,
)
from evolving_infra.router.routing.inputs import PrefillNodeView, RouteRequest, unique_nodes
from evolving_infra.router.routing.loads import InFlightCounter


@dataclass(frozen=True, slots=True)
class CacheAwareSettings:
    """The gateway's command-line defaults; `chars_per_token` converts its character-sized tree bound."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_size: int = 2**26
    chars_per_token: float = 4.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must lie in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}")
        if not self.balance_rel_threshold >= 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold}")
        if not self.eviction_interval_s > 0:
            raise ValueError(f"eviction_interval_s must be > 0, got {self.eviction_interval_s}")
        if self.max_tree_size < 0:
            raise ValueError(f"max_tree_size must be >= 0 characters, got {self.max_tree_size}")
        if not self.chars_per_token > 0:
            raise ValueError(f"chars_per_token must be > 0, got {self.chars_per_token}")

    def max_tree_pages(self, page_tokens: int) -> int:
        return int(self.max_tree_size // (page_tokens * self.chars_per_token))


class CacheAwareRouter:
    def __init__(self, settings: CacheAwareSettings | None = None) -> None:
        self.settings = settings if settings is not None else CacheAwareSettings()
        self.tree = ApproxPrefixTree()
        self.loads = InFlightCounter()
        self._page_tokens: int | None = None
        self._next_eviction = self.settings.eviction_interval_s

    @property
    def name(self) -> PrefillPolicyName:
        return PrefillPolicyName.CACHE_AWARE

    def is_imbalanced(self, loads: Sequence[int]) -> bool:
        low, high = min(loads), max(loads)
        s = self.settings
        return high - low > s.balance_abs_threshold and high > low * s.balance_rel_threshold

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        unique_nodes(nodes, "prefill")
        ids = [v.node for v in nodes]
        matches = {n: self.tree.match(n, request.page_hashes) for n in ids}
        diagnostics = tuple(
            NodeScore(n, float(self.loads.load(n)),
                      {"load": float(self.loads.load(n)), "matched_tokens": float(matches[n] * request.page_tokens)})
            for n in ids
        )
        if self.is_imbalanced([self.loads.load(n) for n in ids]):
            node, reason = self.loads.least_loaded(ids), RouteReason.IMBALANCED_LEAST_LOADED
        else:
            longest = max(matches.values())
            rate = longest * request.page_tokens / request.prompt_tokens
            if longest > 0 and rate > self.settings.cache_threshold:
                last = request.page_hashes[longest - 1]
                holders = [n for n in ids if matches[n] == longest]
                node = min(holders, key=lambda n: (_negate(self.tree.recency(n, last)), n))
                reason = RouteReason.CACHE_MATCH
            else:
                node, reason = self.loads.least_loaded(ids), RouteReason.LOW_MATCH_LEAST_LOADED
        return decision_without_fetch(request, by_node(nodes, node), self.name, reason, diagnostics)

    def tick(self, now: float) -> int:
        """Run the periodic tree eviction if its time has come; returns the pages evicted."""
        if now < self._next_eviction or self._page_tokens is None:
            return 0
        interval = self.settings.eviction_interval_s
        self._next_eviction = (math.floor(now / interval) + 1) * interval
        limit = self.settings.max_tree_pages(self._page_tokens)
        return sum(self.tree.evict_to(worker, limit) for worker in self.tree.workers())

    def on_routed(self, request: RouteRequest, decision: RoutingDecision, now: float) -> None:
        self._page_tokens = request.page_tokens
        self.tick(now)
        self.loads.add(request.id, decision.node)
        self.tree.insert(decision.node, request.page_hashes, now)

    def on_first_token(self, request: RequestId, now: float) -> None:
        self.tick(now)

    def on_finished(self, request: RequestId, now: float) -> None:
        self.tick(now)
        self.loads.remove(request)

    def on_branch_finished(self, branch: BranchId, now: float) -> None:
        self.tick(now)


def _negate(recency: tuple[float, int]) -> tuple[float, int]:
    return (-recency[0], -recency[1])
