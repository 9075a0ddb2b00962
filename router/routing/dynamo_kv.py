"""Baseline: the Dynamo KV router's cost (and its "+ memory pool" variant).

Rule, per worker w, in blocks (pages), with `loads=dynamo` (the default, as Dynamo's router source keeps its
loads: `ActiveSequences` in `lib/llm/src/kv_router/sequence.rs` of ai-dynamo, its `new_tokens`, `new_blocks` and
`potential_blocks_and_tokens`):
- credit = 1.0 x blocks cached on GPU + 0.75 x blocks in host memory + 0.25 x blocks on disk, the cached blocks
  being the leading run of the request's pages w holds;
- prefill = the prefill blocks charged to w (each request routed there counts the blocks it had to compute
  there, prompt blocks - credit at its routing, until its first token) + max(the request's prompt blocks -
  credit, 0);
- decode = w's active blocks, each distinct page counted once however many in-flight requests share it, + the
  request's full pages not among them. A request is active on w from routing until w is done with it: the
  end of its prefill on a disaggregated prefill worker, whose own request ends once the KV is handed to
  decode (`disaggregated`, the default), or its finish on an aggregated one;
- cost = prefill + decode.
`loads=prompt-blocks` keeps the reading of shared/baselines.md and the paper's appendix A.3: every in-flight
request charges its whole prompt to prefill (credit subtracted once, from the sum) and to decode (no sharing),
and the request's own blocks are not in decode. Judged against Dynamo's own replay (docs/peers.md), that reading
pushed closed-loop requests off their cache holders (prefix reuse 0.870 against Dynamo's 0.894, TTFT P95 +30 %),
and charging decode blocks on prefill workers until the requests finished elsewhere cost 5 points of reuse.
Lowest cost wins (temperature 0); ties go to the worker with the smallest cached tree, then to a seeded
random choice. Loads are the router's own bookkeeping, not reports from workers.

It routes but moves no KV: the chosen worker recomputes what it lacks. With `with_memory_pool`, the
worker instead fetches the missing prefix pages from the shared pool, loaded into GPU memory only when
its prefill starts (`FetchTiming.AT_PREFILL_START`; the data plane enforces it). Routing is unchanged by
default; `pool_credit` > 0 optionally credits those pool pages as a further tier.

Invariant: every adjusted prefill and every cost is >= 0, and the adjusted prefill is >= raw prefill - credit.

Boundary: pure policy state (charges) changed only by the hooks; random tie-breaks draw from the
generator passed in.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, RequestId
from evolving_infra.router.routing.base import (
    FetchTiming,
    NodeScore,
    PrefillPolicyName,
    RouteReason,
    RoutingDecision,
    by_node,
    decision_without_fetch,
)
from evolving_infra.router.routing.inputs import PrefillNodeView, RouteRequest, unique_nodes


class DynamoLoads(str, enum.Enum):
    """How the router counts a worker's load (module docstring)."""

    DYNAMO = "dynamo"
    PROMPT_BLOCKS = "prompt-blocks"


@dataclass(frozen=True, slots=True)
class DynamoKvSettings:
    gpu_credit: float = 1.0
    host_credit: float = 0.75
    disk_credit: float = 0.25
    with_memory_pool: bool = False
    pool_credit: float = 0.0
    disaggregated: bool = True
    """Prefill workers of a disaggregated cluster: a request stops counting on its worker at its first token."""
    loads: DynamoLoads = DynamoLoads.DYNAMO

    def __post_init__(self) -> None:
        object.__setattr__(self, "loads", DynamoLoads(self.loads))
        for name in ("gpu_credit", "host_credit", "disk_credit", "pool_credit"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1] blocks per cached block, got {value}")


@dataclass(slots=True)
class _Charge:
    node: NodeId
    prefill: float
    """Prefill blocks charged until the first token."""
    decode: int
    """Decode blocks charged (`prompt-blocks`); with `dynamo` the pages below count instead."""
    pages: tuple[PageHash, ...]
    prefilling: bool


@dataclass(frozen=True, slots=True)
class DynamoCost:
    node: NodeId
    charged_prefill: float
    new_prefill: int
    credit: float
    decode_blocks: int
    credit_on_charged: bool = False
    """`prompt-blocks`: the credit comes off the charged blocks too (one max over the sum)."""

    @property
    def raw_prefill(self) -> float:
        return self.charged_prefill + self.new_prefill

    @property
    def adjusted_prefill(self) -> float:
        if self.credit_on_charged:
            return max(self.raw_prefill - self.credit, 0.0)
        return self.charged_prefill + max(self.new_prefill - self.credit, 0.0)

    @property
    def cost(self) -> float:
        return self.adjusted_prefill + self.decode_blocks


def prompt_blocks(request: RouteRequest) -> int:
    return math.ceil(request.prompt_tokens / request.page_tokens)


