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
exactly the unpinned resident pages, each entered in the eviction index under its current key.

Representation (chosen so that a whole run of pages is pinned, unpinned or touched with C-level set and
dict operations): per resident page its parent and last access (`_parent`, `_access`) and its depth in its
chain (`_depth`, one table shared with the node's other tier: the eviction tie-break); the pinned pages as a
set, with the pin count kept only for pages pinned by two or more owners (`_shared`); the cached pages as a
set; `_max_access`, an upper bound of every last access, so that touching pages at a time `now` at or past
it sets every last access to `now` without reading them. The eviction order lives in an `EvictionOrder`;
the operations on a whole run of pages at once are inherited from `tierruns.TierRuns`.

Pin touches are kept per run: `pin_all` records (time, pages) once in `_pin_touches` of its owner instead
of writing the time into `_access` page by page. A page's last access is the largest of `_access` and the
recorded touches of the owners that pin it (`last_access`). Only cached pages are ordered by last access,
and a page leaves its owner's pins only through `unpin` (which settles that page's touches first) or
`unpin_all` at a time `now`, which touches every page at `now` anyway: it settles the owner's touches only
when one is later than `now`, else drops them. Touches while pinned (`touch`, `touch_all`) take the maximum,
so unsettled touches of other owners stay valid.

Boundary: bookkeeping of one tier; what moves between tiers, eviction order and KV events live in
`kvpool`. Operations assume the caller checked room first and raise `PoolInvariantError` if not.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator, KeysView, Mapping
from dataclasses import dataclass

from evolving_infra.core.eviction import HostEvictionPolicy, HostPage
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.evictindex import EvictionOrder
from evolving_infra.node_agent.engine.tierruns import Owner, TierRuns, shared_depth

__all__ = ["Owner", "TierGauges", "TierPool"]


@dataclass(frozen=True, slots=True)
class TierGauges:
    """Page counts of one tier; free + cached + pinned + in_use == capacity."""

    capacity: int
    free: int
    cached: int
    pinned: int
    in_use: int


