"""The page-exact KV directory: one mask, one parent and one last use per (node, tier) for every page.

The simple form of `KvDirectory` (`directory.py`, which keeps runs of pages): the same events, queries and
answers, page by page. Kept as the oracle the run-based directory is tested against (hypothesis state machine
in `tests/router/test_directory_runs.py`), and for comparisons in `bench directory`.

The directory is a prefix tree of pages keyed by their chained `PageHash` (equal hashes mean equal whole
prefixes, so a page hash names a tree node and its whole path). Every page records its parent and one integer
bitmask of its holders, three bits per node index i: bit `3i` when node i holds it in GPU memory (L1),
`3i + 1` in host memory (L2), `3i + 2` in either. Every (node, tier) records the pages it holds with their
last-use time. A lookup makes one dictionary probe per prompt page and hands the stretches of equal masks to
`match_from_stretches`, which answers every node and tier at once (see `PrefixMatch`).

Invariants (checked by `tests/router/test_directory*.py` against a brute-force model):
- bit `3i + t` of `mask[page]` is set  <=>  `page` is in `held[t][i]` (node i holds it in tier t), and
  bit `3i + 2` is set  <=>  bit `3i` or bit `3i + 1` is;
- `page` has a parent entry  <=>  `page` has a mask entry  <=>  some node holds it in some tier;
- masks never carry the bit of a node index that is free (dropped nodes are cleared before reuse).

Tolerated events, all deterministic and counted in `DirectoryStats`:
- `KvStored` whose `parent` is not in the tree: its first page starts a new root (parent None);
- a page stored again under a different parent keeps the parent it was first stored with;
- `KvRemoved` of a page the node does not hold in that tier: no-op;
- `KvRemoved` / `KvCleared` / `touch` for a node the directory never saw: no-op (the node is not added).

Boundary: pure state over KV events; no clock (times come from events and callers), no I/O. Per-page
storage is a few dict entries (hash -> mask, hash -> parent, hash -> last use per holder); node indices
are small integers reused lowest-first after `drop_node`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from itertools import groupby, repeat
from operator import ne, or_

from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory import DirectoryStats
from evolving_infra.router.directory_reads import NodeSlots
from evolving_infra.router.prefix_match import PrefixMatch, match_from_stretches

__all__ = ["PageKvDirectory"]

_TIER_INDEX: dict[Tier, int] = {Tier.GPU: 0, Tier.HOST: 1}


class PageKvDirectory:
    """Pages held per node and tier, with last-use times; answers longest-prefix lookups.

    Node ids get a bit index on their first `KvStored` (or `add_node`); `drop_node` frees it.
    """

    __slots__ = ("_slots", "_parent", "_mask", "_held", "_tier_bits", "stats")

    def __init__(self) -> None:
        self._slots = NodeSlots()
        self._parent: dict[PageHash, PageHash | None] = {}
        self._mask: dict[PageHash, int] = {}
        # _held[tier][node index]: page -> last use time on that node in that tier.
        self._held: tuple[list[dict[PageHash, float]], list[dict[PageHash, float]]] = ([], [])
        self._tier_bits = [0, 0, 0]  # GPU, host and either bits of every index ever allocated
        self.stats = DirectoryStats()

    # ----------------------------------------------------------------------------------------- nodes
    def add_node(self, node: NodeId) -> int:
        """Register `node` (idempotent) and return its bit index."""
        slots = self._slots
        idx = slots.index.get(node)
        if idx is not None:
            return idx
        if slots.free:
            idx = heapq.heappop(slots.free)
            slots.ids[idx] = node
        else:
            idx = len(slots.ids)
            slots.ids.append(node)
            self._held[0].append({})
            self._held[1].append({})
            for t in range(3):
                self._tier_bits[t] |= 1 << (3 * idx + t)
        slots.index[node] = idx
        return idx

    def drop_node(self, node: NodeId) -> int:
        """Forget `node` (it died): remove it from every page in both tiers; returns pages dropped."""
        idx = self._slots.index.get(node)
        if idx is None:
            return 0
        dropped = self._clear_index(idx, 0) + self._clear_index(idx, 1)
        del self._slots.index[node]
        self._slots.ids[idx] = None
        heapq.heappush(self._slots.free, idx)
        return dropped

    def nodes(self) -> tuple[NodeId, ...]:
        """Known nodes, in bit-index order."""
        return tuple(n for n in self._slots.ids if n is not None)

    @property
    def page_count(self) -> int:
        """Distinct pages held by at least one node in at least one tier."""
        return len(self._parent)

    # ---------------------------------------------------------------------------------------- events
    def apply(self, event: KvEvent) -> None:
        """Apply one KV event."""
        if isinstance(event, KvStored):
            self.store(event.node, event.tier, event.parent, event.pages, event.time)
        elif isinstance(event, KvRemoved):
            self.remove(event.node, event.tier, event.pages)
        elif isinstance(event, KvCleared):
            self.clear(event.node, event.tier)
        else:
            raise TypeError(f"not a KV event: {event!r} (expected KvStored, KvRemoved or KvCleared)")

    def apply_all(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            self.apply(event)

    def store(
        self, node: NodeId, tier: Tier, parent: PageHash | None, pages: Sequence[PageHash], time: float
    ) -> None:
        """`node` holds the parent-linked chain `pages` in `tier`, last used at `time`."""
        t = _TIER_INDEX[tier]
        idx = self.add_node(node)
        bit = (1 << (3 * idx + t)) | (1 << (3 * idx + 2))
        masks = self._mask
        held = self._held[t][idx]
        parents = self._parent
        stats = self.stats
        stats.events += 1
        stats.pages_stored += len(pages)
        prev = parent
        if parent is not None and parent not in parents:
            stats.unknown_parents += 1
            prev = None
        # Page by page, as C-level maps: parent (first one kept), holder bit, last use.
        prevs = (prev, *pages[:-1])
        mismatches = sum(map(ne, map(parents.setdefault, pages, prevs), prevs))
        masks.update(zip(pages, map(or_, map(masks.get, pages, repeat(0)), repeat(bit))))
        held.update(zip(pages, repeat(time)))
        if mismatches:
            stats.parent_mismatches += mismatches

    def remove(self, node: NodeId, tier: Tier, pages: Iterable[PageHash]) -> int:
        """`node` no longer holds `pages` in `tier`; returns how many it did hold."""
        self.stats.events += 1
        idx = self._slots.index.get(node)
        if idx is None:
            self.stats.unknown_node_events += 1
            return 0
        t = _TIER_INDEX[tier]
        held = self._held[t][idx]
        removed = unheld = 0
        masks, parents = self._mask, self._parent
        base = 3 * idx
        bit, other, either = 1 << (base + t), 1 << (base + 1 - t), 1 << (base + 2)
        for page in pages:  # `_unset` inlined
            if held.pop(page, None) is None:
                unheld += 1
                continue
            removed += 1
            mask = masks[page] & ~bit
            if not mask & other:
                mask &= ~either
            if mask:
                masks[page] = mask
            else:
                del masks[page]
                del parents[page]
        self.stats.pages_removed += removed
        self.stats.removed_unheld += unheld
        return removed

    def clear(self, node: NodeId, tier: Tier | None) -> int:
        """`node` dropped everything in `tier` (both tiers when None); returns pages dropped."""
        self.stats.events += 1
        idx = self._slots.index.get(node)
        if idx is None:
            self.stats.unknown_node_events += 1
            return 0
        tiers = (0, 1) if tier is None else (_TIER_INDEX[tier],)
        return sum(self._clear_index(idx, t) for t in tiers)

    def touch(self, node: NodeId, tier: Tier, pages: Iterable[PageHash], time: float) -> int:
        """Set the last use of the `pages` that `node` holds in `tier` to `time`; returns pages updated."""
        idx = self._slots.index.get(node)
        if idx is None:
            return 0
        held = self._held[_TIER_INDEX[tier]][idx]
        updated = 0
        for page in pages:
            if page in held:
                held[page] = time
                updated += 1
        return updated

    def _unset(self, page: PageHash, idx: int, t: int) -> None:
        masks = self._mask
        base = 3 * idx
        mask = masks[page] & ~(1 << (base + t))
        if not mask >> (base + 1 - t) & 1:
            mask &= ~(1 << (base + 2))
        if mask:
            masks[page] = mask
        else:
            del masks[page]
            del self._parent[page]

    def _clear_index(self, idx: int, t: int) -> int:
        held = self._held[t][idx]
        for page in held:
            self._unset(page, idx, t)
        dropped = len(held)
        self.stats.pages_removed += dropped
        held.clear()
        return dropped

    # --------------------------------------------------------------------------------------- queries
    def parent(self, page: PageHash) -> PageHash | None:
        """The parent recorded for `page` (None for a root); KeyError if no node holds `page`."""
        try:
            return self._parent[page]
        except KeyError:
            raise KeyError(f"page {page:#018x} is not in the directory") from None

    def __contains__(self, page: object) -> bool:
        return page in self._parent

    def holders(self, page: PageHash, tier: Tier) -> frozenset[NodeId]:
        """Nodes that hold `page` in `tier`."""
        t = _TIER_INDEX[tier]
        return frozenset(node for _, node in self._bits_of(self._mask.get(page, 0) & self._tier_bits[t]))

    def last_used(self, page: PageHash, node: NodeId, tier: Tier) -> float | None:
        """When `node` last used `page` in `tier`, or None if it does not hold it there."""
        idx = self._slots.index.get(node)
        if idx is None:
            return None
        return self._held[_TIER_INDEX[tier]][idx].get(page)

    def pages_on(self, node: NodeId, tier: Tier) -> dict[PageHash, float]:
        """A copy of the pages `node` holds in `tier`, with their last-use times."""
        idx = self._slots.index.get(node)
        return {} if idx is None else dict(self._held[_TIER_INDEX[tier]][idx])

    def held_count(self, node: NodeId, tier: Tier) -> int:
        idx = self._slots.index.get(node)
        return 0 if idx is None else len(self._held[_TIER_INDEX[tier]][idx])

    def lookup(self, pages: Sequence[PageHash]) -> PrefixMatch:
        """Longest cached prefixes of a prompt given as its page hashes (see `PrefixMatch`)."""
        pages = pages if isinstance(pages, (list, tuple)) else list(pages)
        masks = list(map(self._mask.get, pages, repeat(0)))
        end = _first(masks, 0)
        stretches: list[tuple[int, int]] = []
        lo = 0
        for mask, same in groupby(masks[:end]):
            stretches.append((lo, mask))
            lo += len(list(same))
        return match_from_stretches(
            len(pages),
            stretches,
            end,
            {node: 3 * i for node, i in self._slots.index.items()},
            tuple(self._slots.ids),
            self._tier_bits[1],
            self._tier_bits[2],
        )

    def _bits_of(self, mask: int) -> Iterable[tuple[int, NodeId]]:
        """(bit index, node) of every set bit of `mask` that belongs to a known node."""
        ids = self._slots.ids
        while mask > 0:
            low = mask & -mask
            bit_index = low.bit_length() - 1
            node = ids[bit_index // 3] if bit_index // 3 < len(ids) else None
            if node is not None:
                yield bit_index, node
            mask ^= low


def _first(values: Sequence[object], sentinel: object) -> int:
    """Index of the first `sentinel` in `values`, or `len(values)` if there is none."""
    try:
        return values.index(sentinel)
    except ValueError:
        return len(values)