class DynamoKvRouter:
    def __init__(self, settings: DynamoKvSettings | None = None, rng: random.Random | None = None) -> None:
        self.settings = settings if settings is not None else DynamoKvSettings()
        self.rng = rng if rng is not None else random.Random(0)
        self._charges: dict[RequestId, _Charge] = {}
        self._prefill: dict[NodeId, float] = {}
        self._decode: dict[NodeId, int] = {}
        self._active: dict[NodeId, dict[PageHash, int]] = {}
        """`dynamo` loads: per worker, each active page and how many in-flight requests hold it."""

    @property
    def name(self) -> PrefillPolicyName:
        return PrefillPolicyName.DYNAMO_KV_POOL if self.settings.with_memory_pool else PrefillPolicyName.DYNAMO_KV

    def credit(self, view: PrefillNodeView) -> float:
        s = self.settings
        credit = s.gpu_credit * view.own_gpu_pages + s.host_credit * view.own_host_pages
        credit += s.disk_credit * view.own_disk_pages
        if s.with_memory_pool:
            credit += s.pool_credit * (view.cluster_prefix_pages - view.own_pages)
        return credit

    def cost(self, request: RouteRequest, view: PrefillNodeView) -> DynamoCost:
        view.check_pages(request)
        if self.settings.loads is DynamoLoads.PROMPT_BLOCKS:
            decode, on_charged = self._decode.get(view.node, 0), True
        else:
            active = self._active.get(view.node, {})
            decode = len(active) + sum(1 for page in request.page_hashes if page not in active)
            on_charged = False
        return DynamoCost(view.node, self._prefill.get(view.node, 0.0), prompt_blocks(request), self.credit(view),
                          decode, on_charged)  # fmt: skip

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        unique_nodes(nodes, "prefill")
        costs = [self.cost(request, view) for view in nodes]
        lowest = min(c.cost for c in costs)
        tied = sorted((c.node for c in costs if c.cost == lowest))
        smallest_tree = min(by_node(nodes, n).cached_pages for n in tied)
        tied = [n for n in tied if by_node(nodes, n).cached_pages == smallest_tree]
        node = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        diagnostics = tuple(
            NodeScore(c.node, c.cost, {"raw_prefill": float(c.raw_prefill), "credit": c.credit,
                                       "adjusted_prefill": c.adjusted_prefill,
                                       "decode_blocks": float(c.decode_blocks), "cost": c.cost})
            for c in costs
        )
        view = by_node(nodes, node)
        plain = decision_without_fetch(request, view, self.name, RouteReason.LOWEST_KV_COST, diagnostics)
        if not self.settings.with_memory_pool or view.fetch_pages == 0:
            return plain
        cached = request.usable_cached_tokens(view.cluster_prefix_pages)
        return RoutingDecision(
            node=node,
            policy=self.name,
            reason=RouteReason.LOWEST_KV_COST,
            cached_tokens=cached,
            uncached_tokens=request.prompt_tokens - cached,
            fetch_tokens=view.fetch_pages * request.page_tokens,
            recompute_tokens=0,
            fetch_from=view.fetch_sources,
            fetch_timing=FetchTiming.AT_PREFILL_START,
            diagnostics=diagnostics,
        )

    def on_routed(self, request: RouteRequest, decision: RoutingDecision, now: float) -> None:
        self.on_finished(request.id, now)
        blocks = prompt_blocks(request)
        if self.settings.loads is DynamoLoads.PROMPT_BLOCKS:
            charge = _Charge(decision.node, float(blocks), blocks, (), True)
        else:  # the blocks it computes there: its prompt less the credit it was routed with
            try:
                credit = decision.score_of(decision.node).terms.get("credit", 0.0)
            except KeyError:  # a decision made elsewhere: no credit known, the whole prompt
                credit = 0.0
            charge = _Charge(decision.node, max(blocks - credit, 0.0), 0, request.page_hashes, True)
            active = self._active.setdefault(decision.node, {})
            for page in charge.pages:
                active[page] = active.get(page, 0) + 1
        self._charges[request.id] = charge
        _add(self._prefill, charge.node, charge.prefill)
        _add(self._decode, charge.node, charge.decode)

    def on_first_token(self, request: RequestId, now: float) -> None:
        charge = self._charges.get(request)
        if charge is not None and charge.prefilling:
            charge.prefilling = False
            _add(self._prefill, charge.node, -charge.prefill)
            if self.settings.disaggregated:
                self._release(self._charges.pop(request))

    def on_finished(self, request: RequestId, now: float) -> None:
        self.on_first_token(request, now)
        charge = self._charges.pop(request, None)
        if charge is not None:
            self._release(charge)

    def _release(self, charge: _Charge) -> None:
        """The request is no longer active on its worker: its decode blocks stop counting."""
        _add(self._decode, charge.node, -charge.decode)
        if charge.pages:
            active = self._active[charge.node]
            for page in charge.pages:
                left = active[page] - 1
                if left:
                    active[page] = left
                else:
                    del active[page]
            if not active:
                del self._active[charge.node]

    def on_branch_finished(self, branch: BranchId, now: float) -> None:
        return None


def _add(totals: dict[NodeId, float] | dict[NodeId, int], node: NodeId, blocks: float) -> None:
    left = totals.get(node, 0) + blocks
    if abs(left) > 1e-9:
        totals[node] = left  # type: ignore[assignment]
    else:
        totals.pop(node, None)
