"""The cluster-wide KV directory: which node holds which KV page in which tier, fed by KV events.

The directory is a prefix tree of pages keyed by their chained `PageHash` (equal hashes mean equal whole
prefixes, so a page hash names a tree node and its whole path). Pages are kept as **runs**: consecutive pages
of a chain (each page's parent is the page before it) with the same holders. A run has one integer bitmask of
its holders, three bits per node index i: bit `3i` when node i holds its pages in GPU memory (L1), `3i + 1` in
host memory (L2), `3i + 2` in either; and per holder bit the last use of its pages: one time when they all
share it, else an `array('d')` with one time per page (so pages stored or touched at different times, e.g. a
decode node's pages written one by one, stay in one run). A KV event that changes the holders of part of a
run splits it there; after a store, a piece whose holders become those of the run ending at its parent page is
merged into it (the shorter side's pages are re-pointed) unless that would add more than `_MERGE_BUDGET`
per-page times (chains stored in long chunks at their own times keep one run and one time per chunk);
removals split but do not merge (measured on the simulator's events: merging there cost more than it saved).
A run left without holders leaves the directory. Per page there is one dictionary entry (page -> its run) and
one slot in its run's page list.

A lookup walks the runs the prompt's held prefix lies in: one probe per run, and one C-level comparison of the
run's pages with the prompt's (chained hashes make a mismatch rare; where the prompt leaves a run inside it, a
binary search finds the point). The masks of those stretches answer every node and tier at once
(`prefix_match.match_from_stretches`).

Invariants (checked by `tests/router/test_directory*.py` against a brute-force model and against the
page-exact directory `directory_pages.PageKvDirectory`, the oracle):
- page p is in `_run` <=> some node holds it in some tier; bit `3i + t` of its run's mask is set <=> node i
  holds p in tier t <=> `3i + t` is a key of the run's times; bit `3i + 2` is set <=> bit `3i` or `3i + 1` is;
- a run's time entry is a number or an array as long as its page list;
- consecutive pages of a run are parent and child; a run's pages are distinct and every one maps to it;
- `_runs` is exactly the set of the runs pages map to;
- masks never carry the bit of a node index that is free (dropped nodes are cleared before reuse).

Tolerated events, all deterministic and counted in `DirectoryStats`:
- `KvStored` whose `parent` is not in the tree: its first page starts a new root (parent None);
- a page stored again under a different parent keeps the parent it was first stored with;
- `KvRemoved` of a page the node does not hold in that tier: no-op;
- `KvRemoved` / `KvCleared` / `touch` for a node the directory never saw: no-op (the node is not added).

Boundary: pure state over KV events (the run record and its range and time helpers: `directory_runs`; the
invariant check and the queries: `directory_reads`); no clock
(times come from events and callers), no I/O. Node indices are small integers reused lowest-first after
`drop_node`.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby, repeat
from operator import itemgetter

from evolving_infra.core.kv_events import KvCleared, KvEvent, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory_runs import (
    Ranges,
    Times,
    _Run,
    _as_array,
    _common,
    _merge,
    _positions,
    _ranges_of,
    _set_time,
    _sliced,
)
from evolving_infra.router.directory_reads import TIER_INDEX, DirectoryReads, NodeSlots
from evolving_infra.router.prefix_match import PrefixMatch

__all__ = ["DirectoryStats", "KvDirectory", "PrefixMatch"]

_MERGE_BUDGET = 64
"""Most per-page time entries (8 bytes each) a merge may add, about what a run object costs: runs whose pages
were stored at different times merge only while one of them is short (a decode node's pages joining its run
one at a time), so long chains stored in chunks at their own times keep one time per chunk and run."""
_first = itemgetter(0)


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


class KvDirectory(DirectoryReads):
    """Pages held per node and tier, with last-use times, kept as runs of pages; answers longest-prefix lookups.

    Node ids get a bit index on their first `KvStored` (or `add_node`); `drop_node` frees it.
    """

    __slots__ = ("_slots", "_run", "_runs", "_tier_bits", "_index_ids", "stats")

    def __init__(self) -> None:
        self._slots = NodeSlots()
        self._run: dict[PageHash, _Run] = {}
        self._runs: set[_Run] = set()  # every run (a node's runs are found by a scan: clears are rare)
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
        return len(self._runs)

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
        t = TIER_INDEX[tier]
        slots = self._slots
        idx = slots.index.get(node)
        if idx is None:
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
        n = len(pages)
        if n == 1:  # the decode pattern: one page at a time
            page = pages[0]
            run = runs.get(page)
            if run is None:
                fresh = _Run([page], prev, add, {bit: time})
                runs[page] = fresh
                self._runs.add(fresh)
                if prev is not None:
                    self._merge_left(fresh)
                return
            rp = run.pages
            o = 0 if rp[0] == page else rp.index(page)
            if (rp[o - 1] if o else run.parent) != prev:
                stats.parent_mismatches += 1
            self._stored(run, [(o, o + 1)], bit, add, time)
            return
        pages = list(pages)
        all_runs = self._runs
        touched: dict[_Run, Ranges] = {}
        fresh_runs: list[_Run] = []
        mismatches = stats.parent_mismatches
        flags: list[bool] | None = None  # pages held somewhere, found once the first new page shows up
        at = 0
        while at < n:  # the usual chain: stretches of existing runs and of new pages
            existing = runs.get(pages[at])
            if existing is None:  # new pages up to the next page held somewhere
                if flags is None:
                    flags = list(map(runs.__contains__, pages))
                try:
                    end = flags.index(True, at + 1)
                except ValueError:
                    end = n
                chunk = pages[at:end] if at or end < n else pages
                fresh = _Run(chunk, prev, add, {bit: time})
                size = len(runs)
                runs.update(zip(chunk, repeat(fresh)))
                fresh_runs.append(fresh)
                if len(runs) - size != end - at:  # a new page repeats in the chain
                    break
                all_runs.add(fresh)
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
        else:
            at = -1
        if at >= 0:  # a new page repeats: the walk is undone and the chain stored page by page
            for fresh in fresh_runs:
                all_runs.discard(fresh)
                for page in fresh.pages:
                    runs.pop(page, None)
            stats.parent_mismatches = mismatches
            touched, fresh_runs = {}, []
            prev = None if parent is None or parent not in runs else parent
            fresh_run: _Run | None = None
            for page in pages:
                run = runs.get(page)
                if run is None:
                    if fresh_run is not None and fresh_run.pages[-1] == prev:
                        fresh_run.pages.append(page)
                    else:
                        fresh_run = _Run([page], prev, add, {bit: time})
                        all_runs.add(fresh_run)
                        fresh_runs.append(fresh_run)
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
        starts = [r.pages[0] for r in fresh_runs]
        for run, ranges in touched.items():
            gained = self._stored(run, ranges if len(ranges) == 1 else _merge(ranges), bit, add, time, merge=False)
            starts.extend(gained)
        for page in starts:  # pieces that gained the holder, and fresh runs: merged where their holders match
            run = runs.get(page)
            if run is not None and run.pages[0] == page and run.parent is not None:
                self._merge_left(run)

    def _stored(
        self, run: _Run, ranges: Ranges, bit: int, add: int, time: float, merge: bool = True
    ) -> list[PageHash]:
        """Holder `bit` (with its either bit, `add`) holds the pages of `run` at `ranges`, used at `time`.
        Returns the first pages of the pieces that gained the holder (merged here when `merge`)."""
        if run.mask >> bit & 1:  # held already: new times only
            for lo, hi in ranges:
                _set_time(run, bit, lo, hi, time)
            return []
        mask = run.mask | add
        if len(ranges) == 1 and ranges[0][0] == 0 and ranges[0][1] == len(run.pages):  # the whole run
            run.mask = mask
            run.times[bit] = time
            if merge and run.parent is not None:
                self._merge_left(run)
            return [run.pages[0]]
        gained: list[PageHash] = []
        for piece, hit in self._pieces(run, ranges, False):
            if hit:
                piece.mask = mask
                piece.times[bit] = time
                gained.append(piece.pages[0])
        if merge:
            for page in gained:
                piece = self._run[page]
                if piece.pages[0] == page and piece.parent is not None:
                    self._merge_left(piece)
        return gained

    def remove(self, node: NodeId, tier: Tier, pages: Iterable[PageHash]) -> int:
        """`node` no longer holds `pages` in `tier`; returns how many it did hold."""
        self.stats.events += 1
        idx = self._slots.index.get(node)
        if idx is None:
            self.stats.unknown_node_events += 1
            return 0
        t = TIER_INDEX[tier]
        bit = 3 * idx + t
        other, either = 1 << (3 * idx + 1 - t), 1 << (3 * idx + 2)
        pages = list(pages)
        touched, held = self._tail_ranges(pages, 1 << bit) or self._held_ranges(pages, 1 << bit)
        for run, ranges in touched.items():
            mask = run.mask & ~(1 << bit)
            if not mask & other:
                mask &= ~either
            if not mask:  # the pieces at `ranges` leave the directory
                self._pieces(run, ranges, True)
                continue
            for piece, hit in self._pieces(run, ranges, False):  # no merging here: it did not pay (see below)
                if hit:
                    piece.mask = mask
                    del piece.times[bit]
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
        tiers = (0, 1) if tier is None else (TIER_INDEX[tier],)
        return sum(self._clear_index(idx, t) for t in tiers)

    def touch(self, node: NodeId, tier: Tier, pages: Iterable[PageHash], time: float) -> int:
        """Set the last use of the `pages` that `node` holds in `tier` to `time`; returns pages updated."""
        idx = self._slots.index.get(node)
        if idx is None:
            return 0
        bit = 3 * idx + TIER_INDEX[tier]
        pages = list(pages)
        touched, held = self._held_ranges(pages, 1 << bit, count_repeats=True)
        for run, ranges in touched.items():
            for lo, hi in ranges:
                _set_time(run, bit, lo, hi, time)
        return held

    def _tail_ranges(self, pages: list[PageHash], bitmask: int) -> tuple[dict[_Run, Ranges], int] | None:
        """`_held_ranges` of victims that are the ends of runs, each deepest page first (the engine evicts the
        deepest of equally ranked pages first, so a chain loses its end): one probe per run and one slice
        comparison, no probe per page. None when the victims are not of that form (or a page is unknown)."""
        runs = self._run
        touched: dict[_Run, Ranges] = {}
        seen: set[_Run] = set()
        held = 0
        n = len(pages)
        i = 0
        while i < n:
            run = runs.get(pages[i])
            if run is None or run in seen:
                return None
            rp = run.pages
            size = len(rp)
            if rp[-1] != pages[i]:
                return None
            seen.add(run)
            k = min(size, n - i)
            tail = rp[size - k :]
            tail.reverse()
            if tail != pages[i : i + k]:
                k = _common(tail, 0, pages, i, k)
            if run.mask & bitmask:
                touched[run] = [(size - k, size)]
                held += k
            i += k
        return touched, held

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
        for run, group in groupby(zip(found, pages), _first):  # consecutive pages of one run come together
            if run is not None and run.mask & bitmask:
                chunk = by_run.get(run)
                if chunk is None:
                    by_run[run] = list(map(itemgetter(1), group))
                else:
                    chunk.extend(map(itemgetter(1), group))
        touched: dict[_Run, Ranges] = {}
        held = 0
        distinct = len(set(pages)) == len(pages)
        for run, chunk in by_run.items():
            held += len(chunk)
            if distinct:
                touched[run] = _positions(run.pages, chunk)
            else:
                rp = run.pages
                touched[run] = _ranges_of(sorted(set(map(rp.index, chunk))))
        if not distinct and not count_repeats:
            held = len({p for p, r in zip(pages, found) if r is not None and r.mask & bitmask})
        return touched, held

    def _pieces(self, run: _Run, ranges: Ranges, drop_hits: bool) -> list[tuple[_Run, bool]]:
        """Split `run` where `ranges` start and end; returns the pieces in chain order, each with whether it
        lies in `ranges` (the pieces in `ranges` leave the directory instead when `drop_hits`). The longest
        piece kept keeps the run object (fewer pages re-pointed); the others hold the same holders."""
        pages = run.pages
        n = len(pages)
        runs = self._run
        if len(ranges) == 1 and ranges[0][0] == 0 and ranges[0][1] == n:  # the whole run
            if drop_hits:
                self._runs.discard(run)
                for page in pages:
                    del runs[page]
                return []
            return [(run, True)]
        segments: list[tuple[int, int, bool]] = []
        at = 0
        for lo, hi in ranges:
            if lo > at:
                segments.append((at, lo, False))
            segments.append((lo, hi, True))
            at = hi
        if at < n:
            segments.append((at, n, False))
        kept = [seg for seg in segments if not (drop_hits and seg[2])]
        if not kept:
            return self._pieces(run, [(0, n)], True)
        keep = max(kept, key=lambda seg: seg[1] - seg[0])
        mask, times, parent = run.mask, run.times, run.parent
        all_runs = self._runs
        out: list[tuple[_Run, bool]] = []
        for seg in segments:
            lo, hi, hit = seg
            if drop_hits and hit:
                for page in pages[lo:hi]:
                    del runs[page]
                continue
            if seg is keep:
                piece = run
                run.parent = pages[lo - 1] if lo else parent
                run.times = _sliced(times, lo, hi)
            else:
                piece = _Run(pages[lo:hi], pages[lo - 1] if lo else parent, mask, _sliced(times, lo, hi))
                runs.update(zip(piece.pages, repeat(piece)))
                all_runs.add(piece)
            out.append((piece, hit))
        lo, hi, _ = keep
        run.pages = pages[lo:hi]
        return out

    def _merge_left(self, run: _Run) -> None:
        """Merge `run` with the run ending at its parent page when both have the same holders."""
        parent = run.parent
        runs = self._run
        left = None if parent is None else runs.get(parent)
        if left is None or left is run or left.mask != run.mask or left.pages[-1] != parent:
            return
        lt, rt = left.times, run.times
        nl, nr = len(left.pages), len(run.pages)
        cost = 0  # time entries the merged run stores per page beyond the two runs' own (see _MERGE_BUDGET)
        for b, a in lt.items():
            c = rt[b]
            if isinstance(a, array):
                cost += 0 if isinstance(c, array) else nr
            elif isinstance(c, array):
                cost += nl
            elif a != c:
                cost += nl + nr
        if cost > _MERGE_BUDGET:
            return
        times: Times = {}
        if nl >= nr:  # `run` joins the end of `left`
            for b, a in lt.items():
                c = rt[b]
                if isinstance(a, array):
                    if isinstance(c, array):
                        a.extend(c)
                    elif nr == 1:
                        a.append(c)
                    else:
                        a.extend(array("d", (c,)) * nr)
                    times[b] = a
                elif not isinstance(c, array) and a == c:
                    times[b] = a
                else:
                    times[b] = array("d", (a,)) * nl + _as_array(c, nr)
            left.pages.extend(run.pages)
            left.times = times
            runs.update(zip(run.pages, repeat(left)))
            drop = run
        else:  # `left` joins the start of `run`
            for b, c in rt.items():
                a = lt[b]
                if not isinstance(a, array) and not isinstance(c, array) and a == c:
                    times[b] = c
                else:
                    times[b] = _as_array(a, nl) + _as_array(c, nr)
            run.pages[:0] = left.pages
            run.parent = left.parent
            run.times = times
            runs.update(zip(left.pages, repeat(run)))
            drop = left
        self._runs.discard(drop)

    def _clear_index(self, idx: int, t: int) -> int:
        bit = 3 * idx + t
        held = 1 << bit
        holding = [run for run in self._runs if run.mask & held]
        other, either = 1 << (3 * idx + 1 - t), 1 << (3 * idx + 2)
        dropped = 0
        for run in holding:
            dropped += len(run.pages)
            mask = run.mask & ~(1 << bit)
            if not mask & other:
                mask &= ~either
            if not mask:
                self._pieces(run, [(0, len(run.pages))], True)
            else:
                run.mask = mask
                del run.times[bit]
        self.stats.pages_removed += dropped
        return dropped
