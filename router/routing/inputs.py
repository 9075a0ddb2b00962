"""What a routing policy reads: the request, one view per prefill node, one view per decode node.

The router service and the simulator fill these plain values (from the KV directory, the nodes' state
reports and the router's own record of what it sent); the policies never reach into those components.

Prefix vocabulary, per prefill node `n` and request `r` (all in whole pages of `r.page_tokens` tokens):
- `own_gpu_pages`: the leading run of `r`'s pages that `n` holds in GPU memory;
- `own_host_pages`: how far that run continues in `n`'s host memory only (so `n` holds the first
  `own_gpu_pages + own_host_pages` pages itself, and restores the host part into GPU memory);
- `own_disk_pages`: further continuation on a disk tier (only baseline data planes have one; 0 here);
- `cluster_prefix_pages`: the longest leading run of `r`'s pages held by *any* node (own or peer);
- `fetch_pages`: pages within that cluster prefix that `n` does not hold and would fetch from peers
  (`fetch_sources` lists them as runs with the peers holding each, where known).

The KV directory's lookup maps onto these directly: GPU prefix, either-tier prefix minus GPU prefix, the
node's reachable prefix, and the pages of its fetch plan.

Boundary: immutable inputs with validation; no policy logic.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast, overload

import numpy as np

from evolving_infra.core.fetch import FetchRun
from evolving_infra.core.pages import DEFAULT_PAGE_TOKENS, PageHash, validate_page_tokens
from evolving_infra.core.types import BranchId, NodeId, RequestId, Work
from evolving_infra.router.routing.nodemodel import PrefillNodeModel


def _non_negative(where: str, **values: int | float) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{where}: {name} must be >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """A request to place: identity, branch, prompt pages and token counts.

    `page_hashes` are the chained hashes of the prompt's *full* pages, so
    `len(page_hashes) * page_tokens <= prompt_tokens`. `output_tokens` is what the request will generate
    (known in traces; the caller's best estimate, e.g. `max_tokens`, live). `parent_branch` names the
    branch this one was forked or spawned from, on its first request.
    """

    id: RequestId
    branch: BranchId
    page_hashes: tuple[PageHash, ...]
    prompt_tokens: int
    output_tokens: int
    t_acc: float = 1.0
    page_tokens: int = DEFAULT_PAGE_TOKENS
    parent_branch: BranchId | None = None

    def __post_init__(self) -> None:
        validate_page_tokens(self.page_tokens)
        where = f"request {self.id}"
        if self.prompt_tokens < 1:
            raise ValueError(f"{where}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        _non_negative(where, output_tokens=self.output_tokens)
        if not self.t_acc > 0:
            raise ValueError(f"{where}: t_acc must be > 0, got {self.t_acc}")
        full = len(self.page_hashes) * self.page_tokens
        if full > self.prompt_tokens:
            raise ValueError(
                f"{where}: {len(self.page_hashes)} full pages of {self.page_tokens} tokens exceed the "
                f"prompt of {self.prompt_tokens} tokens; list only full prompt pages"
            )

    @property
    def prompt_pages(self) -> int:
        return len(self.page_hashes)

    def usable_cached_tokens(self, pages: int) -> int:
        """Tokens of a `pages`-page cached prefix the prefill can reuse.

        At least the last prompt token is always computed (its logits give the first output token), so
        the reusable prefix is capped at `prompt_tokens - 1`.
        """
        return min(pages * self.page_tokens, self.prompt_tokens - 1)


@dataclass(frozen=True, slots=True)
class RunningPrefill:
    """A request whose chunked prefill has started: tokens still to compute, context before the next chunk."""

    request: RequestId
    remaining_tokens: int
    context_tokens: int

    def __post_init__(self) -> None:
        if self.remaining_tokens < 0 or self.context_tokens < 0:  # (the message only when it is needed: a hot path)
            _non_negative(
                f"running request {self.request}",
                remaining_tokens=self.remaining_tokens,
                context_tokens=self.context_tokens,
            )


@dataclass(frozen=True, slots=True)
class QueuedPrefill:
    """A request waiting for its prefill, with its work and the tokens it restores into GPU memory."""

    request: RequestId
    work: Work
    restore_tokens: int = 0

    def __post_init__(self) -> None:
        if self.restore_tokens < 0:
            _non_negative(f"queued request {self.request}", restore_tokens=self.restore_tokens)
        if self.restore_tokens > self.work.t_c:
            raise ValueError(
                f"queued request {self.request}: restore_tokens {self.restore_tokens} exceed its cached "
                f"prefix of {self.work.t_c} tokens"
            )


@dataclass(frozen=True, slots=True)
class PrefillNodeView:
    """One prefill node as the router sees it for one request.

    Prefix fields: see the module docstring. State fields come from the node's latest report
    (`running`, `queue`, `state_age_s`, None when it never reported) plus the router's own record:
    `unreported` are requests sent after that report (in sending order), `router_in_flight` are all
    requests the router sent to the node whose prefill it has not yet seen finish (its own count, used
    when the report is too old). `model` predicts the node's iteration and request times (only the
    TTFT policy needs it). `cached_pages` is the size of everything the node caches (a tie-break of
    the Dynamo baseline).
    """

    node: NodeId
    own_gpu_pages: int = 0
    own_host_pages: int = 0
    cluster_prefix_pages: int = 0
    fetch_pages: int = 0
    own_disk_pages: int = 0
    fetch_sources: tuple[FetchRun, ...] | None = None
    running: tuple[RunningPrefill, ...] = ()
    queue: tuple[QueuedPrefill, ...] = ()
    unreported: tuple[QueuedPrefill, ...] = ()
    router_in_flight: tuple[QueuedPrefill, ...] = ()
    state_age_s: float | None = None
    model: PrefillNodeModel | None = field(default=None, compare=False)
    cached_pages: int = 0

    def __post_init__(self) -> None:
        where = f"prefill node {self.node}"
        _non_negative(
            where,
            own_gpu_pages=self.own_gpu_pages,
            own_host_pages=self.own_host_pages,
            own_disk_pages=self.own_disk_pages,
            cluster_prefix_pages=self.cluster_prefix_pages,
            fetch_pages=self.fetch_pages,
            cached_pages=self.cached_pages,
        )
        if self.state_age_s is not None and self.state_age_s < 0:
            raise ValueError(f"{where}: state_age_s must be >= 0 or None, got {self.state_age_s}")
        if self.own_pages > self.cluster_prefix_pages:
            raise ValueError(
                f"{where}: its own prefix of {self.own_pages} pages is longer than the cluster prefix of "
                f"{self.cluster_prefix_pages} pages; the cluster prefix includes the node's own pages"
            )
        if self.fetch_pages > self.cluster_prefix_pages - self.own_pages:
            raise ValueError(
                f"{where}: fetch_pages {self.fetch_pages} exceed the {self.cluster_prefix_pages - self.own_pages} "
                f"cluster-prefix pages beyond its own prefix of {self.own_pages} pages"
            )
        if self.fetch_sources is not None:
            listed = sum(run.count for run in self.fetch_sources)
            if listed != self.fetch_pages:
                raise ValueError(
                    f"{where}: fetch_sources list {listed} pages but fetch_pages is {self.fetch_pages}"
                )

    @property
    def own_pages(self) -> int:
        """Length of the leading run of the request's pages the node holds itself (GPU, host, disk)."""
        return self.own_gpu_pages + self.own_host_pages + self.own_disk_pages

    def check_pages(self, request: RouteRequest) -> None:
        """Raise ValueError if this view's prefix is longer than `request`'s prompt pages."""
        if self.cluster_prefix_pages > request.prompt_pages:
            raise ValueError(
                f"prefill node {self.node}: cluster prefix of {self.cluster_prefix_pages} pages is longer "
                f"than request {request.id}'s {request.prompt_pages} full prompt pages"
            )


