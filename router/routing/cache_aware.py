"""Baseline: the SGLang Model Gateway's cache-aware prefill routing, with its command-line defaults.

Rule (shared/baselines.md, "SGLang Model Gateway, cache-aware"):
1. Load = the gateway's own count of in-flight requests per worker (+1 when routed, -1 when the request
   finishes; the gateway never hears queue lengths or cache contents). In PD disaggregation the prefill
   worker's count is released when the *decode* finishes, not when the prefill does: SGLang's PD router
   (sgl-project/sglang `sgl-router/src/routers/http/pd_router.rs`, checked at commit 0105f2a3) takes one
   load guard over both workers in `PDRouter::execute_dual_dispatch_internal` (non-streaming: dropped when the
   function returns, after the decode response has been read; the prefill response is drained in the
   background and does not release it) and, for streaming, `PDRouter::create_streaming_response`
   increments both loads and decrements both once the decode stream ends (`[DONE]` or an error). So a
   prefill worker counts a request until its last token, as `on_finished` does here.
2. Load balance, by `gate` (`BalanceGate`):
   - `spill` (default; smg 1.13, `--balance-abs-threshold` help, judged live in docs/peers.md): a *matched*
     worker is skipped for the least-loaded one when its load exceeds the mean load of the workers by a
     margin AND exceeds `balance_rel_threshold` x that mean; the margin is `balance_abs_threshold` capped at
     the in-flight count's natural swing at the mean, two standard deviations (2 sqrt(mean), a Poisson
     count), but never under 4 (unless the threshold is lower). Least-loaded ties go to the worker that was
     sent the fewest requests, then to the first in the given order (smg's (load, processed, index)).
   - `global` (the classic rule of shared/baselines.md): imbalanced when (max load - min load) >
     `balance_abs_threshold` AND max load > min load x `balance_rel_threshold`: route to the least-loaded
     worker (ties to the smallest node id) before any matching.
   Either way the request still enters the tree.
3. Otherwise match the prompt against the approximate tree of what was sent to each worker; if the
   longest match / prompt length > `cache_threshold`, route to a worker holding that longest match
   (the most recently used one there; load is not considered among them); else to the least-loaded worker.
   (Judged against the real gateway, docs/peers.md: smg 1.13's choice among equal holders followed neither
   this nor the node's creator, which smg's v1.9 tree source suggests, consistently; kept as it was.)
4. Every `eviction_interval_s` the tree is cut down to `max_tree_size` characters per worker, LRU leaves
   first.
The matching unit is the page (see `approx_tree.py`).
It routes but moves no KV: the chosen worker recomputes what it lacks.

Boundary: pure policy state (tree, loads) changed only by the hooks; time passed in.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.core.types import BranchId, NodeId, RequestId
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


class BalanceGate(enum.Enum):
    """How load overrides cache affinity (module docstring, rule 2)."""

    SPILL = "spill"
    GLOBAL = "global"


@dataclass(frozen=True, slots=True)
class CacheAwareSettings:
    """The gateway's command-line defaults; `chars_per_token` converts its character-sized tree bound."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_size: int = 2**26
    chars_per_token: float = 4.0
    gate: BalanceGate = BalanceGate.SPILL

    def __post_init__(self) -> None:
        if not isinstance(self.gate, BalanceGate):
            object.__setattr__(self, "gate", BalanceGate(self.gate))
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
        self.processed: Counter[NodeId] = Counter()
        """Requests routed to each worker so far (the spill gate's least-loaded tie-break)."""

    @property
    def name(self) -> PrefillPolicyName:
        return PrefillPolicyName.CACHE_AWARE

    def is_imbalanced(self, loads: Sequence[int]) -> bool:
        low, high = min(loads), max(loads)
        s = self.settings
        return high - low > s.balance_abs_threshold and high > low * s.balance_rel_threshold

    def spill_margin(self, mean: float) -> float:
        """How far above the mean load a matched worker may be before the spill gate skips it."""
        cap = float(self.settings.balance_abs_threshold)
        return min(cap, max(min(4.0, cap), 2.0 * math.sqrt(max(mean, 0.0))))

    def spills(self, load: int, loads: Sequence[int]) -> bool:
        """The spill gate: is a matched worker with `load` skipped, given every worker's load?"""
        mean = sum(loads) / len(loads)
        return load > mean + self.spill_margin(mean) and load > self.settings.balance_rel_threshold * mean

    def least_loaded(self, ids: Sequence[NodeId]) -> NodeId:
        """The least-loaded worker: ties by fewest requests sent, then order (spill gate) or node id (global)."""
        if self.settings.gate is BalanceGate.GLOBAL:
            return self.loads.least_loaded(ids)
        order = {n: i for i, n in enumerate(ids)}
        return min(ids, key=lambda n: (self.loads.load(n), self.processed[n], order[n]))

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        unique_nodes(nodes, "prefill")
        ids = [v.node for v in nodes]
        matches = {n: self.tree.match(n, request.page_hashes) for n in ids}
        diagnostics = tuple(
            NodeScore(n, float(self.loads.load(n)),
                      {"load": float(self.loads.load(n)), "matched_tokens": float(matches[n] * request.page_tokens)})
            for n in ids
        )
        loads = [self.loads.load(n) for n in ids]
        spill = self.settings.gate is BalanceGate.SPILL
        if not spill and self.is_imbalanced(loads):
            node, reason = self.least_loaded(ids), RouteReason.IMBALANCED_LEAST_LOADED
        else:
            longest = max(matches.values())
            rate = longest * request.page_tokens / request.prompt_tokens
            if longest > 0 and rate > self.settings.cache_threshold:
                last = request.page_hashes[longest - 1]
                holders = [n for n in ids if matches[n] == longest]
                node = min(holders, key=lambda n: (_negate(self.tree.recency(n, last)), n))
                reason = RouteReason.CACHE_MATCH
                if spill and self.spills(self.loads.load(node), loads):
                    node, reason = self.least_loaded(ids), RouteReason.IMBALANCED_LEAST_LOADED
            else:
                node, reason = self.least_loaded(ids), RouteReason.LOW_MATCH_LEAST_LOADED
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
        self.processed[decision.node] += 1
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
