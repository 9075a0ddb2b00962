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

Entries are lower bounds (built-in policies): a coarse key only rises while a page stays resident, except
when its count drops to 0, so a page's entry is left where it is when its key rises (a touch, a count going
positive) and only a drop to count 0 enters a cached page again at once (a pinned one leaves `entered`).
The set `entered` names the pages that hold such an entry: a cached page is touched with no work here, a
released one is entered only when it is not in `entered`, and a page leaving the tier, or taken as a
victim, leaves `entered` (`forget`; a victim put back is entered again). `victims`, meeting an entry of a
cached page under a key below the page's key, moves it to the page's key (a bucket created or joined there); an
entry under a key above it is a duplicate (the page holds a lower one) and is dropped; an entry of a page
not cached (pinned, or gone) is dropped and the page leaves `entered` (entered again when released).
Other policies' keys may fall with any count change: their entries are exact (every change enters the
page again under its new key), and an entry whose key is no longer its page's is dropped when met. Either
way the buckets are rebuilt from the cached pages (and `entered` reset to them) when stale entries
outnumber live ones several times.

Invariant (checked by `TierPool.check` through `unheld`): with coarse keys, every cached page is in
`entered`, every page in `entered` is resident, and each holds an entry under a key at or below its current
key (its last access as the tier's table has it; unsettled pin touches only raise it); with other keys,
every cached page is a member of the bucket of its current key. Then `victims` yields exactly the cached
pages, in ascending (key, rank) order, each once: buckets come off the heap in key order, a key is in the
heap exactly while it has a bucket, and a page met below its key is moved to a bucket still to come.

Boundary: ordering only; the tier owns the page tables this reads (cached set, last access, counts) and tells
the order when a page becomes cached or leaves the tier, and when a page's count changes (with other
policies also when a cached page's last access rises).
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
        self.lazy = self.coarse is not None  # entries are lower bounds (a rising key needs no work here)
        self.keyed_by_count = self.coarse is not _lru_key  # whether a count change can move a page
        self._cached, self._access, self._counts, self._depth = cached, access, counts, depth
        self._buckets: dict[Key, _Bucket] = {}
        self._keys: list[Key] = []  # a heap; a key is in it exactly while it has a bucket
        self._size = 0  # entries in all buckets, stale ones included
        self._entered: set[PageHash] = set()  # coarse keys: pages holding an entry at or below their key
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
        only when two entries share a depth (else the depths alone give the order). For coarse keys the other
        entries are settled first, as `victims` would one by one (`_settle`): those of pages not cached
        dropped (C-level passes), those of cached pages whose key is no longer `key` moved or dropped;
        otherwise entries of pages neither tier holds (no depth) are dropped."""
        if self.coarse is not None:
            cached = self._cached
            live = list(filter(cached.__contains__, members))
            if len(live) != len(members):
                self._entered.difference_update(filterfalse(cached.__contains__, members))
            times = list(map(self._access.__getitem__, live))
            exact = all(map(eq, times, repeat(key[-1])))
            if exact and self.keyed_by_count:
                counts = self._counts
                exact = all(map(counts.__contains__, live)) if key[0] > 0 else counts.keys().isdisjoint(live)
            if not exact:
                live = self._split(live, times, key)
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

    def _split(self, pages: list[PageHash], times: list[float], key: Key) -> list[PageHash]:
        """Of cached `pages` (last accessed at `times`) with entries under `key` (coarse keys): those whose key
        is `key`; the others' entries move to their keys when those are larger (the caller drops them here)."""
        coarse, counts = self.coarse, self._counts
        assert coarse is not None
        live: list[PageHash] = []
        moved: dict[Key, list[PageHash]] = {}
        for page, when in zip(pages, times):
            current = coarse(page in counts, when)
            if current == key:
                live.append(page)
            elif current > key:
                group = moved.get(current)
                if group is None:
                    moved[current] = [page]
                else:
                    group.append(page)
        for current, group in moved.items():
            self._add_all(current, group)
        return live

    def _settle(self, page: PageHash, key: Key) -> None:
        """After dropping a stale entry of `page` under `key` (coarse keys): move it to the page's key if that
        is larger and the page cached; forget the page if it is not cached."""
        if page in self._cached:
            current = self.key(page)
            if current > key:
                self._add_all(current, (page,))
        else:
            self._entered.discard(page)

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
        if self.lazy:
            self._entered.add(page)
        if page not in bucket.members:
            bucket.members.add(page)
            self._size += 1
            if self._size > self._limit():
                self._rebuild()

    def _add_all(self, key: Key, pages: Iterable[PageHash]) -> None:
        bucket = self._bucket(key)
        members = bucket.members
        pages = pages if isinstance(pages, (set, list, tuple)) else list(pages)
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
        self._entered |= pages
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
        self._entered |= pages
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

    def released(self, page: PageHash) -> None:
        """`page` became cached (unpinned): entered unless it holds a lower-bound entry (coarse keys)."""
        if not self.lazy or page not in self._entered:
            self.enter(page)

    def released_all(self, pages: set[PageHash], now: float) -> None:
        """`released` for cached `pages`, every one last accessed at `now` (one C-level set difference)."""
        if self.lazy:
            pages = pages - self._entered
        if pages:
            self.enter_all(pages, now)

    def released_each(self, pages: set[PageHash]) -> None:
        """`released` for cached `pages` (any last accesses)."""
        if self.lazy:
            pages = pages - self._entered
        if pages:
            self.enter_each(pages)

    def forget(self, pages: Iterable[PageHash]) -> None:
        """`pages` left the tier (their entries stay, stale until met)."""
        if self.lazy:
            self._entered.difference_update(pages)

    def recount(self, pages: Iterable[PageHash], flipped: Iterable[PageHash]) -> None:
        """The counts of `pages` changed, those of `flipped` (a subset) between 0 and positive: re-enter
        the cached ones whose key may have fallen (coarse keys: those now at 0, the others' keys rose; the
        ones not cached leave `entered`), or changed (other policies)."""
        if not self.keyed_by_count:
            return
        if self.coarse is None:
            moved = self._cached.intersection(pages)
        else:
            down = set(flipped).difference(self._counts)  # (a dict: C-level look-ups)
            if not down:
                return
            self._entered -= down
            moved = self._cached.intersection(down)
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
        self._entered = set()
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
        order (the caller evicts them, or enters them again); stale entries met on the way are settled."""
        out: list[PageHash] = []
        keep: list[Key] = []
        heap, buckets, valid, lazy = self._keys, self._buckets, self._valid, self.lazy
        taken = 0
        while heap and len(out) < n:
            key = heapq.heappop(heap)
            bucket = buckets[key]
            members = bucket.members
            order = bucket.order
            fresh = order is None and lazy  # then `_sorted` left only live entries
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
                    if lazy:
                        self._settle(page, key)
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
        if lazy and out:
            self._entered.difference_update(out)
        return out

    # --- invariant checks (slow: for tests and `check` modes) ----------------------------------------
    def _lowest(self) -> dict[PageHash, Key]:
        """Each page with an entry: the smallest key it has one under."""
        lowest: dict[PageHash, Key] = {}
        for key, bucket in self._buckets.items():
            for page in bucket.members:
                if page not in lowest or key < lowest[page]:
                    lowest[page] = key
        return lowest

    def holds(self, page: PageHash) -> bool:
        """Whether resident `page` holds its entry as the invariant asks: coarse keys, it is in `entered`
        with an entry under a key at or below its current key; other keys, an entry under its current key."""
        key = self.key(page)
        if not self.lazy:
            bucket = self._buckets.get(key)
            return bucket is not None and page in bucket.members
        return page in self._entered and any(
            page in bucket.members for at, bucket in self._buckets.items() if at <= key
        )

    def unheld(self) -> list[PageHash]:
        """The pages that break the module's invariant (none when it holds): cached pages not held, and
        (coarse keys) pages in `entered` that are not resident or not held."""
        if not self.lazy:
            return [page for page in self._cached if not self.holds(page)]
        lowest, access = self._lowest(), self._access
        bad = [page for page in self._cached if page not in self._entered]
        for page in self._entered:
            if page not in access or page not in lowest or lowest[page] > self.key(page):
                bad.append(page)
        return bad
