"""Host-memory (L2) eviction order behind a small policy interface.

Two built-in policies (more are plugins: a module that declares a `HostEvictionPolicy` in `EVICTION`, loaded with the
`plugins` setting of the simulator, the router and the node agents; engines ask a plugin's `key` page by page):
- `BranchCountEviction` (paper section 5.3, algorithm E.2 `EvictHost`): ascending key
  `(count > 0, last access)`: pages no active branch references go first, least recently used first,
  and a page with a positive count goes only when no unpinned zero-count page remains.
- `LruEviction` (HiCache baseline, `../shared/baselines.md`): ascending last access, counts ignored.

Ties (both): among pages of equal key the one deepest in its chain goes first (`HostPage.depth`, the page's
position in its prefix as the node knows it), then the lower page hash, so a chain is cut from its end and keeps a
whole prefix, as a radix-tree LRU evicts leaves before their parents (E.2 fixes the key, not the ties). The
engines' eviction index keeps exactly this order (`node_agent/engine/evictindex.py`; checked against `victims`).

Invariant (both): a pinned page is never a victim.

Boundary: pure ordering over page snapshots the caller supplies; the caller (engine core) owns the pages,
their pinning and the counts pushed to it by the router.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from evolving_infra.core.pages import PageHash
from evolving_infra.core.plugins import PolicyKind, PolicyNeed, PolicyRegistry, PolicySpec


class EvictionPolicyName(enum.Enum):
    BRANCH_COUNT = "branch-count"
    LRU = "lru"


@dataclass(frozen=True, slots=True)
class HostPage:
    """Snapshot of one page in a node's host memory, as an eviction policy sees it."""

    page: PageHash
    count: int
    last_access: float
    pinned: bool = False
    depth: int = 0  # position in its chain (0: a root); of two pages with equal keys the deeper goes first


class HostEvictionPolicy(Protocol):
    @property
    def name(self) -> EvictionPolicyName | str:
        """The declared name (a built-in's enum member, or a plugin's string)."""
        ...

    def key(self, page: HostPage) -> tuple[float, ...]:
        """Sort key: pages with smaller keys are evicted first."""
        ...

    def victims(self, pages: Iterable[HostPage], n: int) -> list[PageHash]:
        """Up to `n` unpinned pages, in eviction order."""
        ...


class _KeyedPolicy:
    name: EvictionPolicyName | str

    def key(self, page: HostPage) -> tuple[float, ...]:  # pragma: no cover - overridden
        raise NotImplementedError

    def victims(self, pages: Iterable[HostPage], n: int) -> list[PageHash]:
        if n <= 0:
            return []
        candidates = (p for p in pages if not p.pinned)
        # Deepest first, then the page hash, among equal keys: the order is total and deterministic.
        chosen = heapq.nsmallest(n, candidates, key=lambda p: (*self.key(p), -p.depth, p.page))
        return [p.page for p in chosen]


class BranchCountEviction(_KeyedPolicy):
    """Zero-count pages first, LRU within each group (paper eq. in section 5.3, algorithm E.2)."""

    name = EvictionPolicyName.BRANCH_COUNT

    def key(self, page: HostPage) -> tuple[float, ...]:
        return (1.0 if page.count > 0 else 0.0, page.last_access)


class LruEviction(_KeyedPolicy):
    """Least recently used first, counts ignored (HiCache's host eviction)."""

    name = EvictionPolicyName.LRU

    def key(self, page: HostPage) -> tuple[float, ...]:
        return (page.last_access,)


@dataclass(frozen=True)
class _NoSettings:
    """An eviction order without settings."""


EVICTION: PolicyRegistry[HostEvictionPolicy] = PolicyRegistry(PolicyKind.EVICTION, [
    PolicySpec(PolicyKind.EVICTION, EvictionPolicyName.BRANCH_COUNT.value,
               "ours (E.2): unreferenced pages first (count = 0), then least recently used", _NoSettings,
               lambda s, rng: BranchCountEviction(), frozenset({PolicyNeed.BRANCH_COUNTS}), __name__),
    PolicySpec(PolicyKind.EVICTION, EvictionPolicyName.LRU.value, "least recently used (HiCache)", _NoSettings,
               lambda s, rng: LruEviction(), frozenset(), __name__),
])  # fmt: skip
"""The host eviction orders, declared like every other policy. Engines keep a coarse index for the two
built-ins (their keys depend only on (count > 0, last access)) and ask any other policy's `key` page by page."""


def eviction_policy(name: EvictionPolicyName | str, where: str = "eviction") -> HostEvictionPolicy:
    """The policy declared under `name` (load plugin modules first). Raises PolicyError naming `where` and the
    declared names when `name` is unknown."""
    spec = EVICTION.get(name, where)
    return spec.build(None)


def uses_branch_counts(name: EvictionPolicyName | str) -> bool:
    """Whether the eviction order declared under `name` reads branch counts (then the router pushes them)."""
    return PolicyNeed.BRANCH_COUNTS in EVICTION.get(name).needs
