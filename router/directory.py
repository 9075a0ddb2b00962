"""The cluster-wide KV directory: which node holds which KV page in which tier, fed by KV events.

The directory is a prefix tree of pages keyed by their chained `PageHash` (equal hashes mean equal whole
prefixes, so a page hash names a tree node and its whole path). Pages are kept as **runs**: consecutive pages
of a chain (each page's parent is the page before it) with the same holders and the same last use per holder.
A run has one integer bitmask of its holders, three bits per node index i: bit `3i` when node i holds its
pages in GPU memory (L1), `3i + 1` in host memory (L2), `3i + 2` in either; and one last-use time per holder
bit. A KV event touching part of a run splits it where the holders or times start to differ; a run left
without holders leaves the directory. Per page there is one dictionary entry (page -> its run) and one slot in
its run's page list.

A lookup walks the runs the prompt's held prefix lies in: one probe per run, and one C-level comparison of the
run's pages with the prompt's (chained hashes make a mismatch rare; where the prompt leaves a run inside it, a
binary search finds the point). The masks of those stretches answer every node and tier at once
(`prefix_match.match_from_stretches`).

Invariants (checked by `tests/router/test_directory*.py` against a brute-force model and against the
page-exact directory `directory_pages.PageKvDirectory`, the oracle):
- page p is in `_run` <=> some node holds it in some tier; bit `3i + t` of its run's mask is set <=> node i
  holds p in tier t <=> `3i + t` is a key of the run's times; bit `3i + 2` is set <=> bit `3i` or `3i + 1` is;
- consecutive pages of a run are parent and child; a run's pages are distinct and every one maps to it;
- `_holding[b]` is exactly the set of runs whose times have key b;
- masks never carry the bit of a node index that is free (dropped nodes are cleared before reuse).

Tolerated events, all deterministic and counted in `DirectoryStats`:
- `KvStored` whose `parent` is not in the tree: its first page starts a new root (parent None);
- a page stored again under a different parent keeps the parent it was first stored with;
- `KvRemoved` of a page the node does not hold in that tier: no-op;
- `KvRemoved` / `KvCleared` / `touch` for a node the directory never saw: no-op (the node is not added).

Boundary: pure state over KV events; no clock (times come from events and callers), no I/O. Node indices
are small integers reused lowest-first after `drop_node`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.prefix_match import PrefixMatch, bits_of, match_from_stretches

__all__ = ["DirectoryStats", "KvDirectory", "PrefixMatch"]

_TIER_INDEX: dict[Tier, int] = {Tier.GPU: 0, Tier.HOST: 1}


@dataclass(slots=True)
class DirectoryStats:
    """Counters of events applied and of the tolerated anomalies (see the module docstring)."""

    events: int = 0
    pages_stored: int = 0
    pages_removed: int = 0
    unknown_parents: int = 0
    parent_mismatches: int = 0
    removed_unheld: int = 0
    unknown_node_events: int = 0


@dataclass(slots=True)
class _NodeSlots:
    """Node id <-> bit index, reusing the lowest free index first."""

    index: dict[NodeId, int] = field(default_factory=dict)
    ids: list[NodeId | None] = field(default_factory=list)
    free: list[int] = field(default_factory=list)


class _Run:
    """Consecutive pages of one chain (each page's parent is the page before it; `parent` is the first page's)
    with one holder mask and one last use per holder bit (3i + t, t = 0 GPU, 1 host)."""

    __slots__ = ("pages", "parent", "mask", "times")

    def __init__(self, pages: list[PageHash], parent: PageHash | None, mask: int, times: dict[int, float]) -> None:
        self.pages = pages
        self.parent = parent
        self.mask = mask
        self.times = times


def _drain(calls: Iterable[object]) -> None:
    """Run a C-level map of calls for their effect."""
    deque(calls, maxlen=0)


Ranges = list[tuple[int, int]]
"""Sorted, disjoint [start, end) position ranges within a run."""


def _ranges(positions: Iterable[int]) -> Ranges:
    out: Ranges = []
    for p in sorted(set(positions)):
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and out[-1][1] >= lo:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


class KvDirectory:
    """Pages held per node and tier, with last-use times, kept as runs of pages; answers longest-prefix lookups.

    Node ids get a bit index on their first `KvStored` (or `add_node`); `drop_node` frees it.
    """

    __slots__ = ("_slots", "_run", "_holding", "_tier_bits", "_index_ids", "stats")

    def __init__(self) -> None:
        self._slots = _NodeSlots()
        self._run: dict[PageHash, _Run] = {}
        self._holding: dict[int, set[_Run]] = {}  # holder bit 3i + t -> the runs it holds
        self._tier_bits = [0, 0, 0]  # GPU, host and either bits of every index ever allocated
        self._index_ids: tuple[dict[NodeId, int], tuple[NodeId | None, ...]] | None = None  # for lookups
        self.stats = DirectoryStats()

    # ----------------------------------------------------------------------------------------- nodes
    def add_node(self, node: NodeId) -> int:
        """Register `node` (idempotent) and return its bit index."""
        slots = self._slots
        idx = slots.index.get(node)
        if idx is not None:
            return idx
        if slots.free:
            idx = heapq.heappop(slots.free)
            slots.ids[idx] = node
        else:
            idx = len(slots.ids)
            slots.ids.append(node)
            for t in range(3):
                self._tier_bits[t] |= 1 << (3 * idx + t)
        slots.index[node] = idx
        self._index_ids = None
        return idx

    def drop_node(self, node: NodeId) -> int:
        """Forget `node` (it died): remove it from every page in both tiers; returns pages dropped."""
        idx = self._slots.index.get(node)
        if idx is None:
            return 0
        dropped = self._clear_index(idx, 0) + self._clear_index(idx, 1)
        del self._slots.index[node]
        self._slots.ids[idx] = None
        heapq.heappush(self._slots.free, idx)
        self._index_ids = None
        return dropped

    def nodes(self) -> tuple[NodeId, ...]:
        """Known nodes, in bit-index order."""
        return tuple(n for n in self._slots.ids if n is not None)

    @property
    def page_count(self) -> int:
        """Distinct pages held by at least one node in at least one tier."""
        return len(self._run)

    @property
    def run_count(self) -> int:
        """Runs the pages are kept in."""
        return len({id(r) for runs in self._holding.values() for r in runs})

    # ---------------------------------------------------------------------------------------- events
    def apply(self, event: KvEvent) -> None:
        """Apply one KV event."""
        if isinstance(event, KvStored):
            self.store(event.node, event.tier, event.parent, event.pages, event.time)
        elif isinstance(event, KvRemoved):
            self.remove(event.node, event.tier, event.pages)
        elif isinstance(event, KvCleared):
            self.clear(event.node, event.tier)
        else:
            raise TypeError(f"not a KV event: {event!r} (expected KvStored, KvRemoved or KvCleared)")

    def apply_all(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            self.apply(event)

    def store(
        self, node: NodeId, tier: Tier, parent: PageHash | None, pages: Sequence[PageHash], time: float
    ) -> None:
        """`node` holds the parent-linked chain `pages` in `tier`, last used at `time`."""
        t = _TIER_INDEX[tier]
        idx = self.add_node(node)
        bit = 3 * idx + t
        add = (1 << bit) | (1 << (3 * idx + 2))
        stats = self.stats
        stats.events += 1
        stats.pages_stored += len(pages)
        runs = self._run
        prev = parent
        if parent is not None and parent not in runs:
            stats.unknown_parents += 1
            prev = None
        if not pages:
            return
        pages = list(pages)
        found = list(map(runs.get, pages))
        touched: dict[_Run, Ranges] = {}
        n = len(pages)
        distinct = len(set(pages)) == n
        if distinct and found[0] is None and found.count(None) == n:  # all new: one fresh run
            fresh = _Run(pages, prev, add, {bit: time})
            runs.update(zip(pages, repeat(fresh)))
            self._holding.setdefault(bit, set()).add(fresh)
            return
        if distinct:  # the usual chain: stretches of existing runs and of new pages
            at = 0
            while at < n:
                existing = runs.get(pages[at])
                if existing is None:  # new pages up to the next page held somewhere
                    end = at + 1
                    while end < n and pages[end] not in runs:
                        end += 1
                    chunk = pages[at:end]
                    fresh = _Run(chunk, prev, add, {bit: time})
                    runs.update(zip(chunk, repeat(fresh)))
                    self._holding.setdefault(bit, set()).add(fresh)
                    prev, at = chunk[-1], end
                    continue
                rp = existing.pages
                o = 0 if rp[0] == pages[at] else rp.index(pages[at])
                k = min(len(rp) - o, n - at)
                if rp[o : o + k] != pages[at : at + k]:
                    k = _common(rp, o, pages, at, k)  # the chain leaves the run here (it may come back)
                before = rp[o - 1] if o else existing.parent
                if before != prev:
                    stats.parent_mismatches += 1
                touched.setdefault(existing, []).append((o, o + k))
                prev, at = pages[at + k - 1], at + k
        else:  # a page repeats in the chain: page by page
            fresh_run: _Run | None = None
            for page in pages:
                run = runs.get(page)
                if run is None:
                    if fresh_run is not None and fresh_run.pages[-1] == prev:
                        fresh_run.pages.append(page)
                    else:
                        fresh_run = _Run([page], prev, add, {bit: time})
                        self._register(fresh_run)
                    runs[page] = fresh_run
                else:
                    pos = run.pages.index(page)
                    before = run.pages[pos - 1] if pos else run.parent
                    if before != prev:
                        stats.parent_mismatches += 1
                    if run is not fresh_run:
                        touched.setdefault(run, []).append((pos, pos + 1))
                    fresh_run = None
                prev = page

        def held(r: _Run) -> None:
            r.mask |= add
            r.times[bit] = time

        for run, ranges in touched.items():
            self._update(run, ranges if len(ranges) == 1 else _merge(ranges), held, bit, 1)

    def remove(self, node: NodeId, tier: Tier, pages: Iterable[PageHash]) -> int:
        """`node` no longer holds `pages` in `tier`; returns how many it did hold."""
        self.stats.events += 1
        idx = self._slots.index.get(node)
        if idx is None:
            self.stats.unknown_node_events += 1
            return 0
        t = _TIER_INDEX[tier]
        bit = 3 * idx + t
        other, either = 1 << (3 * idx + 1 - t), 1 << (3 * idx + 2)
        pages = list(pages)
        touched, held = self._held_ranges(pages, 1 << bit)
        for run, ranges in touched.items():

            def unheld(r: _Run) -> None:
                mask = r.mask & ~(1 << bit)
                if not mask & other:
                    mask &= ~either
                r.mask = mask
                del r.times[bit]

            self._update(run, ranges, unheld, bit, -1)
        self.stats.pages_removed += held
        self.stats.removed_unheld += len(pages) - held
        return held

    def clear(self, node: NodeId, tier: Tier | None) -> int:
        """`node` dropped everything in `tier` (both tiers when None); returns pages dropped."""
        self.stats.events += 1
        idx = self._slots.index.get(node)
        if idx is None:
            self.stats.unknown_node_events += 1
            return 0
        tiers = (0, 1) if tier is None else (_TIER_INDEX[tier],)
        return sum(self._clear_index(idx, t) for t in tiers)

    def touch(self, node: NodeId, tier: Tier, pages: Iterable[PageHash], time: float) -> int:
        """Set the last use of the `pages` that `node` holds in `tier` to `time`; returns pages updated."""
        idx = self._slots.index.get(node)
        if idx is None:
            return 0
        bit = 3 * idx + _TIER_INDEX[tier]
        pages = list(pages)
        touched, held = self._held_ranges(pages, 1 << bit, count_repeats=True)

        def used(r: _Run) -> None:
            r.times[bit] = time

        for run, ranges in touched.items():
            self._update(run, ranges, used, bit, 0)
        return held

    def _held_ranges(
        self, pages: list[PageHash], bitmask: int, count_repeats: bool = False
    ) -> tuple[dict[_Run, Ranges], int]:
        """The positions of `pages` held with `bitmask`, per run, and how many of `pages` were held (a page
        listed twice counts once unless `count_repeats`).

        Pages are grouped by run first (in the order runs first appear), so a run's positions are found once
        per call, however the pages interleave (an eviction lists its victims in eviction order, which mixes
        runs and reverses them)."""
        runs = self._run
        found = list(map(runs.get, pages))
        by_run: dict[_Run, list[PageHash]] = {}
        for page, run in zip(pages, found):
            if run is not None and run.mask & bitmask:
                chunk = by_run.get(run)
                if chunk is None:
                    by_run[run] = [page]
                else:
                    chunk.append(page)
        touched: dict[_Run, Ranges] = {}
        held = 0
        distinct = len(set(pages)) == len(pages)
        for run, chunk in by_run.items():
            n = len(chunk)
            held += n
            rp = run.pages
            if distinct and n == len(rp):  # every page of the run (each maps to it, none twice)
                touched[run] = [(0, n)]
                continue
            o = 0 if rp[0] == chunk[0] else rp.index(chunk[0])
            if distinct and rp[o : o + n] == chunk:
                touched[run] = [(o, o + n)]
                continue
            if n > 4:  # one position map instead of a scan per page
                where = dict(zip(rp, range(len(rp))))
                touched[run] = _ranges(map(where.__getitem__, chunk))
            else:
                touched[run] = _ranges(map(rp.index, chunk))
        if not distinct and not count_repeats:
            held = len({p for p, r in zip(pages, found) if r is not None and r.mask & bitmask})
        return touched, held

    def _register(self, run: _Run) -> None:
        holding = self._holding
        for b in run.times:
            holding.setdefault(b, set()).add(run)

    def _update(self, run: _Run, ranges: Ranges, change: Callable[[_Run], None], bit: int, delta: int) -> None:
        """Apply `change` to the pages of `run` at `ranges`, splitting the run where they start and end; runs
        left without holders leave the directory. `change` adds holder `bit` (delta 1), removes it (-1) or
        leaves the holders as they are (0). The longest piece keeps the run object (fewer pages re-pointed)."""
        pages = run.pages
        n = len(pages)
        holding, runs = self._holding, self._run
        if len(ranges) == 1 and ranges[0][0] == 0 and ranges[0][1] == n:
            change(run)
            if delta > 0:
                holding.setdefault(bit, set()).add(run)
            elif delta < 0:
                holding[bit].discard(run)
                if not run.mask:
                    _drain(map(runs.__delitem__, pages))
            return
        segments: list[tuple[int, int, bool]] = []
        at = 0
        for lo, hi in ranges:
            if lo > at:
                segments.append((at, lo, False))
            segments.append((lo, hi, True))
            at = hi
        if at < n:
            segments.append((at, n, False))
        keep = max(segments, key=lambda seg: seg[1] - seg[0])
        mask, times, parent = run.mask, dict(run.times), run.parent
        for lo, hi, hit in segments:
            if (lo, hi, hit) == keep:
                run.pages = pages[lo:hi]
                run.parent = pages[lo - 1] if lo else parent
                if hit:
                    self._update(run, [(0, hi - lo)], change, bit, delta)
                continue
            piece = _Run(pages[lo:hi], pages[lo - 1] if lo else parent, mask, dict(times))
            if hit:
                change(piece)
            if piece.mask:
                runs.update(zip(piece.pages, repeat(piece)))
                self._register(piece)
            else:
                _drain(map(runs.__delitem__, piece.pages))

    def _clear_index(self, idx: int, t: int) -> int:
        bit = 3 * idx + t
        runs = list(self._holding.get(bit, ()))
        other, either = 1 << (3 * idx + 1 - t), 1 << (3 * idx + 2)

        def unheld(r: _Run) -> None:
            mask = r.mask & ~(1 << bit)
            if not mask & other:
                mask &= ~either
            r.mask = mask
            del r.times[bit]

        dropped = 0
        for run in runs:
            dropped += len(run.pages)
            self._update(run, [(0, len(run.pages))], unheld, bit, -1)
        self._holding.pop(bit, None)
        self.stats.pages_removed += dropped
        return dropped

    # --------------------------------------------------------------------------------------- queries
    def _position(self, page: PageHash) -> tuple[_Run, int] | None:
        run = self._run.get(page)
        if run is None:
            return None
        return run, run.pages.index(page)

    def parent(self, page: PageHash) -> PageHash | None:
        """The parent recorded for `page` (None for a root); KeyError if no node holds `page`."""
        at = self._position(page)
        if at is None:
            raise KeyError(f"page {page:#018x} is not in the directory")
        run, pos = at
        return run.pages[pos - 1] if pos else run.parent

    def __contains__(self, page: object) -> bool:
        return page in self._run

    def holders(self, page: PageHash, tier: Tier) -> frozenset[NodeId]:
        """Nodes that hold `page` in `tier`."""
        t = _TIER_INDEX[tier]
        run = self._run.get(page)
        mask = 0 if run is None else run.mask & self._tier_bits[t]
        return frozenset(node for _, node in bits_of(mask, self._slots.ids))

    def last_used(self, page: PageHash, node: NodeId, tier: Tier) -> float | None:
        """When `node` last used `page` in `tier`, or None if it does not hold it there."""
        idx = self._slots.index.get(node)
        run = self._run.get(page)
        if idx is None or run is None:
            return None
        return run.times.get(3 * idx + _TIER_INDEX[tier])

    def pages_on(self, node: NodeId, tier: Tier) -> dict[PageHash, float]:
        """A copy of the pages `node` holds in `tier`, with their last-use times."""
        idx = self._slots.index.get(node)
        if idx is None:
            return {}
        bit = 3 * idx + _TIER_INDEX[tier]
        out: dict[PageHash, float] = {}
        for run in self._holding.get(bit, ()):
            out.update(zip(run.pages, repeat(run.times[bit])))
        return out

    def held_count(self, node: NodeId, tier: Tier) -> int:
        idx = self._slots.index.get(node)
        if idx is None:
            return 0
        return sum(len(run.pages) for run in self._holding.get(3 * idx + _TIER_INDEX[tier], ()))

    def lookup(self, pages: Sequence[PageHash]) -> PrefixMatch:
        """Longest cached prefixes of a prompt given as its page hashes (see `PrefixMatch`): one walk over the
        runs the prompt's held prefix lies in, each matched with one C-level slice comparison."""
        prompt = pages if isinstance(pages, list) else list(pages)
        runs = self._run
        n = len(prompt)
        stretches: list[tuple[int, int]] = []
        p = 0
        while p < n:
            run = runs.get(prompt[p])
            if run is None:
                break
            rp = run.pages
            o = 0 if rp[0] == prompt[p] else rp.index(prompt[p])
            k = min(len(rp) - o, n - p)
            if rp[o : o + k] != prompt[p : p + k]:
                k = _common(rp, o, prompt, p, k)
            if not stretches or stretches[-1][1] != run.mask:
                stretches.append((p, run.mask))
            p += k
        if self._index_ids is None:  # shared by the matches until a node joins or leaves (they never change it)
            self._index_ids = ({node: 3 * i for node, i in self._slots.index.items()}, tuple(self._slots.ids))
        index, ids = self._index_ids
        return match_from_stretches(n, stretches, p, index, ids, self._tier_bits[1], self._tier_bits[2])


def _common(a: list[PageHash], i: int, b: list[PageHash], j: int, k: int) -> int:
    """The length of the common prefix of a[i:i+k] and b[j:j+k] (>= 1, < k: they differ and start equal).

    With chained hashes, equal pages at an offset mean equal pages before it, so a binary search on single
    pages finds it; the answer is then checked with one slice comparison, and found page by page otherwise."""
    lo, hi = 1, k  # a[i:i+lo] == b[j:j+lo]; the first difference is before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[i + mid - 1] == b[j + mid - 1]:
            lo = mid
        else:
            hi = mid
    if a[i + lo] != b[j + lo] and a[i : i + lo] == b[j : j + lo]:
        return lo
    m = 0
    while m < k and a[i + m] == b[j + m]:
        m += 1
    return m
