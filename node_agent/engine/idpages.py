"""One tier's page accounting over dense page ids and numpy arrays, with the eviction order of `evictindex` kept
as arrays of ids per key; the engine uses it through `idpool` (the default tables; next steps in
docs/benchmarks.md).

Why (docs/benchmarks.md, "Where the per-page cost comes from"): every table operation of `tier.TierPool` on a
page is a hash-table probe at cache-miss cost (~100-250 ns), several per page per request; an assignment into
an array indexed by a dense id costs a few ns. Here a node interns each page hash to an id while either tier
holds the page (`PageIds`); a tier keeps per id its state (absent, pinned, cached), last access and pin count
in arrays (`IdTier`); the eviction order (`IdOrder`) keeps, per key, the id arrays entered under it with the
ids' generations, and orders a bucket only when victims reach it: the live ids (cached, with this key, same
generation) in ascending (-depth, hash), the order of `evictindex.EvictionOrder` for the built-in policies.

Scope of this step: the built-in policies' coarse keys, two tiers over one `PageIds`, pins by owners,
touches, count flips, reservations, writes, inserts from free, reserved or writing slots, evictions, and the
write plan of a run (`room_for_run` with the order's `floor`); checked against `TierPool` by a hypothesis
state machine (tests/node_agent/test_engine_idpages.py); `idpool.IdTierPool` puts `TierPool`'s interface over
it, so today's `KvPool` runs on it. Not here yet: policies without coarse keys, and callers that keep a
request's ids instead of its hashes.

Layout: the id table in `pageids`, the order in `idorder`, the tier (`IdTier`) and `held_prefix` here.

Boundary: bookkeeping of one tier over ids; hashes are resolved by `PageIds`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from evolving_infra.core.eviction import HostEvictionPolicy
from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.idorder import IdOrder, Key, rank
from evolving_infra.node_agent.engine.pageids import ABSENT, CACHED, PINNED, Ids, PageIds, PageState, distinct, stretches

__all__ = [
    "ABSENT", "CACHED", "PINNED", "IdOrder", "IdTier", "Ids", "Key", "PageIds", "PageState", "distinct", "held_prefix",
    "rank",
]  # fmt: skip (the id table and the order live in `pageids` and `idorder`; re-exported here)


def held_prefix(*held: npt.NDArray[np.bool_]) -> int:
    """How many pages from the start of a prompt some tier holds (`held`: per tier, per page, whether it
    is resident there): the length of the reusable prefix, as the engine's admission walks find it."""
    if not held or not len(held[0]):
        return 0
    anywhere = np.logical_or.reduce(held) if len(held) > 1 else held[0]
    gaps = np.flatnonzero(~anywhere)
    return int(gaps[0]) if len(gaps) else len(anywhere)


