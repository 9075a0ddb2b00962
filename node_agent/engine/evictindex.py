"""The eviction order of one tier's cached pages: ascending (policy key, tie-break), kept as buckets of pages
that share a key.

Tie-break among pages of one key (`rank`): the deepest page first, then the page hash. A page's depth is
its position in its chain (0 for a first page; set when the node stores it, one more than its parent's when
the node holds the parent, else 0, and kept while either tier holds it). So among pages the policy cannot
tell apart (e.g. a released prefix, all last accessed at one time) a chain is cut from its end and keeps a
whole prefix, as a radix-tree cache evicts leaves before their parents; the paper's E.2 fixes only the key
`(count > 0, last access)`, not the order within it. (The page hash alone, used before, scattered evictions
across chains.) The rank is one integer, hash minus depth * 2^64 (hashes are below 2^64), so the hash is the
rank's low 64 bits (`rank & _MASK`) and ranks sort without a key function.

Many cached pages share a key: a request's release unpins its whole prefix at one time, so those pages get
one last access (and, under branch counts, one of two count groups). The order keeps one bucket per distinct
key and a heap of the keys. A bucket holds its entries in two parts: `fresh`, a set of pages entered since
the bucket was last ordered (entering a page costs one set insertion, a run of pages with one key one C-level
set update), and `order`, the ranks of the ordered entries, descending (the smallest last), with `ranked`
(page -> rank) indexing them. Choosing k victims walks the buckets in key order; a bucket with fresh entries
is ordered first: its live fresh entries are ranked and merged into `order` (one sort of two sorted runs,
linear), so a bucket is never sorted whole again when pages join it. Its smallest entries are taken at once
(C-level checks) when they are all live and nothing is excluded, else one by one.

Keys: the built-in policies' keys depend only on (count > 0, last access), so they are computed here from
those two (`coarse_key`, equal to `policy.key`); any other policy is asked page by page with a `HostPage`.

Entries are lazy: a page that was pinned, evicted or re-keyed keeps its old entry, which `victims` (or the
ordering of a bucket's fresh entries) drops when it meets it (the page is no longer cached, or its current key
differs); the entries are rebuilt from the cached pages when stale ones outnumber live ones several times.
A page whose branch count went from 0 to positive (its key grew from (0, t) to (1, t)) is not re-entered by
`recount`: its entry under (0, t) is moved to (1, t) when met, before (1, t) is reached. Every other key
change (touches, counts going to 0, pages becoming cached) is entered by the tier when it happens.

Invariant (checked by `TierPool.check` through `holds`): every cached page has an entry (fresh, or ordered
under its current rank) in the bucket of its current key, or, for a counted page under branch counts, in
the bucket of (0, its last access). Then `victims` yields exactly the cached pages, in ascending (key, rank)
order, each once: buckets come off the heap in key order, a key is in the heap exactly while it has a bucket,
an entry is moved only to a later key, and a page's entries under one key are merged into one.

Boundary: ordering only; the tier owns the page tables this reads (cached set, last access, counts) and tells
the order when a cached page's key may have changed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping
from itertools import compress, filterfalse, groupby, repeat
from operator import and_, eq, lshift, not_, sub

from evolving_infra.core.eviction import BranchCountEviction, HostEvictionPolicy, HostPage, LruEviction
from evolving_infra.core.pages import PageHash

Key = tuple[float, ...]

_MASK = (1 << 64) - 1  # a rank's low 64 bits are its page hash


def _branch_count_key(counted: bool, last_access: float) -> Key:
    return (1.0 if counted else 0.0, last_access)


def _lru_key(counted: bool, last_access: float) -> Key:
    return (last_access,)


def coarse_key(policy: HostEvictionPolicy) -> Callable[[bool, float], Key] | None:
    """For the built-in policies, whose key depends only on (count > 0, last access): that key as a function
    of those two, equal to `policy.key`; None for any other policy."""
    if type(policy) is BranchCountEviction:
        return _branch_count_key
    if type(policy) is LruEviction:
        return _lru_key
    return None


def _ranks(pages: Iterable[PageHash], depth: Mapping[PageHash, int]) -> map[int]:
    """The ranks (hash - depth * 2^64) of `pages` (each in `depth`), by C-level passes."""
    pages = pages if isinstance(pages, list) else list(pages)
    return map(sub, pages, map(lshift, map(depth.__getitem__, pages), repeat(64)))


def _min_rank(pages: Iterable[PageHash], depth: Mapping[PageHash, int]) -> int | float:
    """The smallest rank of `pages` (each in `depth`); inf if none."""
    return min(_ranks(pages, depth), default=math.inf)


class _Bucket:
    __slots__ = ("fresh", "order", "ranked")

    def __init__(self) -> None:
        self.fresh: set[PageHash] = set()  # entries not ordered yet (any may be stale)
        self.order: list[int] = []  # ranks of the ordered entries, descending (any may be stale)
        self.ranked: dict[PageHash, int] = {}  # page -> its rank in `order`: exactly the pages of `order`


class EvictionOrder:
    """Buckets of cached pages by eviction key (see the module docstring). `cached`, `access` and `counts`
    are the tier's live tables (counts: positive counts only)."""

    def __init__(
        self,
        policy: HostEvictionPolicy,
        cached: set[PageHash],
        access: dict[PageHash, float],
        counts: dict[PageHash, int],
        depth: dict[PageHash, int],
    ) -> None:
        self.policy = policy
        self.coarse = coarse_key(policy)
        self.keyed_by_count = self.coarse is not _lru_key  # whether a count change can move a page
        self._lazy_up = self.coarse is _branch_count_key  # counts going 0 -> positive are moved when met
        self._cached, self._access, self._counts, self._depth = cached, access, counts, depth
        self._buckets: dict[Key, _Bucket] = {}
        self._keys: list[Key] = []  # a heap; a key is in it exactly while it has a bucket
        self._size = 0  # entries in all buckets (fresh and ordered), stale ones included
        self._valid = self._validity()

    # --- keys ----------------------------------------------------------------------------------------
    def key(self, page: PageHash) -> Key:
        """The policy's key of resident `page` now."""
        if self.coarse is not None:
            return self.coarse(page in self._counts, self._access[page])
        return self.policy.key(HostPage(page, self._counts.get(page, 0), self._access[page]))

    def rank(self, page: PageHash) -> int:
        """The tie-break of resident `page` among pages of one key, ascending: deeper pages first (a page
        before its parent), then the page hash; one integer (hash minus depth * 2^64, hashes being below 2^64)."""
        return page - (self._depth[page] << 64)

    def _validity(self) -> Callable[[PageHash, Key], bool]:
        """`valid(page, key)`: whether an entry is live (the page is cached and `key` is its key now)."""
        cached, access, counts = self._cached, self._access, self._counts
        if self.coarse is _branch_count_key:
            return lambda page, key: page in cached and access[page] == key[1] and (page in counts) == (key[0] > 0)
        if self.coarse is _lru_key:
            return lambda page, key: page in cached and access[page] == key[0]
        return lambda page, key: page in cached and self.key(page) == key

    def _all_valid(self, pages: list[PageHash], key: Key) -> bool:
        """Whether every entry of `pages` under `key` is live (C-level checks; False for other policies)."""
        coarse, access, counts = self.coarse, self._access, self._counts
        if coarse is None or not self._cached.issuperset(pages):
            return False
        if not all(map(eq, map(access.__getitem__, pages), repeat(key[-1]))):
            return False
        if coarse is _lru_key:
            return True
        return all(map(counts.__contains__, pages)) if key[0] > 0 else counts.keys().isdisjoint(pages)

    def _moves_up(self, page: PageHash, key: Key) -> bool:
        """Whether the (not live) entry of `page` under `key` is a lazy 0 -> positive count flip: the page is
        cached, last accessed at the key's time and counted now, the key uncounted."""
        return (
            self._lazy_up
            and key[0] == 0.0
            and page in self._cached
            and page in self._counts
            and self._access[page] == key[1]
        )

    # --- entering pages ------------------------------------------------------------------------------
    def _bucket(self, key: Key) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
            heapq.heappush(self._keys, key)
        return bucket

    def enter(self, page: PageHash) -> None:
        """(Re)enter cached `page` under its current key."""
        fresh = self._bucket(self.key(page)).fresh
        if page not in fresh:  # (an ordered entry of `page` here is merged with this one when ordering)
            fresh.add(page)
            self._size += 1
            if self._size > self._limit():
                self._rebuild()

    def _add_all(self, key: Key, pages: Iterable[PageHash]) -> None:
        fresh = self._bucket(key).fresh
        before = len(fresh)
        fresh.update(pages)
        self._size += len(fresh) - before

    def enter_all(self, pages: set[PageHash], now: float) -> None:
        """Enter cached `pages`, every one last accessed at `now`, under their keys."""
        coarse = self.coarse
        if coarse is None:
            for page in pages:
                self.enter(page)
            return
        if not pages:
            return
        if not self.keyed_by_count:
            self._add_all(coarse(False, now), pages)
        else:
            counts = self._counts.keys()
            if counts >= pages:  # all counted (the common case: one pass, no new set)
                self._add_all(coarse(True, now), pages)
            elif counts.isdisjoint(pages):
                self._add_all(coarse(False, now), pages)
            else:
                counted = counts & pages
                self._add_all(coarse(True, now), counted)
                self._add_all(coarse(False, now), pages - counted)
        self._maybe_rebuild()

    def enter_each(self, pages: Iterable[PageHash]) -> None:
        """(Re)enter cached `pages` under their current keys (any last accesses): grouped by key, so each
        group is one set update."""
        coarse = self.coarse
        if coarse is None:
            for page in pages:
                self.enter(page)
            return
        pages = pages if isinstance(pages, (set, frozenset)) else set(pages)
        if not self.keyed_by_count:
            self._enter_group(False, pages)
        else:
            counts = self._counts.keys()
            if counts >= pages:
                self._enter_group(True, pages)
            elif counts.isdisjoint(pages):
                self._enter_group(False, pages)
            else:
                counted = counts & pages
                self._enter_group(True, counted)
                self._enter_group(False, pages - counted)
        self._maybe_rebuild()

    def _enter_group(self, counted: bool, pages: set[PageHash] | frozenset[PageHash]) -> None:
        """Enter `pages`, all of one count group, under their keys (grouped by last access)."""
        if not pages:
            return
        coarse = self.coarse
        assert coarse is not None
        access = self._access.__getitem__
        times = set(map(access, pages))
        if len(times) == 1:  # one key (e.g. a released prefix): no sort
            self._add_all(coarse(counted, times.pop()), pages)
            return
        for when, group in groupby(sorted(pages, key=access), key=access):
            self._add_all(coarse(counted, when), group)

    def recount(self, pages: Iterable[PageHash], flipped: Iterable[PageHash]) -> None:
        """The counts of `pages` changed, those of `flipped` (a subset) between 0 and positive: re-enter
        the cached ones whose key may have moved (coarse keys see only the sign of a count). Under branch
        counts a page whose count became positive keeps its entry (its key grew; `victims` moves it)."""
        if not self.keyed_by_count:
            return
        if self.coarse is None:
            moved = self._cached.intersection(pages)
            if moved:
                self.enter_each(moved)
            return
        moved = self._cached.intersection(flipped)
        if moved:  # (coarse keys that see counts: branch counts)
            down = moved.difference(self._counts)
            if down:
                self._enter_group(False, down)
                self._maybe_rebuild()

    def _limit(self) -> int:
        return 8 * len(self._cached) + 1024

    def _maybe_rebuild(self) -> None:
        if self._size > self._limit():
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop every stale entry: re-enter the cached pages from scratch."""
        self._buckets = {}
        self._keys = []
        self._size = 0
        self.enter_each(self._cached)

    def floor(self, pages: set[PageHash], now: float, depths: Mapping[PageHash, int]) -> tuple[Key, float] | None:
        """The smallest (key, `rank`) a page of `pages` (non-empty) has once accessed at `now`, the depths of
        pages without one taken from `depths`; None for a policy without coarse keys."""
        coarse = self.coarse
        if coarse is None:
            return None
        counted = False
        if self.keyed_by_count:
            free = pages.difference(self._counts)
            if free:
                pages = free
            else:
                counted = True
        if depths:
            new = pages.intersection(depths)
            return coarse(counted, now), min(_min_rank(pages - new, self._depth), _min_rank(new, depths))
        return coarse(counted, now), _min_rank(pages, self._depth)

    # --- choosing victims ----------------------------------------------------------------------------
    def _order_fresh(self, bucket: _Bucket, key: Key) -> None:
        """Rank the live fresh entries of `bucket` (of `key`) and merge them into its order; drop the stale
        ones, move lazy count flips to their key. For coarse keys the checks are C-level passes; otherwise
        only entries of pages neither tier holds (no depth) are dropped here, the rest checked when met."""
        fresh = bucket.fresh
        bucket.fresh = set()
        order, ranked, depth = bucket.order, bucket.ranked, self._depth
        before = len(order) + len(fresh)
        if self.coarse is not None:
            live = list(filter(self._cached.__contains__, fresh))
            live = list(compress(live, map(eq, map(self._access.__getitem__, live), repeat(key[-1]))))
            if self.keyed_by_count:
                counted = list(map(self._counts.__contains__, live))
                if key[0] > 0:
                    live = list(compress(live, counted))
                elif any(counted):
                    up = list(compress(live, counted))
                    live = list(compress(live, map(not_, counted)))
                    if self._lazy_up:
                        self._add_all(_branch_count_key(True, key[1]), up)
        else:
            live = list(filter(depth.__contains__, fresh))
        ranks = list(_ranks(live, depth))
        if ranked and not ranked.keys().isdisjoint(live):
            new: list[int] = []
            for page, rank in zip(live, ranks):
                old = ranked.get(page)
                if old != rank:
                    if old is not None:  # the page left and came back with another depth: drop its old entry
                        order.remove(old)
                    new.append(rank)
            ranks = new
            ranked.update(zip(map(and_, ranks, repeat(_MASK)), ranks))
        else:
            ranked.update(zip(live, ranks))
        if ranks:
            order += ranks
            order.sort(reverse=True)  # two descending runs (or one): a merge
        self._size += len(order) - before

    def victims(self, n: int, exclude: Container[PageHash]) -> list[PageHash]:
        """The first `n` cached pages not in `exclude`, in ascending (key, rank) order, taken out of the
        order (the caller evicts them); stale entries met on the way are dropped."""
        out: list[PageHash] = []
        keep: list[Key] = []
        heap, buckets, valid = self._keys, self._buckets, self._valid
        taken = 0
        while heap and len(out) < n:
            key = heapq.heappop(heap)
            bucket = buckets[key]
            if bucket.fresh:
                self._order_fresh(bucket, key)
            order, ranked = bucket.order, bucket.ranked
            k = min(n - len(out), len(order))
            if k and not exclude:  # the k smallest entries at once, when all are live
                chunk = order[-k:]
                pages = list(map(and_, chunk, repeat(_MASK)))
                if self._all_valid(pages, key):
                    del order[-k:]
                    deque(map(ranked.__delitem__, pages), maxlen=0)
                    pages.reverse()
                    out += pages
                    taken += k
            held: list[int] = []
            while order and len(out) < n:
                rank = order.pop()
                page = PageHash(rank & _MASK)
                if not valid(page, key):
                    del ranked[page]
                    taken += 1
                    if self._moves_up(page, key):
                        self._add_all(_branch_count_key(True, key[1]), (page,))
                elif page in exclude:
                    held.append(rank)
                else:
                    del ranked[page]
                    taken += 1
                    out.append(page)
            if held:
                order.extend(reversed(held))
            if order or bucket.fresh:
                keep.append(key)
            else:
                del buckets[key]
        for key in keep:
            heapq.heappush(heap, key)
        self._size -= taken
        return out

    def holds(self, page: PageHash) -> bool:
        """Whether cached `page` has an entry the invariant accepts (for invariant checks)."""
        key = self.key(page)
        if self._has(key, page):
            return True
        return self._lazy_up and key[0] > 0 and self._has(_branch_count_key(False, key[1]), page)

    def _has(self, key: Key, page: PageHash) -> bool:
        bucket = self._buckets.get(key)
        return bucket is not None and (page in bucket.fresh or bucket.ranked.get(page) == self.rank(page))
