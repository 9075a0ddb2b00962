"""Operations of a tier on a whole run of pages at once: the same state as the page-by-page operations of
`tier.TierPool`, done with C-level set and dict operations (`set |=`, `dict.update`, `dict.fromkeys`)
instead of a Python step per page. `TierPool` inherits them; they read and write its tables.

Exactness rules: a run is touched at `now` in one `dict.update` only when no page of it was last accessed
after `now` (otherwise page by page, keeping the later access); a run enters the eviction order in one set
update per key (`EvictionOrder.enter_all`); a run's new pages get consecutive depths (`new_depths`); a pin's
touch is kept once per run (see `tier`); error cases raise leaving the state as it was. `room_for_run` plans
the evictions a run's page-by-page writes would make, and declines where choosing them up front could differ.
Each run operation passes over a large table (residency, pins, cached pages, last access) at most once per
change it makes: checks that a caller has already made, or that a table operation it does anyway decides
(`pin_all`), are not repeated (`insert_run`, `remove_victims`). Depths are shared int objects (`shared_depths`).

Boundary: page accounting of one tier, like `tier`; which runs to move, and the KV events, are `kvpool`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from itertools import filterfalse
from operator import eq

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.evictindex import EvictionOrder
from evolving_infra.node_agent.engine.pageids import Ids
from evolving_infra.node_agent.engine.writeback import Place, WriteBackPlan, plan_write_back

Owner = str
"""Who holds pins and in-use slots: a request id."""


_DEPTHS: list[int] = list(range(1024))  # shared int objects for depths (see `shared_depths`)


def shared_depths(first: int, n: int) -> list[int]:
    """The `n` consecutive depths from `first`, as int objects shared by every page of one depth (an int above
    256 is otherwise a new 32-byte object per page in the depth table)."""
    end = first + n
    if end > len(_DEPTHS):
        _DEPTHS.extend(range(len(_DEPTHS), max(end, 2 * len(_DEPTHS))))
    return _DEPTHS[first:end]


def shared_depth(d: int) -> int:
    """`d` (>= 0) as the int object that `shared_depths` hands out for it."""
    return _DEPTHS[d] if d < len(_DEPTHS) else shared_depths(d, 1)[0]


class RunDepths(Enum):
    """What a caller of `TierRuns.insert_run` knows of the depths of the run's pages."""

    LOOKUP = "lookup"  # nothing: look each page up in the depth table
    ALL_KNOWN = "all_known"  # every page has one (the peer tier holds it)
    NONE_KNOWN = "none_known"  # none has one (neither tier holds any)


def new_depths(
    items: Mapping[PageHash, PageHash | None], depth: Mapping[PageHash, int], *, none_known: bool = False
) -> dict[PageHash, int]:
    """The depths that the pages of `items` (page -> parent, in chain order) without one in `depth` get when
    stored in that order: one more than the parent's (from `depth` or earlier in `items`), 0 without a known
    parent. C-level passes when those pages form one chain (each the parent of the next), as a run does.
    `none_known`: no page of `items` is in `depth` (the caller knows; no look-ups)."""
    fresh = list(items) if none_known else list(filterfalse(depth.__contains__, items))
    if not fresh:
        return {}
    parents = list(items.values()) if none_known else list(map(items.__getitem__, fresh))
    if all(map(eq, parents[1:], fresh)):  # one chain: consecutive depths from its first page's
        return dict(zip(fresh, shared_depths(depth.get(parents[0], -1) + 1, len(fresh))))  # type: ignore[arg-type]
    new: dict[PageHash, int] = {}
    for page, parent in zip(fresh, parents):
        known = new.get(parent)  # type: ignore[arg-type]  # None: a root
        new[page] = shared_depth((depth.get(parent, -1) if known is None else known) + 1)  # type: ignore[arg-type]
    return new


