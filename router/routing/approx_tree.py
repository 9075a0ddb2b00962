"""An approximate prefix tree of what a gateway sent to each worker, over page hashes, LRU-evicted by leaves.

The SGLang gateway keeps one radix tree of request *characters* with the workers ("tenants") each edge
was sent to; it never hears what workers actually cache. We keep the same information per worker over
chained page hashes (equal hash = equal whole prefix), so a prefix match counts whole pages, not
characters: a request's trailing partial page never matches, and sizes are converted to characters with a
fixed characters-per-token ratio for the `max_tree_size` bound.

Invariant: for every worker, every recorded page's parent page is recorded too (eviction removes leaves
only), so `match` walks a contiguous chain from the first page.

Boundary: pure; time passed in.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId


@dataclass(slots=True)
class _Entry:
    parent: PageHash | None
    children: int
    last_access: float
    seq: int


class ApproxPrefixTree:
    def __init__(self) -> None:
        self._workers: dict[NodeId, dict[PageHash, _Entry]] = {}
        self._seq = 0

    def insert(self, worker: NodeId, pages: Sequence[PageHash], now: float) -> None:
        """Record that the chain `pages` was sent to `worker` at `now` (touching every page of it)."""
        self._seq += 1
        tree = self._workers.setdefault(worker, {})
        parent: PageHash | None = None
        for page in pages:
            entry = tree.get(page)
            if entry is None:
                tree[page] = _Entry(parent, 0, now, self._seq)
                if parent is not None:
                    tree[parent].children += 1
            else:
                entry.last_access = now
                entry.seq = self._seq
            parent = page

    def match(self, worker: NodeId, pages: Sequence[PageHash]) -> int:
        """How many leading pages of `pages` were sent to `worker`."""
        tree = self._workers.get(worker, {})
        n = 0
        for page in pages:
            if page not in tree:
                break
            n += 1
        return n

    def recency(self, worker: NodeId, page: PageHash) -> tuple[float, int]:
        """(last access, insertion order) of `page` on `worker`; larger is more recent."""
        entry = self._workers.get(worker, {}).get(page)
        return (entry.last_access, entry.seq) if entry is not None else (float("-inf"), -1)

    def size_pages(self, worker: NodeId) -> int:
        return len(self._workers.get(worker, {}))

    def workers(self) -> Iterable[NodeId]:
        return tuple(self._workers)

    def evict_to(self, worker: NodeId, max_pages: int) -> int:
        """Remove least recently used leaves of `worker` until it holds at most `max_pages`; returns how many."""
        tree = self._workers.get(worker)
        if tree is None or len(tree) <= max_pages:
            return 0
        heap = [(e.last_access, e.seq, page) for page, e in tree.items() if e.children == 0]
        heapq.heapify(heap)
        removed = 0
        while len(tree) > max_pages and heap:
            _, _, page = heapq.heappop(heap)
            entry = tree.pop(page)
            removed += 1
            if entry.parent is not None:
                parent = tree[entry.parent]
                parent.children -= 1
                if parent.children == 0:
                    heapq.heappush(heap, (parent.last_access, parent.seq, entry.parent))
        return removed
