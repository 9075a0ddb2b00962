"""Dense page ids of one node (`PageIds`: hash <-> id while some tier holds the page, with depth, generation,
holders and the branch count per id; the counts of pages no tier holds in a small dict) and the per-tier page states (`PageState`), for the id-array tiers of
`idpages` and their eviction order (`idorder`); why ids, in `idpages`. Hash -> id is a dict, or for pages named by
dense labels (the simulator's) blocks of labels (`labelblocks.LabelBlocks`): the same ids either way.

Boundary: the node's id table only; what a tier holds is `idpages.IdTier`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from enum import IntEnum
from itertools import compress, repeat
from operator import is_
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np
import numpy.typing as npt

from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.chainrun import pages_and_parents
from evolving_infra.node_agent.engine.labelblocks import LabelBlocks

if TYPE_CHECKING:
    from evolving_infra.node_agent.engine.idpages import IdTier

Ids = npt.NDArray[np.int64]
Gens = npt.NDArray[np.uint32]
"""Generations of ids (modulo 2^32: an entry of an id freed and reused 2^32 times since would pass for live, which no
run comes near)."""
MAX_IDS = 2**31 - 1
"""Ids a node's table may hand out (the eviction order keeps them as 32-bit ints)."""

_INTS: list[int] = []
"""The int objects of ids, shared by every node's table: a hash -> id dict entry points at one of these rather than
at an int of its own (32 bytes per entry saved: a partition's nodes hold ~15 M ids at once)."""


def _shared_ints(n: int) -> None:
    """`_INTS` covers ids below `n`."""
    if len(_INTS) < n:
        _INTS.extend(range(len(_INTS), n))


class PageState(IntEnum):
    """A page's state in one tier, as stored in `IdTier.state` (one byte per id)."""

    ABSENT = 0  # not resident here (pages being written are kept by hash: few)
    PINNED = 1  # resident, pinned by at least one owner
    CACHED = 2  # resident, pinned by nobody: an eviction candidate


ABSENT, PINNED, CACHED = int(PageState.ABSENT), int(PageState.PINNED), int(PageState.CACHED)  # plain ints: fast numpy compares


_IdArray = TypeVar("_IdArray", npt.NDArray[np.int64], npt.NDArray[np.int32])


def distinct(ids: _IdArray) -> _IdArray:
    """`ids` without repeats, sorted (a sort and a mask: numpy's hash-based `unique` costs ~10x more here)."""
    if len(ids) < 2:
        return ids.copy()
    s = np.sort(ids)
    keep = np.empty(len(s), dtype=np.bool_)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


class DictIds(dict[PageHash, int]):
    """hash -> id as a dict (pages named by content hashes), with the many-pages methods `LabelBlocks` has for
    pages named by dense labels, so `PageIds` calls either alike."""

    __slots__ = ()

    def lookup(self, pages: Collection[PageHash]) -> Ids:
        """The ids of `pages`, -1 for pages without one (one probe per page)."""
        return np.fromiter(map(self.get, pages, repeat(-1)), dtype=np.int64, count=len(pages))

    def ids(self, pages: Sequence[PageHash]) -> Ids:
        """The ids of `pages` (KeyError for the first without one)."""
        return np.fromiter(map(self.__getitem__, pages), dtype=np.int64, count=len(pages))

    def assign(self, pages: Sequence[PageHash], ids: Ids, labels: npt.NDArray[np.uint64] | None = None) -> None:
        """`self[pages[j]] = ids[j]` for pages without an id (`labels`: the same pages as an array, unused here)."""
        self.update(zip(pages, map(_INTS.__getitem__, ids.tolist())))

    def remove(self, pages: Sequence[PageHash]) -> None:
        """Forget the ids of `pages` (each has one)."""
        deque(map(self.__delitem__, pages), maxlen=0)

    def all_present(self, pages: Collection[PageHash]) -> bool:
        return self.keys() >= (pages if isinstance(pages, (set, frozenset)) else set(pages))

    def all_absent(self, pages: Collection[PageHash]) -> bool:
        return self.keys().isdisjoint(pages)