@dataclass(frozen=True, slots=True)
class PrefixColumns:
    """The prefix fields of every view of a `PrefillViewSet`, one numpy int64 array each, in the set's node order:
    `gpu` (own_gpu_pages), `own` (own_pages), `cluster` (cluster_prefix_pages), `fetch` (fetch_pages)."""

    gpu: np.ndarray
    own: np.ndarray
    cluster: np.ndarray
    fetch: np.ndarray


class PrefillNodeState(NamedTuple):
    """A prefill node's queue state, as its view would carry it (the same objects), without its prefix fields."""

    running: tuple[RunningPrefill, ...]
    queue: tuple[QueuedPrefill, ...]
    unreported: tuple[QueuedPrefill, ...]
    router_in_flight: tuple[QueuedPrefill, ...]
    state_age_s: float | None
    model: PrefillNodeModel | None


@dataclass(frozen=True, slots=True)
class StateStamps:
    """What tells a policy whether the queue states of a `PrefillViewSet`'s nodes changed since an earlier
    decision, one entry per node in the set's order.

    `versions` (int64, one column per holder of a node's state) change with that state, and `holders` are
    parallel lists of those holders: while every holder of node i is the same object with the same version and
    `models[i]` is the same object, `state(i)` yields equal running, queue, unreported and in-flight parts.
    `holders` may be empty (`()`) where versions are unique across objects (the router's tracks draw them from
    one source): then equal versions and the same model alone mean equal parts.
    `ages` are the report ages in seconds (NaN: never reported), as `state(i).state_age_s` but not clamped at 0.
    """

    holders: tuple[Sequence[object], ...]
    versions: np.ndarray
    ages: np.ndarray
    models: list[object]