class IdTier:
    """One tier's pages over ids: state, last access and pin count per id, pins per owner."""

    def __init__(self, name: str, capacity: int, policy: HostEvictionPolicy, ids: PageIds) -> None:
        self.name, self.capacity, self.pages = name, capacity, ids
        self.state = np.zeros(len(ids.hashes), dtype=np.int8)
        self.access = np.zeros(len(ids.hashes), dtype=np.float64)
        self.pins = np.zeros(len(ids.hashes), dtype=np.int32)
        self.resident = 0
        self.cached = 0
        self._owner: dict[str, list[Ids]] = {}  # per owner, chunks of the ids it pins (disjoint, distinct)
        self._writing: dict[PageHash, str] = {}  # pages being written (few) -> owner
        self._reserved: dict[str, int] = {}
        self._n_reserved = 0
        self.order = IdOrder(policy, ids, self)
        ids.tiers.append(self)

    def _fit(self) -> None:
        """The per-id arrays cover every id of the table (called by `PageIds._grow`, so no reader checks bounds)."""
        size = len(self.pages.hashes)
        if len(self.state) < size:
            for name in ("state", "access", "pins"):
                old = getattr(self, name)
                arr = np.zeros(size, dtype=old.dtype)
                arr[: len(old)] = old
                setattr(self, name, arr)

    @property
    def free(self) -> int:
        return self.capacity - self.resident - len(self._writing) - self._n_reserved

    def holds_id(self, i: int) -> bool:
        """Whether the page with id `i` (a current id) is resident here."""
        return bool(self.state[i] != ABSENT)

    def holds(self, ids: Ids) -> npt.NDArray[np.bool_]:
        """Per id of `ids` (-1: a page no tier holds), whether it is resident here. (The per-id arrays cover every
        id of the table, `PageIds._grow`; an id -1 reads the first id's state, and is then masked.)"""
        out: npt.NDArray[np.bool_] = np.take(self.state, ids, mode="clip") != ABSENT
        out &= ids >= 0
        return out

    @property
    def in_use(self) -> int:
        return len(self._writing) + self._n_reserved

    def evictable(self, exclude: Ids | None = None) -> int:
        """Cached pages, not counting those in `exclude` (distinct ids)."""
        if exclude is None or not len(exclude):
            return self.cached
        return self.cached - int((self.state[exclude] == CACHED).sum())

    def room(self, exclude: Ids | None = None) -> int:
        """Slots obtainable now: free ones plus evictable cached ones."""
        return self.free + self.evictable(exclude)

    # --- in-use slots: reservations and writes (few: kept by owner and by page hash) -------------------
    def reserve(self, owner: str, n: int) -> None:
        """Reserve `n` anonymous in-use slots for pages `owner` will write."""
        if n <= 0:
            return
        if n > self.free:
            raise PoolInvariantError(f"{self.name}: reserving for {owner} needs {n} free page(s), {self.free} free")
        self._reserved[owner] = self._reserved.get(owner, 0) + n
        self._n_reserved += n

    def unreserve(self, owner: str, n: int | None = None) -> int:
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
        return n

    def begin_write(self, owner: str, page: PageHash) -> None:
        """A free slot starts receiving `page` (known hash) for `owner`."""
        i = self.pages.get(page)
        if page in self._writing or (i is not None and self.state[i] != ABSENT):
            raise PoolInvariantError(f"{self.name}: page {page:#x} is already resident or being written")
        if self.free < 1:
            raise PoolInvariantError(f"{self.name}: writing page {page:#x} needs a free page, none free")
        self._writing[page] = owner

    def cancel_write(self, page: PageHash) -> None:
        del self._writing[page]

    def writer(self, page: PageHash) -> str | None:
        return self._writing.get(page)

    # --- residency -----------------------------------------------------------------------------------
    def insert(
        self, items: dict[PageHash, PageHash | None], now: float, owner: str | None = None, *, slots: str = "free",
        pin: bool = True,
    ) -> Ids:  # fmt: skip
        """Make the pages of `items` (page -> parent, in chain order; none resident here) resident at `now`,
        pinned by `owner` if given (and `pin`), else cached. `slots`: "free", "reserved" (`owner`'s reservation)
        or "writing" (the writing slots of these very pages, by `owner`)."""
        k = len(items)
        if slots == "writing":
            if any(self._writing.get(page) != owner for page in items):
                raise PoolInvariantError(f"{self.name}: {owner} lands a page it was not writing")
        elif not self._writing.keys().isdisjoint(items):
            raise PoolInvariantError(f"{self.name}: a page of the run is being written")
        if slots == "reserved" and self._reserved.get(owner, 0) < k:  # type: ignore[arg-type]
            raise PoolInvariantError(f"{self.name}: {owner} stores {k} page(s) without as many reserved slots")
        if slots == "free" and k > self.free:
            raise PoolInvariantError(f"{self.name}: storing {k} page(s) needs free slots, {self.free} free")
        known = [self.pages.get(page) for page in items]
        if any(i is not None and self.state[i] != ABSENT for i in known):
            raise PoolInvariantError(f"{self.name}: a page of the run is already resident")
        return self.insert_unchecked(items, now, owner, slots=slots, pin=pin)

    def insert_unchecked(
        self, items: Mapping[PageHash, PageHash | None], now: float, owner: str | None = None, *, slots: str = "free",
        pin: bool = True, ids: Ids | None = None,
    ) -> Ids:  # fmt: skip
        """`insert` without its checks, which the caller made (no page resident here or written by another
        owner; the slots exist). `ids`: the pages' current ids (`PageIds.lookup`), where the caller has them."""
        k = len(items)
        if k == 1:  # one page (a decode's store): scalar element writes, no index arrays
            ((page, parent),) = items.items()
            i = self.pages.intern(page, parent)
            ids = np.array((i,), dtype=np.int64)
        else:
            ids = self.pages.intern_run(items, ids)
        if slots == "writing":
            for page in items:
                del self._writing[page]
        elif slots == "reserved":
            self.unreserve(owner, k)  # type: ignore[arg-type]  # the slots become the pages'
        if k == 1:
            self.pages.holders[i] += 1
            self.access[i] = now
        else:
            self.pages.hold(ids)
            self.access[ids] = now
        self.resident += k
        if owner is None or not pin:
            if k == 1:
                self.state[i] = CACHED
            else:
                self.state[ids] = CACHED
            self.cached += k
            self.order.enter(ids)
        else:
            if k == 1:
                self.state[i], self.pins[i] = PINNED, 1
            else:
                self.state[ids] = PINNED
                self.pins[ids] = 1
            self._owner.setdefault(owner, []).append(ids)  # (new pages: none pinned by `owner` yet)
        return ids

    def remove(self, ids: Ids) -> None:
        """Evict cached `ids` (never pinned ones); their entries in the order turn stale."""
        if (self.state[ids] != CACHED).any():
            raise PoolInvariantError(f"{self.name}: refusing to evict pages that are pinned or not resident")
        self.state[ids] = ABSENT
        self.resident -= len(ids)
        self.cached -= len(ids)
        self.pages.drop(ids)

    def owners(self) -> set[str]:
        """Every owner holding a pin, a reserved slot or a writing slot here."""
        return set(self._owner) | set(self._reserved) | set(self._writing.values())

    def pinned_ids(self, owner: str) -> Ids | None:
        """The ids `owner` pins here (distinct, in no particular order), or None."""
        return self._held(owner)

    def _held(self, owner: str) -> Ids | None:
        chunks = self._owner.get(owner)
        if chunks is None:
            return None
        if len(chunks) > 1:
            chunks[:] = [np.concatenate(chunks)]
        return chunks[0]

    def unpin(self, owner: str, i: int) -> None:
        """Drop `owner`'s pin on id `i` without touching it."""
        held = self._held(owner)
        if held is None or not (held == i).any():
            raise PoolInvariantError(f"{self.name}: {owner} does not pin that page")
        rest = held[held != i]
        if len(rest):
            self._owner[owner] = [rest]
        else:
            del self._owner[owner]
        self.pins[i] -= 1
        if self.pins[i] == 0:
            self.state[i] = CACHED
            self.cached += 1
            self.order.enter(np.array([i], dtype=np.int64))

    def room_for_run(
        self, pages: set[PageHash], now: float, parents: dict[PageHash, PageHash | None] | None = None,
        missing: set[PageHash] | None = None,
    ) -> tuple[set[PageHash], Ids] | None:  # fmt: skip
        """`TierRuns.room_for_run` over ids: the pages of `pages` this tier lacks and the victims (taken out of
        the order; the caller removes them) that writing them one page at a time at `now` would evict, or None
        (changing nothing) where choosing the victims up front could differ from page by page. `missing`: the
        pages of `pages` this tier lacks, where the caller knows them."""
        if missing is None:
            ids = self.pages.lookup(list(pages))
            lacks = ~self.holds(ids)
            missing = {page for page, no in zip(pages, lacks.tolist()) if no}
        if self._writing and not self._writing.keys().isdisjoint(missing):
            return None
        need = len(missing) - self.free
        if need <= 0:
            return missing, np.zeros(0, dtype=np.int64)
        floor = self.order.floor(pages, now, self._prospective_depths(pages, parents))
        victims = self.order.victims(need)
        late = len(victims) < need or self.order.place(int(victims[-1])) >= floor
        if late or not pages.isdisjoint(self.pages.hashes[victims].tolist()):
            self.order.enter(victims)  # they stay cached: put them back
            return None
        return missing, victims

    def room_for_ids(
        self, pages: Sequence[PageHash], parent: PageHash | None, ids: Ids, missing: set[PageHash], now: float
    ) -> tuple[set[PageHash], Ids] | None:
        """`room_for_run` for the run `pages` whose current ids (`PageIds.lookup`, -1: no tier holds it) the
        caller has, a chain (each page the parent of the next, the first's `parent`) where some page has no id:
        the same plan, with the floor and the victims' membership read from the ids instead of the hashes.
        `missing`: the pages of the run this tier lacks."""
        if self._writing and not self._writing.keys().isdisjoint(missing):
            return None
        need = len(missing) - self.free
        if need <= 0:
            return missing, np.zeros(0, dtype=np.int64)
        known = ids >= 0
        depth = np.empty(len(ids), dtype=np.int64)
        depth[known] = self.pages.depth[ids[known]]
        if not known.all():  # the depths the new pages will get, stretch by stretch (as `PageIds.intern_run`)
            for lo, hi in stretches(np.flatnonzero(~known)):
                if lo:
                    at = int(depth[lo - 1]) + 1
                else:
                    j = self.pages.get(parent) if parent is not None else None
                    at = 0 if j is None else int(self.pages.depth[j]) + 1
                depth[lo:hi] = np.arange(at, at + hi - lo)
        floor = self.order.floor_of(pages, ids, depth, now)
        victims = self.order.victims(need)
        late = len(victims) < need or self.order.place(int(victims[-1])) >= floor
        if late or self.pages.any_in(victims, ids[known]):
            self.order.enter(victims)  # they stay cached: put them back
            return None
        return missing, victims

    def _prospective_depths(
        self, pages: set[PageHash], parents: dict[PageHash, PageHash | None] | None
    ) -> dict[PageHash, int]:
        """The depths the pages of `pages` no tier holds will get when stored in the order of `parents`."""
        lookup = self.pages.get
        if self.pages.holds_all(pages):
            return {}
        if parents is None:
            raise PoolInvariantError(f"{self.name}: a run's new pages need their parents for their depths")
        new: dict[PageHash, int] = {}
        for page, parent in parents.items():
            if lookup(page) is not None:
                continue
            if parent is None:
                new[page] = 0
            elif parent in new:
                new[page] = new[parent] + 1
            else:
                j = lookup(parent)
                new[page] = 0 if j is None else int(self.pages.depth[j]) + 1
        return new

    def touch(self, ids: Ids, now: float) -> None:
        """Touch resident `ids` at `now` (a later last access is kept); cached ones move in the order."""
        moved = ids[self.access[ids] < now]
        self.access[moved] = now
        cached = moved[self.state[moved] == CACHED]
        self.order.enter(cached)

    def pin(self, owner: str, ids: Ids, now: float) -> None:
        """`owner` pins resident `ids` (once per owner) and touches them."""
        if (self.state[ids] == ABSENT).any():
            raise PoolInvariantError(f"{self.name}: cannot pin a page that is not resident")
        held = self._held(owner)
        new = distinct(ids) if held is None else np.setdiff1d(ids, held)
        self.cached -= int((self.state[new] == CACHED).sum())
        self.state[new] = PINNED
        self.pins[new] += 1
        if held is None:
            self._owner[owner] = [new]
        elif len(new):
            self._owner[owner].append(new)
        self.touch(ids, now)

    def unpin_all(self, owner: str, now: float) -> None:
        """Drop every pin of `owner`; pages nobody else pins become cached, every one touched at `now`."""
        chunks = self._owner.pop(owner, None)
        if chunks is None:
            return
        ids = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        self.pins[ids] -= 1
        freed = ids[self.pins[ids] == 0]
        self.state[freed] = CACHED
        self.cached += len(freed)
        later = self.access[ids] < now
        self.access[ids[later]] = now
        # every freed page enters under its key now; the touched pinned ones need no entry
        self.order.enter(freed)

    def counted_flipped(self, ids: Ids) -> None:
        """The counted flag of `ids` (held by some tier) flipped: cached ones here move in the order."""
        if self.order.by_count and len(ids):
            self.order.enter(ids[self.state[ids] == CACHED])

    def check(self) -> None:
        """Raise `PoolInvariantError` unless every cached id has a live entry under its current key and the
        counters agree with the state array."""
        cached = np.flatnonzero(self.state == CACHED)
        resident = int((self.state != ABSENT).sum())
        if len(cached) != self.cached or resident != self.resident:
            raise PoolInvariantError(f"{self.name}: counters (cached {self.cached}, resident {self.resident}) disagree "
                                     f"with the state array (cached {len(cached)}, resident {resident})")  # fmt: skip
        entered: set[int] = set()
        for key, bucket in self.order._buckets.items():
            for ids, gens in bucket.chunks:
                entered.update(ids[self.order._live(key, ids, gens)].tolist())
        missing = set(cached.tolist()) - entered
        if missing:
            raise PoolInvariantError(f"{self.name}: cached ids {sorted(missing)} have no entry under their key")

    def evict(self, n: int, exclude: Ids | None = None) -> Ids:
        """Evict the first `n` cached pages in eviction order (fewer if there are fewer)."""
        ids = self.order.victims(n, exclude)
        self.remove(ids)
        return ids