class TierRuns:
    """Run operations over the tables of `TierPool` (declared here for type checkers)."""

    tier: Tier
    _parent: dict[PageHash, PageHash | None]
    _depth: dict[PageHash, int]
    _peer: TierRuns | None
    _access: dict[PageHash, float]
    _max_access: float
    _pinned: set[PageHash]
    _shared: dict[PageHash, int]
    _cached: set[PageHash]
    _writing: dict[PageHash, Owner]
    _reserved: dict[Owner, int]
    _owner_pins: dict[Owner, set[PageHash]]
    _pin_touches: dict[Owner, list[tuple[float, set[PageHash]]]]
    _free: int
    _n_reserved: int
    _order: EvictionOrder

    def touch(self, page: PageHash, now: float) -> None:  # pragma: no cover - TierPool's
        raise NotImplementedError

    def _no_free(self, n: int, what: str) -> None:  # pragma: no cover - TierPool's
        raise NotImplementedError

    def _all_at_most(self, pages: Iterable[PageHash], now: float) -> bool:
        """Whether every page of `pages` (resident) was last accessed at or before `now`."""
        return now >= self._max_access or max(map(self._access.__getitem__, pages), default=now) <= now

    def _set_access(self, pages: Iterable[PageHash], now: float) -> None:
        """Last access := `now` for `pages` (resident, none accessed after `now`)."""
        self._access.update(dict.fromkeys(pages, now))
        if now > self._max_access:
            self._max_access = now

    def touch_all(self, pages: set[PageHash], now: float) -> None:
        """`touch` every page of `pages` (all resident)."""
        if self._all_at_most(pages, now):  # then they all become `now`
            self._set_access(pages, now)
            # The cached ones: a resident page is pinned or cached, and the pinned set is the small one.
            pinned = pages & self._pinned  # (iterates the smaller set)
            cached = pages - pinned if pinned else pages
            if cached:
                self._order.enter_all(cached, now)
        else:
            for page in pages:
                self.touch(page, now)

    def _touch_pinned(self, pages: Iterable[PageHash], now: float) -> None:
        """Touch resident, pinned `pages` at `now` (pinned pages have no eviction entry to update)."""
        if self._all_at_most(pages, now):
            self._set_access(pages, now)
        else:
            access = self._access
            for page in pages:
                if now > access[page]:
                    access[page] = now

    def pin_all(self, owner: Owner, pages: Iterable[PageHash], now: float) -> None:
        """`owner` pins every page of `pages` (all resident); the same as `pin` page by page, except that the
        touch at `now` is kept as one entry of the owner's pin touches (see `TierPool`), not page by page.
        One pass per table: a resident page is pinned or cached, so the pages that become pinned and are
        not pinned yet must all leave the cached set (else one is not resident: undone, then raised)."""
        pages = set(pages)
        if not pages:
            return
        pins = self._owner_pins.get(owner)
        new = pages if pins is None else pages - pins  # (an owner's pins are resident)
        if new:
            again = new & self._pinned
            first = new - again if again else new  # pinned by nobody yet: must be cached
            cached = self._cached
            size = len(cached)
            cached -= first
            if len(cached) != size - len(first):
                back = first.intersection(self._parent)  # resident and unpinned: they were cached
                cached |= back
                raise PoolInvariantError(f"{self.tier.value}: cannot pin page {min(first - back):#x}: not resident")
            if pins is None:
                self._owner_pins[owner] = pages.copy()  # (`pages` itself is kept with the pin touches)
            else:
                pins |= new
            if again:
                shared = self._shared
                for page in again:
                    shared[page] = shared.get(page, 1) + 1
            self._pinned |= first
        # the pin's touch, kept with the owner's pins until they are dropped (`TierPool.unpin_all`)
        self._pin_touches.setdefault(owner, []).append((now, pages))

    def begin_write_all(self, owner: Owner, pages: Iterable[PageHash]) -> None:
        """`begin_write` each page of `pages` (distinct), at once."""
        pages = list(pages)
        run = dict.fromkeys(pages, owner)
        if len(run) != len(pages) or not (self._parent.keys().isdisjoint(run) and self._writing.keys().isdisjoint(run)):
            raise PoolInvariantError(f"{self.tier.value}: a page of the run is already resident or being written")
        if len(run) > self._free:
            self._no_free(len(run), f"writing {len(run)} page(s)")
        self._free -= len(run)
        self._writing.update(run)

    def writes_all(self, owner: Owner, pages: Iterable[PageHash]) -> bool:
        """Whether `owner` is writing every page of `pages`."""
        get = self._writing.get
        return all(get(page) == owner for page in pages)

    def insert_all(
        self, items: dict[PageHash, PageHash | None], now: float, *, owner: Owner | None = None, slots: str = "free"
    ) -> None:
        """`insert` every page of `items` (page -> parent) at `now`, none of them resident or written by
        another owner. `slots`: "free" (free slots), "reserved" (`owner`'s reservation) or "writing"
        (`owner`'s writing slots for these very pages). Pinned by `owner` if given, else cached."""
        if not items:
            return
        if not self._parent.keys().isdisjoint(items):
            raise PoolInvariantError(f"{self.tier.value}: a page of the run is already resident")
        if slots != "writing" and not self._writing.keys().isdisjoint(items):
            raise PoolInvariantError(f"{self.tier.value}: a page of the run is being written")
        if slots == "writing":
            writing = self._writing
            for page in items:
                if writing.get(page) != owner:
                    raise PoolInvariantError(f"{self.tier.value}: {owner} lands page {page:#x} it was not writing")
        self.insert_run(items, now, owner=owner, slots=slots)

    def insert_run(
        self, items: dict[PageHash, PageHash | None], now: float, *, owner: Owner | None = None, slots: str = "free",
        depths: RunDepths = RunDepths.LOOKUP,
    ) -> Ids | None:  # fmt: skip
        """`insert_all` without the page checks, which the caller made: no page of `items` is resident, none
        is being written by another owner, and with slots "writing" `owner` writes every one of them.
        `depths`: what the caller knows of the pages' depths (`RunDepths`). None (the id tables answer the
        pages' ids: `IdTierPool.insert_run`)."""
        k = len(items)
        if not k:
            return None
        if slots == "reserved":
            held = self._reserved.get(owner, 0)  # type: ignore[arg-type]  # owner is set whenever slots are reserved
            if held < k:
                raise PoolInvariantError(f"{self.tier.value}: {owner} stores {k} page(s) with {held} reserved slot(s)")
            if held > k:
                self._reserved[owner] = held - k  # type: ignore[index]  # owner is set whenever slots are reserved
            else:
                del self._reserved[owner]  # type: ignore[arg-type]  # owner is set whenever slots are reserved
            self._n_reserved -= k
        elif slots == "writing":
            writing = self._writing
            for page in items:
                del writing[page]
        else:
            if k > self._free:
                self._no_free(k, f"storing {k} page(s)")
            self._free -= k
        self._parent.update(items)
        if depths is not RunDepths.ALL_KNOWN:
            depth = self._depth
            new = new_depths(items, depth, none_known=depths is RunDepths.NONE_KNOWN)
            if new:
                depth.update(new)
        self._access.update(dict.fromkeys(items, now))
        if now > self._max_access:
            self._max_access = now
        if owner is not None:
            pins = self._owner_pins.get(owner)
            if pins is None:
                self._owner_pins[owner] = set(items)
            else:
                pins.update(items)
            self._pinned.update(items)
        else:
            pages = set(items)
            self._cached |= pages
            self._order.enter_all(pages, now)
        return None

    def parents(self) -> Mapping[PageHash, PageHash | None]:
        """A live, read-only view of the resident pages' parents (do not keep)."""
        return self._parent

    def room_for_run(
        self, pages: set[PageHash], now: float, parents: Mapping[PageHash, PageHash | None] | None = None,
        missing: set[PageHash] | None = None,
    ) -> tuple[set[PageHash], list[PageHash]] | None:  # fmt: skip
        """Plan writing `pages` into this tier at `now` one page at a time, each page the tier lacks taking a
        free slot or else evicting the first cached page in eviction order (as `KvPool._into_l2` does): the
        pages it lacks, and the victims in order, taken out of the eviction order (the caller removes them and
        inserts the lacking pages). None, changing nothing, where the run cannot be done at once: a lacking
        page is being written, the cached pages run out, or a victim is a page of `pages` or does not come
        before every page of `pages` once accessed at `now` (then evicting the first victims up front chooses
        the later ones differently from page by page, which can evict a page the run inserted or touched).
        `parents` (page -> parent, in chain order) gives the depths of pages neither tier holds yet; `missing`:
        the pages of `pages` this tier lacks, where the caller knows them."""
        if missing is None:
            missing = pages.difference(self._parent)
        if self._writing and not self._writing.keys().isdisjoint(missing):
            return None
        need = len(missing) - self._free
        if need <= 0:
            return missing, []
        floor = self._order.floor(pages, now, self._prospective_depths(pages, parents))
        if floor is None:
            return None
        victims = self._order.victims(need, ())
        late = len(victims) < need or (self._order.key(victims[-1]), self._order.rank(victims[-1])) >= floor
        if late or not pages.isdisjoint(victims):
            self._order.enter_each(victims)  # they stay cached: put them back
            return None
        return missing, victims

    def plan_write_back(self, pages: list[PageHash], now: float, ids: Ids | None = None) -> WriteBackPlan | None:
        """`writeback.plan_write_back` for the run `pages` (distinct, in order, held by the peer tier) written
        back into this tier at `now` (the pages it takes out of the order and does not evict are the caller's to
        `enter_again`, as are all it took when the plan is not complete); None, changing nothing, where a page
        this tier lacks is being written or the policy's keys are not coarse. `ids`: the id tables' (these tables
        have none)."""
        order = self._order
        coarse = order.coarse
        if coarse is None:
            return None
        parent, writing = self._parent, self._writing
        held = [page in parent for page in pages]
        if writing and any(page in writing for page, h in zip(pages, held) if not h):
            return None
        counts = order._counts if order.keyed_by_count else {}
        access = self._access
        rank = order.rank
        counted = [page in counts for page in pages]
        ranks = [rank(page) for page in pages]
        written: list[Place] = [(coarse(c, now), r) for c, r in zip(counted, ranks)]
        places: list[Place] = [  # (a held page keeps a later last access)
            (coarse(c, max(access[page], now)), r) if h else w
            for page, h, c, r, w in zip(pages, held, counted, ranks, written)
        ]
        cached = self._cached
        key = order.key

        def take(k: int) -> list[tuple[PageHash, Place]]:
            return [(page, (key(page), rank(page))) for page in order.victims(k, ())]

        return plan_write_back(pages, held, [page in cached for page in pages], places, written, self._free, take)

    def enter_again(self, pages: list[PageHash]) -> None:
        """Enter those of `pages` (taken out of the order by `plan_write_back`) that are cached under their keys."""
        cached = self._cached
        self._order.enter_each([page for page in pages if page in cached])

    def _prospective_depths(
        self, pages: set[PageHash], parents: Mapping[PageHash, PageHash | None] | None
    ) -> dict[PageHash, int]:
        """The depths the pages of `pages` that have none will get when stored in the order of `parents`."""
        depth = self._depth
        if depth.keys() >= pages:
            return {}
        if parents is None:
            raise PoolInvariantError(f"{self.tier.value}: a run's new pages need their parents for their depths")
        return new_depths(parents, depth)

    def remove_all(self, pages: Iterable[PageHash]) -> None:
        """`remove` every page of `pages` (all cached)."""
        gone = set(pages)
        if not gone.issubset(self._cached):
            raise PoolInvariantError(f"{self.tier.value}: refusing to evict pages that are pinned or not resident")
        self.remove_victims(list(gone))

    def remove_victims(self, victims: list[PageHash], *, peer_holds: bool = False, ids: Ids | None = None) -> None:
        """`remove_all` of `victims` just taken from this tier's eviction order (`victims`: distinct, cached),
        without checking that. `peer_holds`: the peer tier holds every one of them (their depths stay). `ids`:
        the id tables' (`IdTierPool.remove_victims`); these tables have none."""
        parent, access, depth = self._parent, self._access, self._depth
        if peer_holds:
            for page in victims:
                del parent[page]
                del access[page]
        elif self._peer is None:
            for page in victims:
                del parent[page]
                del access[page]
                del depth[page]
        else:
            peer = self._peer._parent
            for page in victims:
                del parent[page]
                del access[page]
                if page not in peer:
                    del depth[page]
        self._cached.difference_update(victims)
        self._free += len(victims)
