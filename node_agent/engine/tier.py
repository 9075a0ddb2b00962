"""One KV memory tier of a node (L1 = GPU memory, L2 = host memory), counted in pages.

Each of the tier's `capacity` page slots is in exactly one of four states:
- **free**: holds nothing.
- **in_use**: allocated to an owner (a request) and being written, not yet readable: either an anonymous
  slot *reserved* for a page the owner will compute or generate (its hash may not be known yet), or a
  *writing* slot whose page hash is known and whose content is on its way (a peer fetch landing in L2, a
  load from L2 into L1).
- **pinned**: a resident, complete page that at least one owner pins (refcounted by distinct owners).
- **cached**: a resident, complete page that nobody pins. Only cached pages are ever evicted.

Invariant (checked by `check`): free + cached + pinned + in_use == capacity, with `free` a counter kept
by every operation and the other three recounted from the page tables; free >= 0; a page is never both
resident and writing; an owner's pin set and the pages' pin counts agree; the eviction candidates are
exactly the unpinned resident pages.

Boundary: bookkeeping of one tier; what moves between tiers, eviction order and KV events live in
`kvpool`. Operations assume the caller checked room first and raise `PoolInvariantError` if not.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from evolving_infra.core.eviction import HostEvictionPolicy, HostPage
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.errors import PoolInvariantError

Owner = str
"""Who holds pins and in-use slots: a request id."""


@dataclass(frozen=True, slots=True)
class TierGauges:
    """Page counts of one tier; free + cached + pinned + in_use == capacity."""

    capacity: int
    free: int
    cached: int
    pinned: int
    in_use: int


@dataclass(slots=True)
class _Entry:
    parent: PageHash | None
    last_access: float
    pins: int = 0


class TierPool:
    """Page accounting of one tier (see the module docstring for the four states)."""

    def __init__(self, tier: Tier, capacity: int, policy: HostEvictionPolicy, counts: dict[PageHash, int]) -> None:
        if capacity < 1:
            raise ValueError(f"{tier.value} tier needs a capacity of at least 1 page, got {capacity}")
        self.tier = tier
        self.capacity = capacity
        self.policy = policy
        self._counts = counts  # shared with the pool, which pushes updates through `rekey`
        self._heap: list[tuple[tuple[float, ...], PageHash, int]] = []  # lazy: stale entries skipped
        self._stamp: dict[PageHash, int] = {}
        self._pages: dict[PageHash, _Entry] = {}
        self._cached: dict[PageHash, None] = {}  # unpinned resident pages (ordered set)
        self._writing: dict[PageHash, Owner] = {}
        self._reserved: dict[Owner, int] = {}
        self._owner_pins: dict[Owner, set[PageHash]] = {}
        self._free = capacity
        self._n_reserved = 0

    # --- queries -------------------------------------------------------------------------------------
    def contains(self, page: PageHash) -> bool:
        """Whether `page` is resident and complete (readable)."""
        return page in self._pages

    def is_writing(self, page: PageHash) -> bool:
        return page in self._writing

    def writer(self, page: PageHash) -> Owner | None:
        return self._writing.get(page)

    def parent(self, page: PageHash) -> PageHash | None:
        return self._pages[page].parent

    def pins(self, page: PageHash) -> int:
        entry = self._pages.get(page)
        return entry.pins if entry else 0

    def resident(self) -> frozenset[PageHash]:
        return frozenset(self._pages)

    def pinned_pages(self) -> frozenset[PageHash]:
        return frozenset(p for p, e in self._pages.items() if e.pins > 0)

    def pinned_by(self, owner: Owner) -> frozenset[PageHash]:
        return frozenset(self._owner_pins.get(owner, ()))

    def reserved_by(self, owner: Owner) -> int:
        return self._reserved.get(owner, 0)

    def owners(self) -> set[Owner]:
        """Every owner holding a pin, a reserved slot or a writing slot in this tier."""
        return set(self._owner_pins) | set(self._reserved) | set(self._writing.values())

    @property
    def free(self) -> int:
        return self._free

    def evictable(self, exclude: Iterable[PageHash] = ()) -> int:
        """Cached pages, not counting those in `exclude` (pages the caller is about to pin)."""
        return len(self._cached) - sum(1 for p in set(exclude) if p in self._cached)

    def room(self, exclude: Iterable[PageHash] = ()) -> int:
        """Slots obtainable now: free ones plus evictable cached ones."""
        return self._free + self.evictable(exclude)

    def candidates(self, counts: dict[PageHash, int], exclude: frozenset[PageHash]) -> Iterator[HostPage]:
        """Snapshots of the evictable pages for an eviction policy: cached ones not in `exclude`."""
        pages = self._pages
        for page in self._cached:
            if page not in exclude:
                yield HostPage(page, counts.get(page, 0), pages[page].last_access)

    @property
    def writing(self) -> int:
        """Slots being written with a known page hash (fetches into L2, loads into L1)."""
        return len(self._writing)

    def gauges(self) -> TierGauges:
        pinned = len(self._pages) - len(self._cached)
        return TierGauges(self.capacity, self._free, len(self._cached), pinned, len(self._writing) + self._n_reserved)

    # --- pins ----------------------------------------------------------------------------------------
    def touch(self, page: PageHash, now: float) -> None:
        entry = self._pages.get(page)
        if entry is not None and now > entry.last_access:
            entry.last_access = now
            if page in self._cached:
                self._index(page)

    # --- eviction order ------------------------------------------------------------------------------
    def _index(self, page: PageHash) -> None:
        """(Re)enter cached `page` in the eviction heap under its current key."""
        stamp = self._stamp.get(page, 0) + 1
        self._stamp[page] = stamp
        snap = HostPage(page, self._counts.get(page, 0), self._pages[page].last_access)
        heapq.heappush(self._heap, (self.policy.key(snap), page, stamp))
        if len(self._heap) > 4 * len(self._cached) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = []
        self._stamp = {}
        for page in self._cached:
            self._stamp[page] = 1
            snap = HostPage(page, self._counts.get(page, 0), self._pages[page].last_access)
            self._heap.append((self.policy.key(snap), page, 1))
        heapq.heapify(self._heap)

    def rekey(self, page: PageHash) -> None:
        """The branch count of `page` changed."""
        if page in self._cached:
            self._index(page)

    def victims(self, n: int, exclude: frozenset[PageHash] = frozenset()) -> list[PageHash]:
        """Take the first `n` cached pages not in `exclude`, in ascending (policy key, page hash) order
        (the order `policy.victims` gives), from a lazy heap so choosing costs O(n log size). The caller
        evicts every page returned."""
        out: list[PageHash] = []
        skipped: list[tuple[tuple[float, ...], PageHash, int]] = []
        heap = self._heap
        while heap and len(out) < n:
            item = heapq.heappop(heap)
            _, page, stamp = item
            if page not in self._cached or self._stamp.get(page) != stamp:
                continue  # stale: pinned, evicted or re-keyed since
            if page in exclude:
                skipped.append(item)
                continue
            out.append(page)
        for item in skipped:
            heapq.heappush(heap, item)
        return out

    def pin(self, owner: Owner, page: PageHash, now: float) -> None:
        """`owner` pins resident `page` (once per owner); the page leaves the eviction candidates."""
        entry = self._pages.get(page)
        if entry is None:
            raise PoolInvariantError(f"{self.tier.value}: cannot pin page {page:#x}: not resident")
        pins = self._owner_pins.setdefault(owner, set())
        if page not in pins:
            pins.add(page)
            entry.pins += 1
            self._cached.pop(page, None)
        self.touch(page, now)

    def unpin(self, owner: Owner, page: PageHash) -> None:
        """Drop `owner`'s pin on `page` without touching it (undoing a pin that turned out unneeded)."""
        pins = self._owner_pins.get(owner)
        if pins is None or page not in pins:
            raise PoolInvariantError(f"{self.tier.value}: {owner} does not pin page {page:#x}")
        pins.discard(page)
        if not pins:
            del self._owner_pins[owner]
        entry = self._pages[page]
        entry.pins -= 1
        if entry.pins == 0:
            self._cached[page] = None
            self._index(page)

    def unpin_all(self, owner: Owner, now: float) -> list[PageHash]:
        """Drop every pin of `owner`; pages nobody else pins become cached (touched at `now`)."""
        pages = self._owner_pins.pop(owner, set())
        for page in pages:
            entry = self._pages[page]
            entry.pins -= 1
            if now > entry.last_access:
                entry.last_access = now
            if entry.pins == 0:
                self._cached[page] = None
                self._index(page)
        return sorted(pages)

    # --- in-use slots --------------------------------------------------------------------------------
    def _take_free(self, n: int, what: str) -> None:
        if n > self._free:
            raise PoolInvariantError(f"{self.tier.value}: {what} needs {n} free page(s), only {self._free} free")
        self._free -= n

    def reserve(self, owner: Owner, n: int) -> None:
        """Reserve `n` anonymous in-use slots for pages `owner` will write."""
        if n <= 0:
            return
        self._take_free(n, f"reserving for {owner}")
        self._reserved[owner] = self._reserved.get(owner, 0) + n
        self._n_reserved += n

    def unreserve(self, owner: Owner, n: int | None = None) -> int:
        """Return `n` (default: all) of `owner`'s reserved slots to free; the number returned."""
        held = self._reserved.get(owner, 0)
        n = held if n is None else min(n, held)
        if n <= 0:
            return 0
        if held - n:
            self._reserved[owner] = held - n
        else:
            del self._reserved[owner]
        self._n_reserved -= n
        self._free += n
        return n

    def begin_write(self, owner: Owner, page: PageHash) -> None:
        """A free slot starts receiving `page` (known hash) for `owner`."""
        if page in self._pages or page in self._writing:
            raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is already resident or being written")
        self._take_free(1, f"writing page {page:#x}")
        self._writing[page] = owner

    def writes_of(self, owner: Owner) -> list[PageHash]:
        return [p for p, o in self._writing.items() if o == owner]

    def cancel_write(self, page: PageHash) -> None:
        del self._writing[page]
        self._free += 1

    # --- residency -----------------------------------------------------------------------------------
    def insert(
        self,
        page: PageHash,
        parent: PageHash | None,
        now: float,
        *,
        source: Owner | None = None,
        pin_owner: Owner | None = None,
    ) -> None:
        """Make `page` resident. Its slot comes from `source`'s writing slot for this page, else from
        `source`'s reservation, else (source None) from a free slot. Pinned by `pin_owner` if given."""
        if page in self._pages:
            raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is already resident")
        if source is not None and self._writing.get(page) == source:
            del self._writing[page]
        elif source is not None:
            if self._reserved.get(source, 0) < 1:
                raise PoolInvariantError(f"{self.tier.value}: {source} stores page {page:#x} without a reserved slot")
            self.unreserve(source, 1)
            self._take_free(1, "storing a reserved page")
        else:
            if page in self._writing:
                raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is being written by another owner")
            self._take_free(1, f"storing page {page:#x}")
        self._pages[page] = _Entry(parent, now)
        if pin_owner is not None:
            self._cached[page] = None
            self.pin(pin_owner, page, now)
        else:
            self._cached[page] = None
            self._index(page)

    def remove(self, page: PageHash) -> None:
        """Evict cached `page` (never a pinned one)."""
        entry = self._pages.get(page)
        if entry is None:
            raise PoolInvariantError(f"{self.tier.value}: cannot remove page {page:#x}: not resident")
        if entry.pins > 0:
            raise PoolInvariantError(f"{self.tier.value}: refusing to evict pinned page {page:#x} ({entry.pins} pins)")
        del self._pages[page]
        del self._cached[page]
        self._stamp.pop(page, None)
        self._free += 1

    # --- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise `PoolInvariantError` naming the first accounting rule that does not hold."""
        name = self.tier.value
        pinned = sum(1 for e in self._pages.values() if e.pins > 0)
        cached = len(self._pages) - pinned
        in_use = len(self._writing) + sum(self._reserved.values())
        if self._free < 0:
            raise PoolInvariantError(f"{name}: free is negative ({self._free})")
        if self._free + cached + pinned + in_use != self.capacity:
            raise PoolInvariantError(
                f"{name}: free {self._free} + cached {cached} + pinned {pinned} + in_use {in_use} "
                f"!= capacity {self.capacity}"
            )
        if sum(self._reserved.values()) != self._n_reserved or any(v <= 0 for v in self._reserved.values()):
            raise PoolInvariantError(f"{name}: reserved slot counter {self._n_reserved} disagrees with the owners'")
        both = set(self._writing) & set(self._pages)
        if both:
            raise PoolInvariantError(f"{name}: pages both resident and being written: {sorted(both)}")
        expected_cached = {p for p, e in self._pages.items() if e.pins == 0}
        if expected_cached != set(self._cached):
            raise PoolInvariantError(f"{name}: eviction candidates differ from the unpinned resident pages")
        counted: dict[PageHash, int] = {}
        for owner, pages in self._owner_pins.items():
            for page in pages:
                if page not in self._pages:
                    raise PoolInvariantError(f"{name}: {owner} pins page {page:#x}, which is not resident")
                counted[page] = counted.get(page, 0) + 1
        for page, entry in self._pages.items():
            if entry.pins != counted.get(page, 0):
                raise PoolInvariantError(
                    f"{name}: page {page:#x} has pin count {entry.pins} but {counted.get(page, 0)} owner pin(s)"
                )
