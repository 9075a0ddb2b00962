"""The eviction order of one tier's cached pages: ascending (policy key, tie-break), kept as buckets of pages
that share a key.

Tie-break among pages of one key (`rank`): the deepest page first, then the page hash. A page's depth is
its position in its chain (0 for a first page; set when the node stores it, one more than its parent's when
the node holds the parent, else 0, and kept while either tier holds it). So among pages the policy cannot
tell apart (e.g. a released prefix, all last accessed at one time) a chain is cut from its end and keeps a
whole prefix, as a radix-tree cache evicts leaves before their parents; the paper's E.2 fixes only the key
`(count > 0, last access)`, not the order within it. (The page hash alone, used before, scattered evictions
across chains.)

Many cached pages share a key: a request's release unpins its whole prefix at one time, so those pages get
one last access (and, under branch counts, one of two count groups). The order keeps one bucket (a set of
pages) per distinct key and a heap of the keys. Entering a page costs one set insertion, and a whole run of
pages with one key is entered by one C-level set update; choosing k victims walks the buckets in key order,
each bucket sorted by tie-break once (and again only after pages join it), its smallest entries taken
at once (C-level checks) when they are all live and nothing is excluded.

Keys: the built-in policies' keys depend only on (count > 0, last access), so they are computed here from
those two (`coarse_key`, equal to `policy.key`); any other policy is asked page by page with a `HostPage`.

Entries are lazy: a page that was pinned, evicted or re-keyed keeps its old entry, which `victims` rejects
(the page is no longer cached, or its current key differs) and drops when it meets it; the entries are
rebuilt from the cached pages when stale ones outnumber live ones several times.

Invariant (checked by `TierPool.check` through `holds`): every cached page is a member of the bucket of its
current key. Then `victims` yields exactly the cached pages, in ascending (key, rank) order, each once:
buckets come off the heap in key order, and a key is in the heap exactly while it has a bucket.

Boundary: ordering only; the tier owns the page tables this reads (cached set, last access, counts) and tells
the order when a cached page's key may have changed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Container, Iterable, Mapping
from itertools import compress, filterfalse, groupby, repeat
from operator import eq, lshift, sub

from evolving_infra.core.eviction import BranchCountEviction, HostEvictionPolicy, HostPage, LruEviction
from evolving_infra.core.pages import PageHash

Key = tuple[float, ...]


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


def _min_rank(pages: Iterable[PageHash], depth: Mapping[PageHash, int]) -> int | float:
    """The smallest rank (hash - depth * 2^64) of `pages` (each in `depth`), by C-level passes; inf if none."""
    pages = list(pages)
    return min(map(sub, pages, map(lshift, map(depth.__getitem__, pages), repeat(64))), default=math.inf)


class _Bucket:
    __slots__ = ("members", "order")

    def __init__(self, members: set[PageHash] | None = None) -> None:
        self.members: set[PageHash] = set() if members is None else members
        self.order: list[PageHash] | None = None  # the members in descending `EvictionOrder.rank`, or None


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
        self._cached, self._access, self._counts, self._depth = cached, access, counts, depth
        self._buckets: dict[Key, _Bucket] = {}
        self._keys: list[Key] = []  # a heap; a key is in it exactly while it has a bucket
        self._size = 0  # entries in all buckets, stale ones included
        self._valid = self._validity()

    # --- keys ----------------------------------------------------------------------------------------
    def key(self, page: PageHash) -> Key:
        """The policy's key of resident `page` now."""
        if self.coarse is not None:
            return self.coarse(page in self._counts, self._access[page])
        return self.policy.key(HostPage(page, self._counts.get(page, 0), self._access[page]))

    def _sorted(self, members: set[PageHash], key: Key) -> list[PageHash]:
        """The live entries of the bucket `members` of `key` in descending `rank` (smallest last): by page hash
        descending, then a stable sort by depth (small integers: the sort's fast comparisons); the first sort
        only when two entries share a depth (else the depths alone give the order). For coarse keys
        the stale entries are dropped from `members` first, by C-level passes (what `victims` would do one by
        one); otherwise entries of pages neither tier holds (no depth)."""
        if self.coarse is not None:
            live = list(filter(self._cached.__contains__, members))
            live = list(compress(live, map(eq, map(self._access.__getitem__, live), repeat(key[-1]))))
            if self.keyed_by_count:
                test = self._counts.__contains__
                live = list(filter(test, live) if key[0] > 0 else filterfalse(test, live))
        else:
            live = list(filter(self._depth.__contains__, members))
        if len(live) != len(members):
            self._size -= len(members) - len(live)
            members.intersection_update(live)
        depth = self._depth.__getitem__
        if len(set(map(depth, live))) < len(live):  # depths tie (rare: most buckets hold one chain's pages)
            live.sort(reverse=True)
        live.sort(key=depth)
        return live

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

    # --- entering pages ------------------------------------------------------------------------------
    def _bucket(self, key: Key) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
            heapq.heappush(self._keys, key)
        return bucket

    def enter(self, page: PageHash) -> None:
        """(Re)enter cached `page` under its current key."""
        bucket = self._bucket(self.key(page))
        bucket.order = None  # (also when `page` has an entry here: a stale one may have another depth)
        if page not in bucket.members:
            bucket.members.add(page)
            self._size += 1
            if self._size > self._limit():
                self._rebuild()

    def _add_all(self, key: Key, pages: Iterable[PageHash]) -> None:
        bucket = self._bucket(key)
        members = bucket.members
        pages = pages if isinstance(pages, (set, list)) else list(pages)
        before = len(members)
        members.update(pages)
        if pages:
            bucket.order = None  # new entries, or entries again (a stale one may have had another depth)
            self._size += len(members) - before

    def enter_all(self, pages: set[PageHash], now: float) -> None:
        """Enter cached `pages`, every one last accessed at `now`, under their keys."""
        coarse = self.coarse
        if coarse is None:
            for page in pages:
                self.enter(page)
            return
        if self.keyed_by_count:
            counted = self._counts.keys() & pages
            if counted:
                self._add_all(coarse(True, now), counted)
                pages = pages - counted
        if pages:
            self._add_all(coarse(False, now), pages)
        self._maybe_rebuild()

    def enter_each(self, pages: Iterable[PageHash]) -> None:
        """(Re)enter cached `pages` under their current keys (any last accesses): grouped by key, so each
        group is one set update."""
        coarse = self.coarse
        if coarse is None:
            for page in pages:
                self.enter(page)
            return
        pages = set(pages)
        access = self._access.__getitem__
        parts: list[tuple[bool, set[PageHash]]] = [(False, pages)]
        if self.keyed_by_count:
            counted = self._counts.keys() & pages
            parts = [(True, counted), (False, pages - counted)]
        for flag, part in parts:
            if not part:
                continue
            times = set(map(access, part))
            if len(times) == 1:  # one key (e.g. a released prefix): no sort
                self._add_all(coarse(flag, times.pop()), part)
                continue
            for when, group in groupby(sorted(part, key=access), key=access):
                self._add_all(coarse(flag, when), group)
        self._maybe_rebuild()

    def recount(self, pages: Iterable[PageHash], flipped: Iterable[PageHash]) -> None:
        """The counts of `pages` changed, those of `flipped` (a subset) between 0 and positive: re-enter
        the cached ones whose key may have moved (coarse keys see only the sign of a count)."""
        if not self.keyed_by_count:
            return
        moved = self._cached.intersection(flipped if self.coarse is not None else pages)
        if moved:
            self.enter_each(moved)

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
            members = bucket.members
            order = bucket.order
            fresh = order is None and self.coarse is not None  # then `_sorted` left only live entries
            if order is None:
                order = bucket.order = self._sorted(members, key)
            k = min(n - len(out), len(order))
            if k and not exclude and (fresh or self._all_valid(order[-k:], key)):  # the k smallest at once
                chunk = order[-k:]
                del order[-k:]
                members.difference_update(chunk)
                chunk.reverse()
                out += chunk
                taken += k
            held: list[PageHash] = []
            while order and len(out) < n:
                page = order.pop()
                if not valid(page, key):
                    members.discard(page)
                    taken += 1
                elif page in exclude:
                    held.append(page)
                else:
                    members.discard(page)
                    taken += 1
                    out.append(page)
            if held:
                order.extend(reversed(held))
            if members:
                keep.append(key)
            else:
                del buckets[key]
        for key in keep:
            heapq.heappush(heap, key)
        self._size -= taken
        return out

    def holds(self, page: PageHash) -> bool:
        """Whether `page` has an entry under its current key (for invariant checks)."""
        bucket = self._buckets.get(self.key(page))
        return bucket is not None and page in bucket.members
