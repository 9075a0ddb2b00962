"""`TierPool`'s interface over the id tier of `idpages`: what `KvPool` runs on by default (`PageTables.IDS`), so
today's prefill and decode schedulers use `IdTier` before any caller keeps ids; `TierPool` (`PageTables.SETS`,
or `EVOLVING_INFRA_PAGE_TABLES=sets`) stays as its oracle and for policies without coarse keys.

What each table becomes: residency, last access, pinned or cached state, pin counts, pins per owner and the
eviction order live in an `IdTier` over the node's `PageIds` (shared by both tiers: the depth and the parent of a
page are its id's; a page's parent is a property of its content, the same in both tiers); the set of resident
pages is a view over the tier's state array (`ResidentPages`: one id probe per page tested, bulk tests over
arrays), so no table is kept per resident page and hash. Hashes are resolved to ids per call (one dict probe per
page); eviction and pins run over id arrays.

Exactness: every operation leaves the state `TierPool`'s would (resident pages, parents, last accesses, pins,
free and in-use slots, depths) and chooses the same victims in the same order; pin touches are applied at once
rather than kept per owner (`TierPool` keeps them lazily; its `last_access` is the same value). Checked by a
hypothesis state machine against `TierPool` (tests/node_agent/test_engine_idpool.py) and by the simulator's
reference runs, identical with either tables (docs/benchmarks.md).

Scope: the built-in eviction policies (coarse keys); `KvPool` keeps `TierPool` for any other policy.

Boundary: page accounting of one tier, as `tier`; the KV events and write-through are `kvpool`'s.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Iterator, KeysView, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import compress
from enum import Enum

import numpy as np
import numpy.typing as npt

from evolving_infra.core.eviction import HostEvictionPolicy, HostPage
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.evictindex import coarse_key
from evolving_infra.node_agent.engine.idpages import ABSENT, CACHED, PINNED, Ids, IdTier, PageIds
from evolving_infra.node_agent.engine.tier import TierGauges
from evolving_infra.node_agent.engine.idorder import rank
from evolving_infra.node_agent.engine.tierruns import Owner, RunDepths
from evolving_infra.node_agent.engine.writeback import Place, WriteBackPlan, plan_write_back

__all__ = ["IdDepths", "IdTierPool", "PageTables", "ResidentPages", "page_tables"]

ENV = "EVOLVING_INFRA_PAGE_TABLES"
_NO_IDS: Ids = np.zeros(0, dtype=np.int64)


class PageTables(Enum):
    """How a node's pool keeps its page tables."""

    SETS = "sets"  # `tier.TierPool`: dicts and sets keyed by page hash
    IDS = "ids"  # `IdTierPool`: per-id arrays (`idpages`) under the same interface