class TierPool(TierRuns):
    """Page accounting of one tier (see the module docstring for the four states)."""

    def __init__(
        self,
        tier: Tier,
        capacity: int,
        policy: HostEvictionPolicy,
        counts: dict[PageHash, int],
        depth: dict[PageHash, int] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"{tier.value} tier needs a capacity of at least 1 page, got {capacity}")
        self.tier = tier
        self.capacity = capacity
        self.policy = policy
        self._counts = counts  # shared with the pool (positive counts only), which pushes updates via `rekey`
        self._parent: dict[PageHash, PageHash | None] = {}  # resident pages
        # Depth of every page resident here or in the peer tier (shared with it when a `KvPool` owns both).
        self._depth: dict[PageHash, int] = {} if depth is None else depth
        self._peer: TierPool | None = None  # the node's other tier, which shares `_depth`
        self._access: dict[PageHash, float] = {}  # last access of resident pages
        self._max_access = -math.inf  # >= every last access
        self._pinned: set[PageHash] = set()
        self._shared: dict[PageHash, int] = {}  # pin count of pages pinned by two or more owners
        self._cached: set[PageHash] = set()  # unpinned resident pages
        self._order = EvictionOrder(policy, self._cached, self._access, counts, self._depth)
        self._writing: dict[PageHash, Owner] = {}
        self._reserved: dict[Owner, int] = {}
        self._owner_pins: dict[Owner, set[PageHash]] = {}
        # Touches of pinned pages not yet in `_access`: per owner, (time, pages it pins) of each `pin_all`.
        self._pin_touches: dict[Owner, list[tuple[float, set[PageHash]]]] = {}
        self._free = capacity
        self._n_reserved = 0
        self._gauges = TierGauges(capacity, capacity, 0, 0, 0)

    # --- queries -------------------------------------------------------------------------------------
    def contains(self, page: PageHash) -> bool:
        """Whether `page` is resident and complete (readable)."""
        return page in self._parent

    def is_writing(self, page: PageHash) -> bool:
        return page in self._writing

    def writer(self, page: PageHash) -> Owner | None:
        return self._writing.get(page)

    def parent(self, page: PageHash) -> PageHash | None:
        return self._parent[page]

    def pins(self, page: PageHash) -> int:
        if page not in self._pinned:
            return 0
        return self._shared.get(page, 1)

    def resident(self) -> frozenset[PageHash]:
        return frozenset(self._parent)

    def resident_set(self) -> KeysView[PageHash]:
        """A live, read-only view of the resident pages (supports `in` and set operations; do not keep)."""
        return self._parent.keys()

    def writing_set(self) -> KeysView[PageHash]:
        """A live, read-only view of the pages being written (supports `in` and set operations)."""
        return self._writing.keys()

    def pinned_pages(self) -> frozenset[PageHash]:
        return frozenset(self._pinned)

    def pinned_by(self, owner: Owner) -> frozenset[PageHash]:
        return frozenset(self._owner_pins.get(owner, ()))

    def is_pinned_by(self, owner: Owner, page: PageHash) -> bool:
        pins = self._owner_pins.get(owner)
        return pins is not None and page in pins

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
        return len(self._cached) - len(self._cached.intersection(exclude)) if exclude else len(self._cached)

    def room(self, exclude: Iterable[PageHash] = ()) -> int:
        """Slots obtainable now: free ones plus evictable cached ones."""
        return self._free + self.evictable(exclude)

    def lacks_room(self, n: int, exclude: Collection[PageHash] = ()) -> bool:
        """Whether `room(exclude) < n`, reading the cached pages only where the bounds free + cached - |exclude|
        <= room <= free + cached do not decide it."""
        free = self._free
        if n <= free:
            return False
        cached = len(self._cached)
        if free + cached < n:
            return True
        if free + cached - len(exclude) >= n:
            return False
        return free + cached - len(self._cached.intersection(exclude)) < n

    def candidates(self, counts: Mapping[PageHash, int], exclude: frozenset[PageHash]) -> Iterator[HostPage]:
        """Snapshots of the evictable pages for an eviction policy: cached ones not in `exclude`."""
        access = self._access
        for page in self._cached:
            if page not in exclude:
                yield HostPage(page, counts.get(page, 0), access[page])

    @property
    def writing(self) -> int:
        """Slots being written with a known page hash (fetches into L2, loads into L1)."""
        return len(self._writing)

    def gauges(self) -> TierGauges:
        cached = len(self._cached)
        last = self._gauges
        in_use = len(self._writing) + self._n_reserved
        pinned = len(self._parent) - cached
        if last.free != self._free or last.cached != cached or last.pinned != pinned or last.in_use != in_use:
            last = self._gauges = TierGauges(self.capacity, self._free, cached, pinned, in_use)
        return last  # an immutable value: the last one is handed out again while nothing changed

    # --- eviction order ------------------------------------------------------------------------------
    def rekey(self, page: PageHash) -> None:
        """The branch count of `page` changed."""
        if page in self._cached and self._order.keyed_by_count:
            self._order.enter(page)

    def counts_changed(self, pages: Iterable[PageHash], flipped: Iterable[PageHash]) -> None:
        """The branch counts of `pages` changed; those of `flipped` (a subset) went from 0 to positive or
        back."""
        self._order.recount(pages, flipped)

    @property
    def keyed_by_count(self) -> bool:
        return self._order.keyed_by_count

    def victims(self, n: int, exclude: frozenset[PageHash] = frozenset()) -> list[PageHash]:
        """Take the first `n` cached pages not in `exclude`, in ascending (policy key, deepest first, page hash)
        order (`evictindex`), from the eviction order. The caller evicts every page returned."""
        return self._order.victims(n, exclude)

    def victims_and_ids(self, n: int, exclude: frozenset[PageHash] = frozenset()) -> tuple[list[PageHash], None]:
        """`victims`, and no ids (the id tables give theirs: `IdTierPool.victims_and_ids`)."""
        return self.victims(n, exclude), None

    # --- access and pins -----------------------------------------------------------------------------
    def touch(self, page: PageHash, now: float) -> None:
        access = self._access.get(page)
        if access is not None and now > access:
            self._access[page] = now
            if now > self._max_access:
                self._max_access = now
            if page in self._cached:
                self._order.enter(page)

    def pin(self, owner: Owner, page: PageHash, now: float) -> None:
        """`owner` pins resident `page` (once per owner); the page leaves the eviction candidates."""
        if page not in self._parent:
            raise PoolInvariantError(f"{self.tier.value}: cannot pin page {page:#x}: not resident")
        pins = self._owner_pins.setdefault(owner, set())
        if page not in pins:
            pins.add(page)
            if page in self._pinned:
                self._shared[page] = self._shared.get(page, 1) + 1
            else:
                self._pinned.add(page)
                self._cached.discard(page)
        self.touch(page, now)

    def unpin(self, owner: Owner, page: PageHash) -> None:
        """Drop `owner`'s pin on `page` without touching it (undoing a pin that turned out unneeded)."""
        pins = self._owner_pins.get(owner)
        if pins is None or page not in pins:
            raise PoolInvariantError(f"{self.tier.value}: {owner} does not pin page {page:#x}")
        touches = self._pin_touches.get(owner)
        if touches:
            self._settle_touches([(when, {page}) for when, pages in touches if page in pages])
            for _, pages in touches:
                pages.discard(page)
        pins.discard(page)
        if not pins:
            del self._owner_pins[owner]
            self._pin_touches.pop(owner, None)
        left = self._shared.get(page, 1) - 1
        if left > 1:
            self._shared[page] = left
        elif left == 1:
            del self._shared[page]
        else:
            self._pinned.discard(page)
            self._cached.add(page)
            self._order.enter(page)

    def unpin_all(self, owner: Owner, now: float) -> list[PageHash]:
        """Drop every pin of `owner`; pages nobody else pins become cached (touched at `now`)."""
        touches = self._pin_touches.pop(owner, None)
        pages = self._owner_pins.pop(owner, None)
        if not pages:
            return []
        if touches and max(when for when, _ in touches) > now:  # else the touch at `now` below covers them
            self._settle_touches(touches)
        shared = self._shared
        still = shared.keys() & pages if shared else ()  # (iterates the smaller; `set & dict` iterates the dict)
        for page in still:
            left = shared[page] - 1
            if left > 1:
                shared[page] = left
            else:
                del shared[page]
        freed = pages.difference(still) if still else pages
        self._pinned -= freed
        self._cached |= freed
        if self._all_at_most(pages, now):
            self._set_access(pages, now)
            self._order.enter_all(freed, now)
        else:
            access = self._access
            for page in pages:
                if now > access[page]:
                    access[page] = now
            self._order.enter_each(freed)
        return list(pages)

    def _settle_touches(self, touches: list[tuple[float, set[PageHash]]]) -> None:
        """Apply pin touches (time, pinned pages) to `_access`, in order (each keeps a later access)."""
        for when, pages in touches:
            if pages:
                self._touch_pinned(pages, when)

    def last_access(self, page: PageHash) -> float:
        """The last access of resident `page`, pin touches not yet settled included (for checks and tests)."""
        access = self._access[page]
        for owner, touches in self._pin_touches.items():
            if page in self._owner_pins.get(owner, ()):
                access = max([access, *(when for when, pages in touches if page in pages)])
        return access

    def last_accesses(self) -> dict[PageHash, float]:
        """`last_access` of every resident page."""
        return {page: self.last_access(page) for page in self._access}

    # --- in-use slots --------------------------------------------------------------------------------
    def _no_free(self, n: int, what: str) -> None:
        raise PoolInvariantError(f"{self.tier.value}: {what} needs {n} free page(s), only {self._free} free")

    def reserve(self, owner: Owner, n: int) -> None:
        """Reserve `n` anonymous in-use slots for pages `owner` will write."""
        if n <= 0:
            return
        if n > self._free:
            self._no_free(n, f"reserving for {owner}")
        self._free -= n
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
        if page in self._parent or page in self._writing:
            raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is already resident or being written")
        if self._free < 1:
            self._no_free(1, f"writing page {page:#x}")
        self._free -= 1
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
        if page in self._parent:
            raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is already resident")
        if source is not None and self._writing.get(page) == source:
            del self._writing[page]
        elif source is not None:  # the reserved slot becomes the page's: free does not change
            held = self._reserved.get(source, 0)
            if held < 1:
                raise PoolInvariantError(f"{self.tier.value}: {source} stores page {page:#x} without a reserved slot")
            if held > 1:
                self._reserved[source] = held - 1
            else:
                del self._reserved[source]
            self._n_reserved -= 1
        else:
            if page in self._writing:
                raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is being written by another owner")
            if self._free < 1:
                self._no_free(1, f"storing page {page:#x}")
            self._free -= 1
        self._parent[page] = parent
        if page not in self._depth:
            self._depth[page] = shared_depth(self._depth.get(parent, -1) + 1)  # type: ignore[arg-type]  # None: a root
        self._access[page] = now
        if now > self._max_access:
            self._max_access = now
        if pin_owner is not None:
            pins = self._owner_pins.get(pin_owner)
            if pins is None:
                self._owner_pins[pin_owner] = {page}
            else:
                pins.add(page)
            self._pinned.add(page)
        else:
            self._cached.add(page)
            self._order.enter(page)

    def remove(self, page: PageHash) -> None:
        """Evict cached `page` (never a pinned one)."""
        if page not in self._parent:
            raise PoolInvariantError(f"{self.tier.value}: cannot remove page {page:#x}: not resident")
        if page in self._pinned:
            raise PoolInvariantError(
                f"{self.tier.value}: refusing to evict pinned page {page:#x} ({self.pins(page)} pins)"
            )
        del self._parent[page]
        del self._access[page]
        self._cached.discard(page)
        self._free += 1
        if self._peer is None or page not in self._peer._parent:
            del self._depth[page]

    # --- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise `PoolInvariantError` naming the first accounting rule that does not hold."""
        name = self.tier.value
        resident = self._parent.keys()
        pinned = len(self._pinned & resident)
        cached = len(self._parent) - pinned
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
        both = set(self._writing) & set(self._parent)
        if both:
            raise PoolInvariantError(f"{name}: pages both resident and being written: {sorted(both)}")
        if not resident <= self._depth.keys():
            raise PoolInvariantError(f"{name}: resident pages without a depth")
        if self._access.keys() != resident or any(t > self._max_access for t in self._access.values()):
            raise PoolInvariantError(f"{name}: last-access table disagrees with the resident pages")
        if not self._pinned.issubset(resident) or self._cached != resident - self._pinned:
            raise PoolInvariantError(f"{name}: eviction candidates differ from the unpinned resident pages")
        for owner, touches in self._pin_touches.items():
            if not all(pages <= self._owner_pins.get(owner, set()) for _, pages in touches):
                raise PoolInvariantError(f"{name}: pin touches of {owner} name pages it does not pin")
        if not self._pinned.issuperset(self._shared):
            raise PoolInvariantError(f"{name}: pin counts kept for pages nobody pins")
        counted: dict[PageHash, int] = {}
        for owner, pages in self._owner_pins.items():
            for page in pages:
                if page not in resident:
                    raise PoolInvariantError(f"{name}: {owner} pins page {page:#x}, which is not resident")
                counted[page] = counted.get(page, 0) + 1
        for page in resident:
            if self.pins(page) != counted.get(page, 0) or self._shared.get(page, 2) < 2:
                raise PoolInvariantError(
                    f"{name}: page {page:#x} has pin count {self.pins(page)} but {counted.get(page, 0)} owner pin(s)"
                )
        for page in self._cached:
            if not self._order.holds(page):
                raise PoolInvariantError(f"{name}: cached page {page:#x} is missing from the eviction order")
