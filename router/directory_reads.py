"""The read side of the KV directory (`directory.KvDirectory` inherits it): its invariant check and its queries:
a page's parent and holders, a node's pages and their last use, and the longest-prefix lookup of a prompt.

Boundary: reads only; every change of the directory's state is `directory`'s (events, nodes, runs).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory_runs import _Run, _common
from evolving_infra.router.prefix_match import PrefixMatch, bits_of, match_from_stretches

TIER_INDEX: dict[Tier, int] = {Tier.GPU: 0, Tier.HOST: 1}
"""A tier's offset t in a holder bit 3i + t."""


@dataclass(slots=True)
class NodeSlots:
    """Node id <-> bit index, reusing the lowest free index first."""

    index: dict[NodeId, int] = field(default_factory=dict)
    ids: list[NodeId | None] = field(default_factory=list)
    free: list[int] = field(default_factory=list)


class DirectoryReads:
    """Queries over the directory's runs (the state is `KvDirectory`'s; see its module docstring)."""

    __slots__ = ()
    _slots: NodeSlots
    _run: dict[PageHash, _Run]
    _runs: set[_Run]
    _tier_bits: list[int]
    _index_ids: tuple[dict[NodeId, int], tuple[NodeId | None, ...]] | None

    def check(self) -> None:
        """Raise `AssertionError` naming the first invariant of the module docstring that does not hold."""
        runs = {id(run): run for run in self._run.values()}
        assert len(self._run) == sum(len(run.pages) for run in runs.values()), "a page maps to a run without it"
        for run in runs.values():
            assert run.pages and len(set(run.pages)) == len(run.pages), "a run is empty or repeats a page"
            assert all(self._run.get(page) is run for page in run.pages), "a run's page maps elsewhere"
            assert run.mask, "a run without holders"
            bits = {b for b in range(run.mask.bit_length()) if run.mask >> b & 1 and b % 3 != 2}
            assert set(run.times) == bits, f"times {sorted(run.times)} != holder bits {sorted(bits)}"
            for b in range(2, run.mask.bit_length() + 1, 3):
                assert bool(run.mask >> b & 1) == bool(run.mask >> (b - 1) & 3), "an either bit disagrees"
            for b, v in run.times.items():
                assert not isinstance(v, array) or len(v) == len(run.pages), "a time array of the wrong length"
            free = {3 * i + t for i, node in enumerate(self._slots.ids) if node is None for t in range(3)}
            assert not any(run.mask >> b & 1 for b in free), "a mask carries a free node index"
        assert set(runs) == {id(r) for r in self._runs}, "_runs disagrees with the runs pages map to"

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
        t = TIER_INDEX[tier]
        run = self._run.get(page)
        mask = 0 if run is None else run.mask & self._tier_bits[t]
        return frozenset(node for _, node in bits_of(mask, self._slots.ids))

    def last_used(self, page: PageHash, node: NodeId, tier: Tier) -> float | None:
        """When `node` last used `page` in `tier`, or None if it does not hold it there."""
        idx = self._slots.index.get(node)
        run = self._run.get(page)
        if idx is None or run is None:
            return None
        v = run.times.get(3 * idx + TIER_INDEX[tier])
        if isinstance(v, array):
            return v[run.pages.index(page)]
        return v

    def pages_on(self, node: NodeId, tier: Tier) -> dict[PageHash, float]:
        """A copy of the pages `node` holds in `tier`, with their last-use times."""
        idx = self._slots.index.get(node)
        if idx is None:
            return {}
        bit = 3 * idx + TIER_INDEX[tier]
        out: dict[PageHash, float] = {}
        held = 1 << bit
        for run in self._runs:
            if not run.mask & held:
                continue
            v = run.times[bit]
            out.update(zip(run.pages, v if isinstance(v, array) else repeat(v)))
        return out

    def held_count(self, node: NodeId, tier: Tier) -> int:
        idx = self._slots.index.get(node)
        if idx is None:
            return 0
        held = 1 << (3 * idx + TIER_INDEX[tier])
        return sum(len(run.pages) for run in self._runs if run.mask & held)

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
            self._index_ids = ({node: 3 * i for node, i in self._slots.index.items()}, tuple(self._slots.ids))  # type: ignore[misc]  # a slot of KvDirectory
        index, ids = self._index_ids
        return match_from_stretches(n, stretches, p, index, ids, self._tier_bits[1], self._tier_bits[2])