def page_tables(policies: Iterable[HostEvictionPolicy]) -> PageTables:
    """The tables a new pool uses: `EVOLVING_INFRA_PAGE_TABLES` (ids, the default, or sets); ids only where
    every policy has coarse keys (else sets)."""
    raw = os.environ.get(ENV, PageTables.IDS.value).strip().lower()
    try:
        chosen = PageTables(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be one of {[t.value for t in PageTables]}, got {raw!r}") from None
    if chosen is PageTables.IDS and any(coarse_key(p) is None for p in policies):
        return PageTables.SETS
    return chosen


class IdDepths(Mapping[PageHash, int]):
    """The depth of every page either tier holds, read from the node's `PageIds` (what `KvPool` reads as its
    depth table)."""

    def __init__(self, ids: PageIds) -> None:
        self._ids = ids

    def __getitem__(self, page: PageHash) -> int:
        i = self._ids.get(page)
        if i is None:
            raise KeyError(page)
        return int(self._ids.depth[i])

    def __iter__(self) -> Iterator[PageHash]:
        return iter(self._ids._id)

    def __len__(self) -> int:
        return len(self._ids)

    def keys(self) -> KeysView[PageHash]:
        return self._ids._id.keys()


class ResidentPages(AbstractSet[PageHash]):
    """The pages one id tier holds, as a read-only set view over its state array (what `resident_set` gives where
    `TierPool` gives its dict's keys): a membership test is one id probe; `isdisjoint`, `&` and `issuperset` with
    a collection resolve it once and test the ids together; other set operations (`|`, `-`, comparisons) give
    built-in sets."""

    __slots__ = ("_pool",)

    def __init__(self, pool: IdTierPool) -> None:
        self._pool = pool

    def __contains__(self, page: object) -> bool:
        return self._pool.contains(page)  # type: ignore[arg-type]  # (any hashable: not resident if no page)

    def __iter__(self) -> Iterator[PageHash]:
        return iter(self._pool._hashes(self._pool._held_ids()))

    def __len__(self) -> int:
        return self._pool.t.resident

    @classmethod
    def _from_iterable(cls, it: Iterable[PageHash]) -> set[PageHash]:  # type: ignore[override]
        return set(it)

    def held(self, pages: list[PageHash]) -> npt.NDArray[np.bool_]:
        """Per page of `pages`, whether the tier holds it (one lookup of them all)."""
        return self._pool.t.holds(self._pool.ids.lookup(pages))

    def isdisjoint(self, other: Iterable[object]) -> bool:
        pages = list(other)
        return not pages or not self.held(pages).any()  # type: ignore[arg-type]  # (pages of other types: none held)

    def issuperset(self, other: Iterable[object]) -> bool:
        pages = list(other)
        return not pages or bool(self.held(pages).all())  # type: ignore[arg-type]

    def __and__(self, other: Iterable[object]) -> set[PageHash]:
        pages = list(other)
        return set(compress(pages, self.held(pages).tolist())) if pages else set()  # type: ignore[arg-type]

    __rand__ = __and__


class _Parents(Mapping[PageHash, "PageHash | None"]):
    """The parent of each page one id tier holds (`parents`), read from the node's `PageIds`."""

    __slots__ = ("_pool",)

    def __init__(self, pool: IdTierPool) -> None:
        self._pool = pool

    def __getitem__(self, page: PageHash) -> PageHash | None:
        return self._pool.parent(page)

    def __iter__(self) -> Iterator[PageHash]:
        return iter(self._pool._resident)

    def __len__(self) -> int:
        return len(self._pool._resident)


class IdTierPool:
    """One tier with `TierPool`'s methods, kept in an `IdTier` (see the module docstring)."""

    def __init__(self, tier: Tier, capacity: int, policy: HostEvictionPolicy, ids: PageIds) -> None:
        if capacity < 1:
            raise ValueError(f"{tier.value} tier needs a capacity of at least 1 page, got {capacity}")
        self.tier = tier
        self.capacity = capacity
        self.policy = policy
        self.ids = ids
        self.t = IdTier(tier.value, capacity, policy, ids)
        self._resident = ResidentPages(self)
        self._peer: IdTierPool | None = None
        self._gauges = TierGauges(capacity, capacity, 0, 0, 0)

    # --- ids -----------------------------------------------------------------------------------------
    def _ids(self, pages: Collection[PageHash]) -> Ids:
        """Ids of `pages`, every one resident here (or held by the peer)."""
        return self.ids.ids(pages)

    def _known(self, pages: Iterable[PageHash]) -> Ids:
        """Distinct ids of those of `pages` some tier holds."""
        get = self.ids._id.get
        found = {i for page in pages if (i := get(page)) is not None}
        return np.fromiter(found, dtype=np.int64, count=len(found)) if found else _NO_IDS

    def _hashes(self, ids: Ids) -> list[PageHash]:
        return self.ids.hash_of(ids)

    def _resident_ids(self, pages: Collection[PageHash]) -> Ids:
        """Ids of `pages` (repeats kept), every one resident here."""
        ids = self.ids.lookup(pages)
        held = self.t.holds(ids)
        if len(ids) and not held.all():
            missing = min(compress(pages, (~held).tolist()))
            raise PoolInvariantError(f"{self.tier.value}: cannot pin page {missing:#x}: not resident")
        return ids

    # --- queries -------------------------------------------------------------------------------------
    def _resident_id(self, page: PageHash) -> int | None:
        """The id of `page` if this tier holds it, else None."""
        i = self.ids._id.get(page)
        return i if i is not None and self.t.holds_id(i) else None

    def contains(self, page: PageHash) -> bool:
        return self._resident_id(page) is not None

    def is_writing(self, page: PageHash) -> bool:
        return page in self.t._writing

    def writer(self, page: PageHash) -> Owner | None:
        return self.t._writing.get(page)

    def parent(self, page: PageHash) -> PageHash | None:
        i = self._resident_id(page)
        if i is None:
            raise KeyError(page)
        return self.ids.parent_of(i)

    def pins(self, page: PageHash) -> int:
        i = self._resident_id(page)
        return 0 if i is None else int(self.t.pins[i])

    def _held_ids(self, state: int | None = None) -> Ids:
        """The ids resident here (in `state`, PINNED or CACHED, where given), ascending."""
        s = self.t.state
        return np.flatnonzero(s != ABSENT if state is None else s == state)

    def resident(self) -> frozenset[PageHash]:
        return frozenset(self._hashes(self._held_ids()))

    def resident_set(self) -> ResidentPages:
        return self._resident

    def writing_set(self) -> KeysView[PageHash]:
        return self.t._writing.keys()

    def pinned_pages(self) -> frozenset[PageHash]:
        return frozenset(self._hashes(self._held_ids(PINNED)))

    def pinned_by(self, owner: Owner) -> frozenset[PageHash]:
        ids = self.t.pinned_ids(owner)
        return frozenset() if ids is None else frozenset(self._hashes(ids))

    def is_pinned_by(self, owner: Owner, page: PageHash) -> bool:
        ids = self.t.pinned_ids(owner)
        i = self.ids.get(page)
        return ids is not None and i is not None and bool((ids == i).any())

    def reserved_by(self, owner: Owner) -> int:
        return self.t._reserved.get(owner, 0)

    def owners(self) -> set[Owner]:
        return self.t.owners()

    @property
    def free(self) -> int:
        return self.t.free

    def _cached_among(self, pages: Iterable[PageHash]) -> int:
        ids = self._known(pages)
        if not len(ids):
            return 0
        return int((self.t.state[ids] == CACHED).sum())

    def evictable(self, exclude: Iterable[PageHash] = ()) -> int:
        return self.t.cached - self._cached_among(exclude) if exclude else self.t.cached

    def room(self, exclude: Iterable[PageHash] = ()) -> int:
        return self.free + self.evictable(exclude)

    def lacks_room(self, n: int, exclude: Collection[PageHash] = ()) -> bool:
        free = self.free
        if n <= free:
            return False
        cached = self.t.cached
        if free + cached < n:
            return True
        if free + cached - len(exclude) >= n:
            return False
        return free + cached - self._cached_among(exclude) < n

    def candidates(self, counts: Mapping[PageHash, int], exclude: frozenset[PageHash]) -> Iterator[HostPage]:
        cached = self._held_ids(CACHED)
        for page, when in zip(self._hashes(cached), self.t.access[cached].tolist()):
            if page not in exclude:
                yield HostPage(page, counts.get(page, 0), when)

    @property
    def writing(self) -> int:
        return len(self.t._writing)

    def gauges(self) -> TierGauges:
        t = self.t
        cached, free, last = t.cached, t.free, self._gauges
        in_use = t.in_use
        pinned = t.resident - cached
        if last.free != free or last.cached != cached or last.pinned != pinned or last.in_use != in_use:
            last = self._gauges = TierGauges(self.capacity, free, cached, pinned, in_use)
        return last

    # --- eviction order ------------------------------------------------------------------------------
    def rekey(self, page: PageHash) -> None:
        i = self.ids.get(page)
        if i is not None and self.t.order.by_count and self.t.state[i] == CACHED:
            self.t.order.enter(np.array([i], dtype=np.int64))

    @property
    def keyed_by_count(self) -> bool:
        return self.t.order.by_count

    def victims(self, n: int, exclude: frozenset[PageHash] = frozenset()) -> list[PageHash]:
        return self.victims_and_ids(n, exclude)[0]

    def victims_and_ids(self, n: int, exclude: frozenset[PageHash] = frozenset()) -> tuple[list[PageHash], Ids]:
        """`victims`, with their ids in the same order."""
        ids = self.t.order.victims(n, self._known(exclude) if exclude else None)
        return self._hashes(ids), ids

    # --- access and pins -----------------------------------------------------------------------------
    def touch(self, page: PageHash, now: float) -> None:
        i = self._resident_id(page)
        if i is not None:
            self.t.touch(np.array([i], dtype=np.int64), now)

    def touch_all(self, pages: set[PageHash], now: float) -> None:
        if pages:
            self.t.touch(self._ids(pages), now)

    def pin(self, owner: Owner, page: PageHash, now: float) -> None:
        self.t.pin(owner, self._resident_ids([page]), now)

    def pin_all(self, owner: Owner, pages: Iterable[PageHash], now: float) -> None:
        if not isinstance(pages, Collection):
            pages = list(pages)
        if pages:  # (repeats are fine: `IdTier.pin` pins distinct ids)
            self.t.pin(owner, self._resident_ids(pages), now)

    def unpin(self, owner: Owner, page: PageHash) -> None:
        i = self.ids.get(page)
        if i is None:
            raise PoolInvariantError(f"{self.tier.value}: {owner} does not pin page {page:#x}")
        self.t.unpin(owner, i)

    def unpin_all(self, owner: Owner, now: float) -> None:
        self.t.unpin_all(owner, now)

    def last_access(self, page: PageHash) -> float:
        return float(self.t.access[self.ids._id[page]])

    def last_accesses(self) -> dict[PageHash, float]:
        held = self._held_ids()
        return dict(zip(self._hashes(held), self.t.access[held].tolist()))

    # --- in-use slots --------------------------------------------------------------------------------
    def reserve(self, owner: Owner, n: int) -> None:
        self.t.reserve(owner, n)

    def unreserve(self, owner: Owner, n: int | None = None) -> int:
        return self.t.unreserve(owner, n)

    def begin_write(self, owner: Owner, page: PageHash) -> None:
        self.t.begin_write(owner, page)

    def begin_write_all(self, owner: Owner, pages: Iterable[PageHash]) -> None:
        pages = list(pages)
        run = dict.fromkeys(pages, owner)
        writing = self.t._writing
        if len(run) != len(pages) or not (self._resident.isdisjoint(pages) and writing.keys().isdisjoint(run)):
            raise PoolInvariantError(f"{self.tier.value}: a page of the run is already resident or being written")
        if len(run) > self.free:
            raise PoolInvariantError(
                f"{self.tier.value}: writing {len(run)} page(s) needs {len(run)} free page(s), only {self.free} free"
            )
        writing.update(run)

    def writes_all(self, owner: Owner, pages: Iterable[PageHash]) -> bool:
        get = self.t._writing.get
        return all(get(page) == owner for page in pages)

    def writes_of(self, owner: Owner) -> list[PageHash]:
        return [p for p, o in self.t._writing.items() if o == owner]

    def cancel_write(self, page: PageHash) -> None:
        self.t.cancel_write(page)

    # --- residency -----------------------------------------------------------------------------------
    def insert(
        self, page: PageHash, parent: PageHash | None, now: float, *, source: Owner | None = None,
        pin_owner: Owner | None = None,
    ) -> None:  # fmt: skip
        """`TierPool.insert`: the slot from `source`'s writing slot for `page`, else `source`'s reservation,
        else (source None) a free slot; pinned by `pin_owner` if given."""
        if self.contains(page):
            raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is already resident")
        t = self.t
        writer = t._writing.get(page)
        if source is not None and writer == source:
            slots = "writing"
        elif source is not None:
            if t._reserved.get(source, 0) < 1:
                raise PoolInvariantError(f"{self.tier.value}: {source} stores page {page:#x} without a reserved slot")
            if writer is not None:
                raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is being written by another owner")
            slots = "reserved"
        else:
            if writer is not None:
                raise PoolInvariantError(f"{self.tier.value}: page {page:#x} is being written by another owner")
            if t.free < 1:
                raise PoolInvariantError(f"{self.tier.value}: storing page {page:#x} needs 1 free page(s), none free")
            slots = "free"
        self._place({page: parent}, now, source, slots, pin_owner)

    def _place(self, items: Mapping[PageHash, PageHash | None], now: float, source: Owner | None, slots: str,
               pin_owner: Owner | None, known: Ids | None = None) -> Ids:  # fmt: skip
        """Make `items` resident (checks made by the caller): slots taken from `source` per `slots`; their ids,
        in order. `known`: their current ids (`PageIds.lookup`), where the caller has them."""
        t = self.t
        if pin_owner is None or pin_owner == source or slots == "free":
            owner = pin_owner if slots == "free" else source
            ids = t.insert_unchecked(items, now, owner, slots=slots, pin=pin_owner is not None, ids=known)
        else:  # slots of one owner, pinned by another: take the slots as the source's, then move the pins
            ids = t.insert_unchecked(items, now, source, slots=slots, pin=False, ids=known)
            t.pin(pin_owner, ids, now)
        return ids

    def insert_all(
        self, items: dict[PageHash, PageHash | None], now: float, *, owner: Owner | None = None, slots: str = "free"
    ) -> None:
        if not items:
            return
        if not self._resident.isdisjoint(items):
            raise PoolInvariantError(f"{self.tier.value}: a page of the run is already resident")
        writing = self.t._writing
        if slots != "writing" and not writing.keys().isdisjoint(items):
            raise PoolInvariantError(f"{self.tier.value}: a page of the run is being written")
        if slots == "writing" and any(writing.get(page) != owner for page in items):
            raise PoolInvariantError(f"{self.tier.value}: {owner} lands a page it was not writing")
        self.insert_run(items, now, owner=owner, slots=slots)

    def insert_run(
        self, items: Mapping[PageHash, PageHash | None], now: float, *, owner: Owner | None = None, slots: str = "free",
        depths: RunDepths = RunDepths.LOOKUP, known: Ids | None = None,
    ) -> Ids:  # fmt: skip
        """`insert_all` without the page checks (`TierRuns.insert_run`); `depths` is not needed here (the
        depths are the ids'). The pages' ids, in order. `known`: their current ids (`PageIds.lookup`), where the
        caller has them."""
        k = len(items)
        if not k:
            return _NO_IDS
        t = self.t
        if slots == "reserved" and t._reserved.get(owner, 0) < k:  # type: ignore[arg-type]
            held = t._reserved.get(owner, 0)  # type: ignore[arg-type]
            raise PoolInvariantError(f"{self.tier.value}: {owner} stores {k} page(s) with {held} reserved slot(s)")
        if slots == "free" and k > t.free:
            raise PoolInvariantError(f"{self.tier.value}: storing {k} page(s) needs {k} free page(s), {t.free} free")
        return self._place(items, now, owner, slots, owner, known)

    def parents(self) -> Mapping[PageHash, PageHash | None]:
        return _Parents(self)

    def room_for_run(
        self, pages: set[PageHash], now: float, parents: Mapping[PageHash, PageHash | None] | None = None,
        missing: set[PageHash] | None = None,
    ) -> tuple[set[PageHash], list[PageHash]] | None:  # fmt: skip
        """`TierRuns.room_for_run`; `missing`: the pages of `pages` this tier lacks, where the caller knows them."""
        if missing is None:
            listed = list(pages)
            missing = set(compress(listed, (~self._resident.held(listed)).tolist()))
        plan = self.t.room_for_run(pages, now, parents, missing)  # type: ignore[arg-type]  # read only
        if plan is None:
            return None
        return plan[0], self._hashes(plan[1])

    def room_for_ids(
        self, pages: Sequence[PageHash], parent: PageHash | None, ids: Ids, missing: set[PageHash], now: float
    ) -> tuple[set[PageHash], list[PageHash]] | None:
        """`room_for_run` of the run `pages` by the pages' current ids (`IdTier.room_for_ids`: a chain whose
        first page's parent is `parent` where some page has no id); `missing`: the pages of the run this tier
        lacks."""
        plan = self.t.room_for_ids(pages, parent, ids, missing, now)
        if plan is None:
            return None
        return plan[0], self._hashes(plan[1])

    def plan_write_back(self, pages: list[PageHash], now: float, ids: Ids | None = None) -> WriteBackPlan | None:
        """`TierRuns.plan_write_back` over ids; `ids`: the pages' current ids, where the caller has them (the
        peer tier holds every page, so each has one)."""
        t = self.t
        if ids is None:
            ids = self._ids(pages)
        held = t.holds(ids)
        if t._writing and not t._writing.keys().isdisjoint(compress(pages, (~held).tolist())):
            return None
        order = t.order
        key_of = order.key_of
        table = self.ids
        counted = table.counted[ids].tolist() if order.by_count else [False] * len(pages)
        access = t.access[ids]  # (a held page keeps a later last access; written pages get `now`)
        when = np.where(held & (access > now), access, now).tolist()
        ranks = [rank(page, d) for page, d in zip(pages, table.depth[ids].tolist())]
        written: list[Place] = [(key_of(c, now), r) for c, r in zip(counted, ranks)]
        places: list[Place] = [(key_of(c, w), r) for c, w, r in zip(counted, when, ranks)]
        place, hashes = order.place, self._hashes

        def take(k: int) -> list[tuple[PageHash, Place]]:
            got = order.victims(k)
            return list(zip(hashes(got), map(place, got.tolist())))

        cached = (t.state[ids] == CACHED).tolist()
        return plan_write_back(pages, held.tolist(), cached, places, written, t.free, take)

    def enter_again(self, pages: list[PageHash]) -> None:
        """`TierRuns.enter_again`."""
        ids = self._known(pages)
        if len(ids):
            t = self.t
            ids = ids[t.holds(ids)]
            t.order.enter(ids[t.state[ids] == CACHED])

    def remove(self, page: PageHash) -> None:
        i = self._resident_id(page)
        if i is None:
            raise PoolInvariantError(f"{self.tier.value}: cannot remove page {page:#x}: not resident")
        if self.t.state[i] != CACHED:
            raise PoolInvariantError(
                f"{self.tier.value}: refusing to evict pinned page {page:#x} ({self.pins(page)} pins)"
            )
        self.remove_victims([page])

    def remove_all(self, pages: Iterable[PageHash]) -> None:
        gone = set(pages)
        ids = self._known(gone)
        if len(ids) != len(gone) or not self.t.holds(ids).all() or (self.t.state[ids] != CACHED).any():
            raise PoolInvariantError(f"{self.tier.value}: refusing to evict pages that are pinned or not resident")
        self.remove_victims(list(gone))

    def remove_victims(self, victims: list[PageHash], *, peer_holds: bool = False, ids: Ids | None = None) -> None:
        """Remove cached `victims` (distinct; taken from the order, or checked by the caller); `ids`: theirs, in
        the same order, where the caller has them."""
        if ids is None:
            ids = self._ids(victims)
        self.t.remove(ids)

    # --- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        t = self.t
        t.check()
        name = self.tier.value
        if t.free < 0:
            raise PoolInvariantError(f"{name}: free is negative ({t.free})")
        held = self._held_ids()
        if len(held) != t.resident or (self.ids.holders[held] < 1).any():
            raise PoolInvariantError(f"{name}: the resident pages differ from the ids held")
        if len(held) and self.ids.lookup(self._hashes(held)).tolist() != held.tolist():
            raise PoolInvariantError(f"{name}: resident ids whose pages resolve to other ids")
        if not self._resident.isdisjoint(t._writing):
            raise PoolInvariantError(f"{name}: pages both resident and being written")
        counted = np.zeros(len(t.state), dtype=np.int64)
        for owner in list(t._owner):
            pinned = t.pinned_ids(owner)
            assert pinned is not None
            if (t.state[pinned] != PINNED).any():
                raise PoolInvariantError(f"{name}: {owner} pins a page that is not pinned")
            counted[pinned] += 1
        if (counted != t.pins[: len(counted)]).any() or ((t.pins > 0) != (t.state == PINNED)).any():
            raise PoolInvariantError(f"{name}: pin counts disagree with the owners' pins")
