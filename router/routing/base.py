"""The routing vocabulary: policy names, decisions with diagnostics, and the two policy interfaces.

- `PrefillRouter.route(request, nodes, now)` picks the prefill node and says how the node obtains the
  prefix (reuse its own, fetch the rest from peers, or recompute it); the caller then reports what
  happened through the `on_*` hooks, which is the only way a policy's own state (loads, trees, cursors)
  changes. Calling `route` again without a hook call gives the same answer (except for seeded random
  tie-breaks, which draw from the generator passed in).
- `DecodeBinder.bind(request, nodes, now)` picks the decode node when the prefill starts, or None with a
  reason; `on_bound` advances its state.

Boundary: plain values and Protocols; each policy lives in its own module, the registry in `registry.py`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.types import BranchId, NodeId, RequestId
from evolving_infra.router.routing.inputs import (
    DecodeNodeView,
    PrefillNodeView,
    RouteRequest,
)


class PrefillPolicyName(enum.Enum):
    """Prefill routing policies: ours and the baselines of `docs/routing.md`."""

    TTFT = "ttft"
    CACHE_AWARE = "cache-aware"
    STICKY = "sticky"
    DYNAMO_KV = "dynamo-kv"
    DYNAMO_KV_POOL = "dynamo-kv-pool"
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"


class DecodePolicyName(enum.Enum):
    """Decode binding policies: ours (fewest requests with KV room) and two baselines."""

    FEWEST_REQUESTS = "fewest-requests"
    ROUND_ROBIN = "round-robin"
    POWER_OF_TWO = "power-of-two"


class FetchTiming(enum.Enum):
    """When fetched prefix KV reaches GPU memory (the data plane enforces it)."""

    NONE = "none"
    """Nothing is fetched."""
    WHILE_QUEUED = "while-queued"
    """Ours: the fetch starts when the request arrives and completes (into GPU memory) before its prefill."""
    AT_PREFILL_START = "at-prefill-start"
    """HiCache-style pool: fetched KV is loaded into GPU memory only when the prefill starts."""


class RouteReason(enum.Enum):
    """Which rule of its policy picked the node."""

    LOWEST_PREDICTED_TTFT = "lowest-predicted-ttft"
    IMBALANCED_LEAST_LOADED = "imbalanced-least-loaded"
    CACHE_MATCH = "cache-match"
    LOW_MATCH_LEAST_LOADED = "low-match-least-loaded"
    STICKY = "sticky"
    STICKY_INHERITED = "sticky-inherited"
    STICKY_FIRST_LEAST_LOADED = "sticky-first-least-loaded"
    LOWEST_KV_COST = "lowest-kv-cost"
    ROUND_ROBIN = "round-robin"
    LEAST_LOADED = "least-loaded"


class BindReason(enum.Enum):
    FEWEST_REQUESTS = "fewest-requests"
    ROUND_ROBIN = "round-robin"
    POWER_OF_TWO = "power-of-two"
    NO_DECODE_NODE = "no-decode-node"
    NO_KV_ROOM = "no-kv-room"


@dataclass(frozen=True)
class NodeScore:
    """One candidate node's score under a policy (lower is better unless the policy says otherwise)
    and the named terms it was computed from."""

    node: NodeId
    score: float
    terms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RoutingDecision:
    """Where a request's prefill runs and how that node obtains the prefix.

    cached_tokens: prefix tokens the node reuses (its own plus fetched); uncached_tokens: tokens it
    computes (prompt - cached_tokens); fetch_tokens: tokens it fetches from peers (`fetch_from` names
    the peer of each page run where known); recompute_tokens: tokens cached somewhere in the cluster
    that the node computes again instead of reusing.
    """

    node: NodeId
    policy: PrefillPolicyName | str
    """The policy that decided (a declared plugin policy names itself with a string)."""
    reason: RouteReason
    cached_tokens: int
    uncached_tokens: int
    fetch_tokens: int = 0
    recompute_tokens: int = 0
    fetch_from: tuple[FetchRun, ...] | None = None
    fetch_timing: FetchTiming = FetchTiming.NONE
    diagnostics: tuple[NodeScore, ...] = ()

    def __post_init__(self) -> None:
        for name in ("cached_tokens", "uncached_tokens", "fetch_tokens", "recompute_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"routing decision for {self.node}: {name} must be >= 0")
        if (self.fetch_tokens > 0) != (self.fetch_timing is not FetchTiming.NONE):
            raise ValueError(
                f"routing decision for {self.node}: fetch_timing {self.fetch_timing.value} does not match "
                f"fetch_tokens {self.fetch_tokens} (NONE exactly when nothing is fetched)"
            )

    def score_of(self, node: NodeId) -> NodeScore:
        for score in self.diagnostics:
            if score.node == node:
                return score
        raise KeyError(f"no diagnostics for node {node}")


@dataclass(frozen=True)
class DecodeBinding:
    """The decode node for a request (None when none can take it, with the reason). `views`: the decode nodes it
    chose among, as it saw them; `diagnostics` scores them (made when read: a binding is made per request, its
    diagnostics are read rarely)."""

    node: NodeId | None
    policy: DecodePolicyName
    reason: BindReason
    kv_tokens: int
    views: tuple[DecodeNodeView, ...] = ()

    @property
    def diagnostics(self) -> tuple[NodeScore, ...]:
        """Per node of `views`: its running requests as the score, and its free KV tokens."""
        return tuple(
            NodeScore(v.node, float(v.running_requests),
                      {"running_requests": float(v.running_requests), "free_kv_tokens": float(v.free_kv_tokens)})
            for v in self.views
        )


class PrefillRouter(Protocol):
    """A prefill routing policy. Time is passed in (seconds); the policy never reads a clock."""

    @property
    def name(self) -> PrefillPolicyName: ...

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        """Pick one of `nodes` (non-empty, distinct) for `request`; does not change the policy's state."""
        ...

    def on_routed(self, request: RouteRequest, decision: RoutingDecision, now: float) -> None:
        """The request was sent where `decision` says."""
        ...

    def on_first_token(self, request: RequestId, now: float) -> None:
        """The request's prefill finished (its first token exists)."""
        ...

    def on_finished(self, request: RequestId, now: float) -> None:
        """The request left the system (last token, error or cancel). Unknown ids are ignored."""
        ...

    def on_branch_finished(self, branch: BranchId, now: float) -> None:
        """The harness reported that `branch` finished."""
        ...