class PageIds:
    """Page hash <-> dense id of one node, with per-id depth, generation and holder count (tiers holding
    it). An id is freed when no tier holds its page, and its generation grows, so an old entry of the id in an
    eviction order is recognised as stale.

    The node's branch counts (page -> count > 0, pushed by the directory) live here too: a page some tier holds
    keeps its count in `count` (and `counted`: count > 0) by id, a counted page no tier holds in the dict
    `counts`; a count moves between the two as the page gets or loses its id. (The directory counts the pages
    of the node's copies, so nearly every counted page is held: a dict entry per counted page cost ~45 bytes,
    the id's count costs 4.) `counts_view()` reads them all as one mapping."""

    def __init__(self, counts: dict[PageHash, int] | None = None, capacity: int = 1024, limit: int = MAX_IDS,
                 dense: bool = False) -> None:  # fmt: skip
        """`counts`: branch counts of pages no tier holds yet (the dict is kept, and taken from as pages get
        ids). `limit`: the most pages the tiers over these ids can hold together (their capacities' sum): ids
        are reused before new ones are made, so the arrays never need to grow past it. `dense`: the pages are
        named by dense labels (runs of consecutive integers, as the simulator names them), so hash -> id is kept
        by blocks of labels (`labelblocks`) instead of a dict: the same ids, resolved per block instead of per
        page."""
        if not 1 <= limit <= MAX_IDS:
            raise ValueError(f"the ids' limit must be between 1 and {MAX_IDS:,}, got {limit:,}")
        self.limit = limit
        capacity = min(capacity, limit)
        self.counts = {} if counts is None else counts  # positive branch counts of pages no tier holds, by hash
        self._id: DictIds | LabelBlocks = LabelBlocks() if dense else DictIds()
        self.hashes = np.zeros(capacity, dtype=np.uint64)
        self.depth = np.zeros(capacity, dtype=np.int64)
        self.gen = np.zeros(capacity, dtype=np.uint32)
        self.holders = np.zeros(capacity, dtype=np.int8)
        self.count = np.zeros(capacity, dtype=np.int32)  # branch count of a held page (0: none)
        self.counted = np.zeros(capacity, dtype=np.bool_)  # count > 0 (what the eviction orders read)
        # a page's parent (the page before it in its chain) is a property of its content, the same wherever it is
        # stored: kept per id (0 and `rooted` for a first page) rather than per resident page and tier
        self.parent = np.zeros(capacity, dtype=np.uint64)
        self.rooted = np.zeros(capacity, dtype=np.bool_)
        self._mark = np.zeros(capacity, dtype=np.bool_)  # all False between calls of `any_in` (scratch)
        self._free: list[int] = []  # (ids from `_INTS`, as the dict's values)
        self._next = 0
        _shared_ints(capacity)
        self.tiers: list[IdTier] = []  # the tiers over these ids (a count flip moves cached pages in each)

    def __len__(self) -> int:
        return len(self._id)

    def _grow(self, need: int) -> None:
        size = len(self.hashes)
        if need <= size:
            return
        if need > self.limit:
            raise OverflowError(f"this node's page ids are limited to {self.limit:,} pages held at once, {need:,} needed")
        new = min(max(need, 2 * size), self.limit)  # (doubling, but never past what the tiers can hold)
        _shared_ints(new)
        for name in ("hashes", "depth", "gen", "holders", "count", "counted", "parent", "rooted", "_mark"):
            old = getattr(self, name)
            arr = np.zeros(new, dtype=old.dtype)
            arr[:size] = old
            setattr(self, name, arr)
        for tier in self.tiers:  # (a tier's per-id arrays cover every id: `IdTier.holds` reads them unchecked)
            tier._fit()

    def get(self, page: PageHash) -> int | None:
        return self._id.get(page)

    def any_in(self, ids: Ids, among: Ids) -> bool:
        """Whether any of `ids` is one of `among` (ids below the table's size): `np.isin(ids, among).any()`
        by marking `among` in a scratch array, O(len) instead of a sort of both."""
        mark = self._mark
        mark[among] = True
        try:
            return bool(mark[ids].any())
        finally:
            mark[among] = False

    def ids(self, pages: Iterable[PageHash]) -> Ids:
        """The ids of `pages` (each held by a tier; KeyError for the first that is not)."""
        return self._id.ids(pages if isinstance(pages, (list, tuple)) else list(pages))

    def lookup(self, pages: Collection[PageHash]) -> Ids:
        """The ids of `pages`, -1 for pages no tier holds (one probe per page, or per block of dense labels: what
        a request pays once)."""
        return self._id.lookup(pages)

    def holds_all(self, pages: Collection[PageHash]) -> bool:
        """Whether every page of `pages` has an id."""
        return self._id.all_present(pages)

    def holds_none(self, pages: Collection[PageHash]) -> bool:
        """Whether no page of `pages` has an id."""
        return self._id.all_absent(pages)

    def resolve(self, pages: list[PageHash]) -> tuple[Ids, Ids]:
        """`lookup` of `pages` with the ids' generations: what a request keeps between operations."""
        ids = self.lookup(pages)
        return ids, self._gens(ids)

    def refresh(self, pages: Sequence[PageHash], ids: Ids, gens: Ids) -> tuple[Ids, Ids]:
        """Kept (`ids`, `gens`) of `pages` made current: pages whose id was freed (generation moved) or that
        had none are looked up again (one probe each); the others cost an array comparison."""
        known = ids >= 0
        stale = ~known
        stale[known] = self.gen[ids[known]] != gens[known]
        if not stale.any():
            return ids, gens
        where = np.flatnonzero(stale)
        ids = ids.copy()
        ids[where] = self.lookup([pages[j] for j in where.tolist()])
        return ids, self._gens(ids)

    def _gens(self, ids: Ids) -> Ids:
        gens = np.full(len(ids), -1, dtype=np.int64)
        known = ids >= 0
        gens[known] = self.gen[ids[known]]
        return gens

    def parent_of(self, i: int) -> PageHash | None:
        """The parent of the page with id `i` (None for a first page)."""
        return None if self.rooted[i] else PageHash(int(self.parent[i]))

    def parents_of(self, ids: Ids) -> list[PageHash | None]:
        """The parents of the pages with `ids`, in order (None for first pages)."""
        out: list[PageHash | None] = self.parent[ids].tolist()
        rooted = self.rooted[ids]
        if rooted.any():
            for j in np.flatnonzero(rooted).tolist():
                out[j] = None
        return out

    def hash_of(self, ids: Ids) -> list[PageHash]:
        return cast("list[PageHash]", self.hashes[ids].tolist())  # (PageHash is int at run time: no per-item call)

    def intern(self, page: PageHash, parent: PageHash | None) -> int:
        """The id of `page`, made (with its depth: one more than its parent's if held, else 0) if new."""
        got = self._id.get(page)
        if got is not None:
            return got
        if self._free:
            i = self._free.pop()
        else:
            i = self._next
            self._next += 1
            self._grow(self._next)
        pid = self._id.get(parent) if parent is not None else None
        self.depth[i] = 0 if pid is None else self.depth[pid] + 1
        self.hashes[i] = page
        self.parent[i] = 0 if parent is None else parent
        self.rooted[i] = parent is None
        self.holders[i] = 0
        c = self.counts.pop(page, 0) if self.counts else 0  # (its count, if it had one, moves to the id)
        self.count[i] = c
        self.counted[i] = c > 0
        self._id[page] = i = _INTS[i]
        return i

    def intern_run(self, items: Mapping[PageHash, PageHash | None], ids: Ids | None = None) -> Ids:
        """`intern` each page of `items` (page -> parent, in chain order), at once where the pages form one chain
        (each the parent of the next; a `ChainRun` is one): the new pages take one id block (in the order `intern`
        would take them), and each stretch of new pages gets consecutive depths from the page before it (or its
        parent). `ids`: the pages' ids as `lookup` gives them now, where the caller has them (no page is looked
        up again)."""
        pages, parents, chain = pages_and_parents(items)
        k = len(pages)
        known = self._id
        chain = k >= 2 and chain
        if chain and ids is not None:
            fresh = False
        else:
            fresh = chain and self.holds_none(pages)  # (the usual case: a chain no tier holds yet)
            if not chain or (not fresh and k < 32):  # (below 32 pages, numpy's per-call costs exceed the per-page path's)
                return np.fromiter((self.intern(p, q) for p, q in zip(pages, parents)), dtype=np.int64, count=k)
        first = parents[0]
        pid = known.get(first) if first is not None else None
        base = 0 if pid is None else int(self.depth[pid]) + 1  # the depth of a new first page
        if fresh:
            ids = self._block(k)
            self.depth[ids] = np.arange(base, base + k)
            self._fill(ids, pages, parents, chain=True)
            return ids
        ids = self.lookup(pages) if ids is None else ids.copy()
        new = np.flatnonzero(ids < 0)
        if not len(new):
            return ids
        fresh_ids = self._block(len(new))
        ids[new] = fresh_ids
        depth = self.depth
        runs = list(stretches(new))
        for lo, hi in runs:  # each but a first one follows a known page
            at = int(depth[ids[lo - 1]]) + 1 if lo else base
            depth[ids[lo:hi]] = np.arange(at, at + hi - lo)
        if len(runs) == 1:  # one stretch of new pages: a slice of the chain
            ((lo, hi),) = runs
            self._fill(fresh_ids, pages[lo:hi], parents[lo:hi], chain=True)
        else:
            where = new.tolist()
            self._fill(fresh_ids, [pages[j] for j in where], [parents[j] for j in where])
        return ids

    def _block(self, k: int) -> Ids:
        """`k` ids for new pages, in the order `intern` takes them (freed ids first, last freed first)."""
        take = min(k, len(self._free))
        ids = np.empty(k, dtype=np.int64)
        if take:
            ids[:take] = self._free[len(self._free) - take :][::-1]
            del self._free[len(self._free) - take :]
        if k > take:
            ids[take:] = np.arange(self._next, self._next + k - take)
            self._next += k - take
            self._grow(self._next)
        return ids

    def _fill(self, ids: Ids, pages: Sequence[PageHash], parents: Sequence[PageHash | None], chain: bool = False) -> None:
        """New `ids` (depths set) become those of `pages`, whose parents are `parents` (`chain`: known to be a
        chain, each page the parent of the next)."""
        k = len(pages)
        hashes = np.fromiter(pages, dtype=np.uint64, count=k)
        self.hashes[ids] = hashes
        if k and (chain or parents[1:] == pages[:-1]):  # a chain (the usual case): the parents are the hashes shifted by one
            first = parents[0]
            self.parent[ids[1:]] = hashes[:-1]
            self.parent[ids[0]] = 0 if first is None else first
            self.rooted[ids] = False
            self.rooted[ids[0]] = first is None
        else:
            rooted = np.fromiter(map(is_, parents, repeat(None)), dtype=np.bool_, count=k)
            self.rooted[ids] = rooted
            self.parent[ids] = np.fromiter((0 if p is None else p for p in parents), dtype=np.uint64, count=k)
        self.holders[ids] = 0
        counts = self.counts
        if counts:  # (their counts, where they had one, move to the ids)
            taken = np.fromiter(map(counts.pop, pages, repeat(0)), dtype=np.int64, count=k)
            self.count[ids] = taken
            self.counted[ids] = taken > 0
        else:
            self.count[ids] = 0
            self.counted[ids] = False
        self._id.assign(pages, ids, labels=hashes)

    def set_counts(self, pages: list[PageHash], values: Sequence[int]) -> None:
        """Branch count `values[j]` (an int >= 0, checked by the caller; 0 forgets it) for `pages[j]` (each
        page once); each tier re-enters its cached pages whose counted flag flipped (in the order of `pages`)."""
        n = len(pages)
        if not n:
            return
        ids = self.lookup(pages)
        held = ids >= 0
        given = np.asarray(values, dtype=np.int64)
        if held.all():
            unheld: list[int] = []
        else:
            unheld = np.flatnonzero(~held).tolist()
            ids, given = ids[held], given[held]
        if len(ids):
            now = given > 0
            flip = (self.count[ids] > 0) != now
            self.count[ids] = given
            if flip.any():
                self._flip(ids[flip], now[flip])
        if unheld:
            counts = self.counts
            for j in unheld:
                if values[j]:
                    counts[pages[j]] = values[j]
                else:
                    counts.pop(pages[j], None)

    def set_count_groups(self, groups: Sequence[tuple[Sequence[PageHash], int]]) -> None:
        """Stretches of pages with one count each (ints >= 0, checked by the caller), applied in order; a page
        in two stretches must have one count in both. The tiers re-enter the cached pages that turned counted
        (stretch by stretch, in order), then those that turned uncounted."""
        new: list[Ids] = []
        gone: list[Ids] = []
        counts = self.counts
        for stretch, c in groups:
            pages = stretch if isinstance(stretch, list) else list(stretch)
            if not pages:
                continue
            ids = self.lookup(pages)
            held = ids >= 0
            if not held.all():
                unheld = list(compress(pages, (~held).tolist()))
                ids = ids[held]
                if c:
                    counts.update(zip(unheld, repeat(c)))
                elif counts:
                    deque(map(counts.pop, unheld, repeat(None)), maxlen=0)
            if len(ids):
                had = self.count[ids] > 0
                self.count[ids] = c
                if c:
                    if not had.all():
                        new.append(ids[~had])
                elif had.any():
                    gone.append(ids[had])
        for flipped, flag in ((new, True), (gone, False)):
            if flipped:
                ids = flipped[0] if len(flipped) == 1 else np.concatenate(flipped)
                self._flip(ids, np.full(len(ids), flag))

    def set_count(self, ids: Ids, count: int) -> None:
        """Branch count `count` (>= 0) for the held pages `ids`; each tier re-enters its cached ids whose
        counted flag flipped."""
        flip = (self.count[ids] > 0) != (count > 0)
        self.count[ids] = count
        if flip.any():
            self._flip(ids[flip], np.full(int(flip.sum()), count > 0))

    def _flip(self, ids: Ids, now: npt.NDArray[np.bool_]) -> None:
        self.counted[ids] = now
        for tier in self.tiers:
            tier.counted_flipped(ids)

    def counted_pages(self) -> list[PageHash]:
        """Every page with a positive branch count: the held ones (by id), then the others."""
        held = np.flatnonzero(self.count[: self._next] > 0)
        return [*self.hash_of(held), *self.counts]

    def count_of(self, page: PageHash) -> int:
        i = self._id.get(page)
        return self.counts.get(page, 0) if i is None else int(self.count[i])

    def counts_view(self) -> CountsView:
        return CountsView(self)

    def hold(self, ids: Ids) -> None:
        self.holders[ids] += 1

    def drop(self, ids: Ids) -> None:
        """A tier no longer holds `ids`; those no tier holds are freed."""
        self.holders[ids] -= 1
        gone = ids[self.holders[ids] == 0]
        if len(gone):
            self.gen[gone] += 1
            hashes = self.hashes[gone].tolist()
            self._id.remove(hashes)
            self._free.extend(map(_INTS.__getitem__, gone.tolist()))
            counted = self.counted[gone]
            if counted.any():  # their counts stay, by hash, until the pages get ids again or are forgotten
                self.counts.update(zip(compress(hashes, counted.tolist()), self.count[gone[counted]].tolist()))
                self.count[gone] = 0
                self.counted[gone] = False


class CountsView(Mapping[PageHash, int]):
    """A node's branch counts as one read-only mapping (page -> count > 0) over `PageIds`' two places for them."""

    __slots__ = ("_ids",)

    def __init__(self, ids: PageIds) -> None:
        self._ids = ids

    def __getitem__(self, page: PageHash) -> int:
        c = self._ids.count_of(page)
        if not c:
            raise KeyError(page)
        return c

    def __contains__(self, page: object) -> bool:
        return isinstance(page, int) and self._ids.count_of(PageHash(page)) > 0

    def __len__(self) -> int:
        ids = self._ids
        return int(np.count_nonzero(ids.count[: ids._next])) + len(ids.counts)

    def __iter__(self) -> Iterator[PageHash]:
        return iter(self._ids.counted_pages())


def stretches(positions: Ids) -> zip[tuple[int, int]]:
    """The stretches of consecutive values of `positions` (ascending, non-empty) as [lo, hi) pairs, in order."""
    cut = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = positions[np.concatenate(([0], cut))].tolist()
    ends = (positions[np.concatenate((cut - 1, [len(positions) - 1]))] + 1).tolist()
    return zip(starts, ends)
