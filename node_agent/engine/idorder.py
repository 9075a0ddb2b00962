"""The eviction order of one id tier (`IdOrder`): per key, the id arrays entered under it with the ids'
generations; a bucket is ordered only when victims reach it (its live ids in ascending (-depth, hash), the
order of `evictindex.EvictionOrder` for the built-in policies); why ids, in `idpages`.

Entries are kept as 32-bit ids and generations (8 bytes an entry, stale ones included: at partition scale the
order holds tens of millions; `PageIds` keeps ids below 2^31 and generations modulo 2^32).

Boundary: ordering only; the tier (`idpages.IdTier`) owns the state and access arrays this reads.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from evolving_infra.core.eviction import BranchCountEviction, HostEvictionPolicy, LruEviction
from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.pageids import CACHED, Gens, Ids, PageIds, distinct

if TYPE_CHECKING:
    from evolving_infra.node_agent.engine.idpages import IdTier

Key = tuple[float, ...]
Entries = npt.NDArray[np.int32]
"""Ids as the order keeps them (see the module docstring)."""


def rank(page: PageHash, depth: int) -> int:
    """The tie-break of `evictindex`: deeper first, then the smaller hash (hash - depth * 2^64)."""
    return page - (depth << 64)


class _Bucket:
    __slots__ = ("chunks", "ordered")

    def __init__(self) -> None:
        self.chunks: list[tuple[Entries, Gens]] = []  # (ids, their generations when entered)
        self.ordered = False  # chunks is one chunk of distinct ids in eviction order


class IdOrder:
    """The eviction order of one tier's cached ids under a built-in policy (see the module docstring)."""

    def __init__(self, policy: HostEvictionPolicy, ids: PageIds, tier: IdTier) -> None:
        if type(policy) is BranchCountEviction:
            self.by_count = True
        elif type(policy) is LruEviction:
            self.by_count = False
        else:
            raise NotImplementedError("the id order covers the built-in policies only (this step)")
        self._ids, self._tier = ids, tier
        self._buckets: dict[Key, _Bucket] = {}
        self._keys: list[Key] = []
        self._entries = 0  # ids over all chunks, stale ones included
        self.rebuilds = 0

    def key_of(self, counted: bool, when: float) -> Key:
        return (1.0 if counted else 0.0, when) if self.by_count else (when,)

    def _add(self, key: Key, ids: Ids) -> None:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
            heapq.heappush(self._keys, key)
        bucket.chunks.append((ids.astype(np.int32), self._ids.gen[ids]))
        bucket.ordered = False
        self._entries += len(ids)

    REBUILD_FACTOR = 4
    REBUILD_FLOOR = 4096
    """Entries are rebuilt from the tier's cached ids once they exceed REBUILD_FACTOR x the cached ids plus
    REBUILD_FLOOR (ids re-entered under a newer key leave their old entries behind until a victim search reaches
    them): memory stays within a constant factor of the live order, and the rebuild's cost is amortized over the
    entries added since the last one."""

    def enter(self, ids: Ids) -> None:
        """(Re)enter cached `ids` under their current keys (grouped by key: one chunk per key)."""
        if not len(ids):
            return
        if self._entries + len(ids) > self.REBUILD_FACTOR * self._tier.cached + self.REBUILD_FLOOR:
            self._rebuild()
            return
        self._enter(ids)

    def _rebuild(self) -> None:
        """Every cached id entered afresh under its current key, stale entries and empty buckets dropped; the
        order is the same (a bucket's live ids are sorted when victims reach it, whatever its chunks)."""
        self._buckets.clear()
        self._keys.clear()
        self._entries = 0
        self.rebuilds += 1
        self._enter(np.flatnonzero(self._tier.state == CACHED))

    def _enter(self, ids: Ids) -> None:
        if len(ids) == 1:  # one page (a decode's store): its key from scalars, no grouping passes
            i = int(ids[0])
            counted = bool(self._ids.counted[i]) if self.by_count else False
            self._add(self.key_of(counted, float(self._tier.access[i])), ids)
            return
        if not len(ids):
            return
        access = self._tier.access[ids]
        if self.by_count:
            flag = self._ids.counted[ids]
            groups = [(True, ids[flag], access[flag]), (False, ids[~flag], access[~flag])]
        else:
            groups = [(False, ids, access)]
        for counted, part, times in groups:
            if not len(part):
                continue
            if (times == times[0]).all():
                self._add(self.key_of(counted, float(times[0])), part)
                continue
            # one chunk per distinct time, in ascending time, each keeping the ids' order (a stable sort: a
            # rebuild meets thousands of distinct times, where one mask per time cost a pass each)
            by_time = np.argsort(times, kind="stable")
            part, times = part[by_time], times[by_time]
            cut = np.flatnonzero(times[1:] != times[:-1]) + 1
            starts = np.concatenate(([0], cut)).tolist()
            for lo, hi, when in zip(starts, [*starts[1:], len(part)], times[starts].tolist()):
                self._add(self.key_of(counted, when), part[lo:hi])

    def _live(self, key: Key, ids: Entries, gens: Gens) -> npt.NDArray[np.bool_]:
        tier, pages = self._tier, self._ids
        live: npt.NDArray[np.bool_] = (
            (pages.gen[ids] == gens) & (tier.state[ids] == CACHED) & (tier.access[ids] == key[-1])
        )
        if self.by_count:
            live &= pages.counted[ids] == (key[0] > 0)
        return live

    def _order(self, key: Key, bucket: _Bucket) -> Entries:
        """The bucket's live ids in eviction order (kept as its one chunk)."""
        if len(bucket.chunks) == 1:
            ids, gens = bucket.chunks[0]
        else:
            ids = np.concatenate([c[0] for c in bucket.chunks])
            gens = np.concatenate([c[1] for c in bucket.chunks])
        before = len(ids)
        ids = ids[self._live(key, ids, gens)]
        self._entries -= before - len(ids)
        if not bucket.ordered:
            unique = distinct(ids)
            self._entries -= len(ids) - len(unique)
            ids = unique
            pages = self._ids
            ids = ids[np.lexsort((pages.hashes[ids], -pages.depth[ids]))]
        bucket.chunks = [(ids, self._ids.gen[ids])]
        bucket.ordered = True
        return ids

    def _take_ordered(self, key: Key, bucket: _Bucket, need: int) -> Entries:
        """The first `need` live ids of an ordered bucket (fewer if it has fewer), taken out of it: only as much of
        its chunk is checked for liveness as that takes (in stretches that double), so taking a few victims from a
        large bucket costs what they cost; the unchecked rest stays with the generations it was entered with."""
        ids, gens = bucket.chunks[0]
        n = len(ids)
        lo, step = 0, max(need, 32)
        live_ids: list[Entries] = []
        live_gens: list[Gens] = []
        got = 0
        while got < need and lo < n:
            hi = min(n, lo + step)
            seg, seg_gens = ids[lo:hi], gens[lo:hi]
            live = self._live(key, seg, seg_gens)
            seg, seg_gens = seg[live], seg_gens[live]
            self._entries -= (hi - lo) - len(seg)
            live_ids.append(seg)
            live_gens.append(seg_gens)
            got += len(seg)
            lo = hi
            step *= 2
        if not live_ids:  # (an empty chunk)
            return ids
        checked = live_ids[0] if len(live_ids) == 1 else np.concatenate(live_ids)
        chosen = checked[:need]
        self._entries -= len(chosen)
        if len(checked) > need:
            spare_gens = live_gens[0] if len(live_gens) == 1 else np.concatenate(live_gens)
            rest, rest_gens = np.concatenate((checked[need:], ids[lo:])), np.concatenate((spare_gens[need:], gens[lo:]))
        else:
            rest, rest_gens = ids[lo:], gens[lo:]
        bucket.chunks = [(rest, rest_gens)]  # (still one chunk of distinct ids in eviction order)
        return chosen

    def victims(self, n: int, exclude: Ids | None = None) -> Ids:
        """The first `n` cached ids not in `exclude` in ascending (key, -depth, hash), taken out of the order."""
        out: list[Entries] = []
        need = n
        keep: list[Key] = []
        while self._keys and need > 0:
            key = heapq.heappop(self._keys)
            bucket = self._buckets[key]
            if (exclude is None or not len(exclude)) and bucket.ordered and len(bucket.chunks) == 1:
                chosen = self._take_ordered(key, bucket, need)
                out.append(chosen)
                need -= len(chosen)
                if len(bucket.chunks[0][0]):
                    keep.append(key)
                else:
                    del self._buckets[key]
                continue
            order = self._order(key, bucket)
            if exclude is not None and len(exclude):
                usable = ~np.isin(order, exclude)
                pick = np.flatnonzero(usable)[:need]
                chosen = order[pick]
                rest = np.delete(order, pick)
            else:
                chosen, rest = order[:need], order[need:]
            out.append(chosen)
            need -= len(chosen)
            self._entries -= len(chosen)
            if len(rest):
                bucket.chunks = [(rest, self._ids.gen[rest])]
                keep.append(key)
            else:
                del self._buckets[key]
        for key in keep:
            heapq.heappush(self._keys, key)
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


    def floor(self, pages: set[PageHash], now: float, depths: dict[PageHash, int]) -> tuple[Key, int]:
        """The smallest (key, `rank`) a page of `pages` (non-empty) has once accessed at `now`; the depths of
        pages no tier holds are taken from `depths`."""
        listed = list(pages)
        k = len(listed)
        table = self._ids
        ids = table.lookup(listed)
        known = ids >= 0
        unknown = None if known.all() else np.flatnonzero(~known).tolist()
        depth = np.empty(k, dtype=np.int64)
        depth[known] = table.depth[ids[known]]
        if unknown:
            depth[unknown] = [depths[listed[j]] for j in unknown]
        return self.floor_of(listed, ids, depth, now)

    def floor_of(self, listed: Sequence[PageHash], ids: Ids, depth: Ids, now: float) -> tuple[Key, int]:
        """`floor` of the pages `listed` (non-empty, distinct) given their ids (-1: no tier holds it) and the
        depth each has or will get."""
        k = len(listed)
        table = self._ids
        known = ids >= 0
        unknown = None if known.all() else np.flatnonzero(~known).tolist()
        counted = False
        sel: npt.NDArray[np.bool_] | None = None
        if self.by_count:
            flags = np.empty(k, dtype=np.bool_)
            flags[known] = table.counted[ids[known]]
            if unknown:
                counts = table.counts  # (C-level membership tests: this runs for every new page of a run)
                flags[unknown] = list(map(counts.__contains__, map(listed.__getitem__, unknown))) if counts else False
            if flags.all():
                counted = True
            else:
                sel = ~flags
        hashes = np.fromiter(listed, dtype=np.uint64, count=k)
        if sel is not None:
            depth, hashes = depth[sel], hashes[sel]
        deepest = int(depth.max())
        return self.key_of(counted, now), rank(PageHash(int(hashes[depth == deepest].min())), deepest)

    def place(self, i: int) -> tuple[Key, int]:
        """(key, rank) of cached id `i` now."""
        pages, tier = self._ids, self._tier
        key = self.key_of(bool(pages.counted[i]), float(tier.access[i]))
        return key, rank(PageHash(int(pages.hashes[i])), int(pages.depth[i]))