class DecodeBinder(Protocol):
    @property
    def name(self) -> DecodePolicyName: ...

    def bind(self, request: RouteRequest, nodes: Sequence[DecodeNodeView], now: float) -> DecodeBinding:
        """Pick the decode node for `request` as its prefill starts, or None with the reason."""
        ...

    def on_bound(self, request: RouteRequest, binding: DecodeBinding, now: float) -> None:
        """The request was bound as `binding` says."""
        ...


class RouterHooks:
    """No-op `on_*` hooks for policies that keep no state of their own (subclasses override some)."""

    def on_routed(self, request: RouteRequest, decision: RoutingDecision, now: float) -> None:
        return None

    def on_first_token(self, request: RequestId, now: float) -> None:
        return None

    def on_finished(self, request: RequestId, now: float) -> None:
        return None

    def on_branch_finished(self, branch: BranchId, now: float) -> None:
        return None


def decision_without_fetch(
    request: RouteRequest,
    view: PrefillNodeView,
    policy: PrefillPolicyName,
    reason: RouteReason,
    diagnostics: tuple[NodeScore, ...] = (),
) -> RoutingDecision:
    """The decision of a policy that moves no KV: the node reuses its own prefix and recomputes the rest."""
    view.check_pages(request)
    cached = request.usable_cached_tokens(view.own_pages)
    cluster = request.usable_cached_tokens(view.cluster_prefix_pages)
    return RoutingDecision(
        node=view.node,
        policy=policy,
        reason=reason,
        cached_tokens=cached,
        uncached_tokens=request.prompt_tokens - cached,
        recompute_tokens=cluster - cached,
        diagnostics=diagnostics,
    )


def by_node(views: Sequence[PrefillNodeView], node: NodeId) -> PrefillNodeView:
    for view in views:
        if view.node == node:
            return view
    raise KeyError(f"no view for prefill node {node}")