PrefillStateRow = tuple[
    tuple[RunningPrefill, ...], tuple[QueuedPrefill, ...], tuple[QueuedPrefill, ...], tuple[QueuedPrefill, ...],
    float | None, PrefillNodeModel | None,
]
"""`PrefillNodeState` as a plain tuple (`PrefillViewSet.states`)."""


class PrefillViewSet(Sequence[PrefillNodeView], abc.ABC):
    """The views of every candidate prefill node for one request, built only when read.

    As a sequence it yields the full `PrefillNodeView`s (so every policy accepts it); a policy that prices all
    nodes with array arithmetic reads `prefix_columns()` and `state(i)` instead, and builds the views of the
    few nodes it needs exactly (`self[i]`). Implementations must give, for every i, the same values through
    `self[i]`, `prefix_columns()` (row i) and `state(i)`; node ids are distinct.
    """

    @property
    @abc.abstractmethod
    def nodes(self) -> tuple[NodeId, ...]:
        """Node ids, in the set's order."""

    @abc.abstractmethod
    def view(self, i: int) -> PrefillNodeView:
        """The full view of the i-th node (the same object on every call)."""

    @abc.abstractmethod
    def prefix_columns(self) -> PrefixColumns:
        """The prefix fields of all views as arrays."""

    @abc.abstractmethod
    def state(self, i: int) -> PrefillNodeState:
        """The queue state of the i-th node."""

    def states(self) -> Sequence[PrefillStateRow]:
        """`tuple(self.state(i))` for every node, in order (implementations may build them faster)."""
        return [cast(PrefillStateRow, tuple(self.state(i))) for i in range(len(self))]

    def stamps(self) -> StateStamps | None:
        """Change stamps of every node's queue state (`StateStamps`), or None when the set keeps none (then a
        policy that reuses per-node results must compare `state(i)` of every node)."""
        return None

    def index_of(self, node: NodeId) -> int:
        return self.nodes.index(node)

    def view_of(self, node: NodeId) -> PrefillNodeView:
        return self.view(self.index_of(node))

    def __len__(self) -> int:
        return len(self.nodes)

    @overload
    def __getitem__(self, i: int) -> PrefillNodeView: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[PrefillNodeView]: ...

    def __getitem__(self, i: int | slice) -> PrefillNodeView | Sequence[PrefillNodeView]:
        if isinstance(i, slice):
            return [self.view(k) for k in range(len(self))[i]]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"view index {i} out of range for {n} prefill nodes")
        return self.view(i % n)

    def __iter__(self) -> Iterator[PrefillNodeView]:
        return (self.view(k) for k in range(len(self)))


class StaticViews(PrefillViewSet):
    """A `PrefillViewSet` over views already built (tests, and callers that build their views themselves)."""

    __slots__ = ("_views", "_ids", "_columns")

    def __init__(self, views: Sequence[PrefillNodeView]) -> None:
        self._views = tuple(views)
        self._ids = tuple(v.node for v in self._views)
        self._columns: PrefixColumns | None = None

    @property
    def nodes(self) -> tuple[NodeId, ...]:
        return self._ids

    def view(self, i: int) -> PrefillNodeView:
        return self._views[i]

    def prefix_columns(self) -> PrefixColumns:
        if self._columns is None:
            count = len(self._views)

            def column(field_of: Callable[[PrefillNodeView], int]) -> np.ndarray:
                return np.fromiter((field_of(v) for v in self._views), np.int64, count)

            self._columns = PrefixColumns(
                gpu=column(lambda v: v.own_gpu_pages),
                own=column(lambda v: v.own_pages),
                cluster=column(lambda v: v.cluster_prefix_pages),
                fetch=column(lambda v: v.fetch_pages),
            )
        return self._columns

    def state(self, i: int) -> PrefillNodeState:
        v = self._views[i]
        return PrefillNodeState(v.running, v.queue, v.unreported, v.router_in_flight, v.state_age_s, v.model)


@dataclass(frozen=True, slots=True)
class DecodeNodeView:
    """One decode node: its running requests and the KV tokens it can still take."""

    node: NodeId
    running_requests: int
    free_kv_tokens: int

    def __post_init__(self) -> None:
        if self.running_requests < 0 or self.free_kv_tokens < 0:  # (one view per decode node and binding)
            _non_negative(
                f"decode node {self.node}",
                running_requests=self.running_requests,
                free_kv_tokens=self.free_kv_tokens,
            )


def unique_nodes(views: Sequence[PrefillNodeView] | Sequence[DecodeNodeView], kind: str) -> None:
    """Raise ValueError if `views` is empty or names a node twice."""
    if not views:
        raise ValueError(f"no {kind} node to choose from")
    seen: set[str] = set()
    for view in views:
        if view.node in seen:
            raise ValueError(f"{kind} node {view.node} appears twice in the views")
        seen.add(view.node)
