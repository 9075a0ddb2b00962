"""The id-array tier (`idpages`, work in progress) against `TierPool` as its oracle: the same operations
(chains stored cached or pinned, pins by several owners, releases, touches, count flips, evictions with and
without excluded pages) at times that often tie, and after each the same resident, cached and pinned pages,
the same last accesses, and every eviction choosing the same pages in the same order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.idpages import CACHED, PINNED, IdTier, PageIds, held_prefix
from evolving_infra.node_agent.engine.tier import TierPool

OWNERS = ["a", "b", "c"]


class IdTierMachine(RuleBasedStateMachine):
    @initialize(lru=st.booleans(), capacity=st.integers(4, 24), peer_capacity=st.integers(4, 24), dense=st.booleans())
    def start(self, lru: bool, capacity: int, peer_capacity: int, dense: bool) -> None:
        policy = LruEviction() if lru else BranchCountEviction()
        self.counts: dict[PageHash, int] = {}
        depth: dict[PageHash, int] = {}
        # two tiers sharing their pages' depths (as a node's L1 and L2 do), each against its oracle
        self.oracles = [
            TierPool(Tier.HOST, capacity, policy, self.counts, depth),
            TierPool(Tier.GPU, peer_capacity, LruEviction(), self.counts, depth),
        ]
        self.oracles[0]._peer, self.oracles[1]._peer = self.oracles[1], self.oracles[0]
        # (its own counts: by id for held pages, the oracles' in `self.counts`); `dense`: pages named by consecutive
        # labels, as the simulator names them, and the ids kept by blocks of labels
        self.ids = PageIds(dense=dense)
        self.dense = dense
        self.tiers = [IdTier("host", capacity, policy, self.ids), IdTier("gpu", peer_capacity, LruEviction(), self.ids)]
        self.side = 0
        self.oracle, self.tier = self.oracles[0], self.tiers[0]
        self.depth = depth
        self.now = 0.0
        self.next_page = 1
        self.kept: list[tuple[list[PageHash], object, object]] = []

    @rule(side=st.integers(0, 1))
    def switch_tier(self, side: int) -> None:
        """The following operations go to the other tier (which shares the page ids and depths)."""
        self.oracle, self.tier = self.oracles[side], self.tiers[side]

    def _new_page(self) -> PageHash:
        if self.dense:
            page = PageHash(40 + self.next_page)  # (crossing blocks of labels as runs grow)
        else:
            page = PageHash((self.next_page * 0x9E3779B97F4A7C15) % 2**64)  # spread over the hash range
        self.next_page += 1
        return page

    def _resident(self) -> list[PageHash]:
        return sorted(self.oracle.resident())

    def _ids(self, pages: list[PageHash]):  # type: ignore[no-untyped-def]
        return self.ids.ids(pages)

    def _evict(self, n: int, exclude: frozenset[PageHash] = frozenset()) -> None:
        expected = self.oracle.victims(n, exclude)
        self.oracle.remove_victims(expected)
        got = self.tier.evict(n, self._ids(sorted(exclude)) if exclude else None)
        assert self.ids.hash_of(got) == expected

    @rule(dt=st.sampled_from([0.0, 0.0, 1.0, 2.5]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(k=st.integers(1, 6), extend=st.booleans(), owner=st.sampled_from([None, *OWNERS]),
          from_peer=st.booleans(), data=st.data())  # fmt: skip
    def store_chain(self, k: int, extend: bool, owner: str | None, from_peer: bool, data: st.DataObject) -> None:
        """A chain of new pages, or (`from_peer`) pages the other tier holds and this one lacks, in chain order."""
        k = min(k, self.oracle.capacity - len(self.oracle.pinned_pages()))
        if k <= 0:
            return
        items: dict[PageHash, PageHash | None] = {}
        if from_peer:
            peer = self.oracles[1] if self.oracle is self.oracles[0] else self.oracles[0]
            lacking = sorted(peer.resident() - self.oracle.resident() - set(self.oracle.writing_set()), key=lambda p: (self.depth[p], p))
            for page in lacking[:k]:
                items[page] = peer.parent(page)
            if not items:
                return
            k = len(items)
        else:
            resident = sorted(set(self._resident()) | set(self.depth))
            parent = data.draw(st.sampled_from(resident)) if extend and resident else None
            for _ in range(k):
                page = self._new_page()
                items[page] = parent
                parent = page
        need = k - self.oracle.free
        if need > 0:
            if self.oracle.evictable() < need:
                return
            self._evict(need)
        self.oracle.insert_all(items, self.now, owner=owner)
        self.tier.insert(items, self.now, owner)

    @precondition(lambda self: bool(self.oracle.resident()))
    @rule(owner=st.sampled_from(OWNERS), data=st.data())
    def pin(self, owner: str, data: st.DataObject) -> None:
        pages = data.draw(st.sets(st.sampled_from(self._resident()), min_size=1))
        self.oracle.pin_all(owner, pages, self.now)
        self.tier.pin(owner, self._ids(sorted(pages)), self.now)

    @rule(owner=st.sampled_from(OWNERS))
    def release(self, owner: str) -> None:
        self.oracle.unpin_all(owner, self.now)
        self.tier.unpin_all(owner, self.now)

    @precondition(lambda self: bool(self.oracle.resident()))
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        pages = data.draw(st.sets(st.sampled_from(self._resident()), min_size=1))
        self.oracle.touch_all(pages, self.now)
        self.tier.touch(self._ids(sorted(pages)), self.now)

    @precondition(lambda self: bool(self.oracle.resident()))
    @rule(counted=st.booleans(), value=st.integers(1, 3), data=st.data())
    def count(self, counted: bool, value: int, data: st.DataObject) -> None:
        pages = data.draw(st.sets(st.sampled_from(self._resident()), min_size=1))
        flipped = [p for p in pages if (p in self.counts) != counted]
        for page in pages:
            if counted:
                self.counts[page] = value
            else:
                self.counts.pop(page, None)
        for oracle in self.oracles:
            oracle.counts_changed(pages, flipped)
        self.ids.set_count(self._ids(sorted(pages)), value if counted else 0)

    @rule(owner=st.sampled_from(OWNERS), n=st.integers(0, 3), back=st.booleans())
    def reserve(self, owner: str, n: int, back: bool) -> None:
        if back:
            assert self.oracle.unreserve(owner, n) == self.tier.unreserve(owner, n)
        elif n <= self.oracle.free:
            self.oracle.reserve(owner, n)
            self.tier.reserve(owner, n)

    @rule(owner=st.sampled_from(OWNERS), k=st.integers(1, 3), extend=st.booleans(), data=st.data())
    def store_reserved(self, owner: str, k: int, extend: bool, data: st.DataObject) -> None:
        """`owner` stores new pages (a decode's generated ones) into slots it reserved."""
        k = min(k, self.oracle.reserved_by(owner))
        if k <= 0:
            return
        held = sorted(self.depth)
        parent = data.draw(st.sampled_from(held)) if extend and held else None
        items = {}
        for _ in range(k):
            page = self._new_page()
            items[page] = parent
            parent = page
        self.oracle.insert_all(items, self.now, owner=owner, slots="reserved")
        self.tier.insert(items, self.now, owner, slots="reserved")

    @rule(owner=st.sampled_from(OWNERS), data=st.data())
    def begin_write(self, owner: str, data: st.DataObject) -> None:
        """A fetch starts: a page the peer tier holds (or a new one) is written into a free slot."""
        peer = self.oracles[1] if self.oracle is self.oracles[0] else self.oracles[0]
        candidates = sorted(peer.resident() - self.oracle.resident() - set(self.oracle.writing_set()))
        page = data.draw(st.sampled_from(candidates)) if candidates and data.draw(st.booleans()) else self._new_page()
        if self.oracle.free < 1:
            return
        self.oracle.begin_write(owner, page)
        self.tier.begin_write(owner, page)

    @precondition(lambda self: bool(self.oracle.writing))
    @rule(data=st.data(), land=st.booleans())
    def finish_write(self, data: st.DataObject, land: bool) -> None:
        """A write lands (the page becomes resident, pinned by its writer) or is cancelled."""
        page = data.draw(st.sampled_from(sorted(self.oracle.writing_set())))
        owner = self.oracle.writer(page)
        assert self.tier.writer(page) == owner
        if land:
            parent = self.oracles[0].parent(page) if self.oracles[0].contains(page) else None
            if parent is None and self.oracles[1].contains(page):
                parent = self.oracles[1].parent(page)
            self.oracle.insert_all({page: parent}, self.now, owner=owner, slots="writing")
            self.tier.insert({page: parent}, self.now, owner, slots="writing")
        else:
            self.oracle.cancel_write(page)
            self.tier.cancel_write(page)

    @precondition(lambda self: self.oracle.evictable() > 0)
    @rule(data=st.data())
    def remove_some(self, data: st.DataObject) -> None:
        """Cached pages evicted by name (not in eviction order)."""
        cached = sorted(self.oracle.resident() - self.oracle.pinned_pages())
        pages = data.draw(st.sets(st.sampled_from(cached), min_size=1))
        ids = self._ids(sorted(pages))
        self.oracle.remove_all(pages)
        self.tier.remove(ids)

    @precondition(lambda self: bool(self.oracle.owners()))
    @rule(data=st.data())
    def unpin_one(self, data: st.DataObject) -> None:
        """An owner drops its pin on one page without touching it."""
        owners = sorted(o for o in self.oracle.owners() if self.oracle.pinned_by(o))
        if not owners:
            return
        owner = data.draw(st.sampled_from(owners))
        page = data.draw(st.sampled_from(sorted(self.oracle.pinned_by(owner))))
        i = int(self._ids([page])[0])
        self.oracle.unpin(owner, page)
        self.tier.unpin(owner, i)

    @rule(data=st.data(), fresh=st.integers(0, 4), take=st.booleans())
    def plan_run(self, data: st.DataObject, fresh: int, take: bool) -> None:
        """A run's write plan (`room_for_run`): held pages of either tier in depth order, then `fresh` new
        pages chained after the last; the same missing pages and victims, or both decline. Taken: the victims
        are evicted; else put back."""
        held = sorted(self.depth, key=lambda p: (self.depth[p], p))
        chosen = data.draw(st.lists(st.sampled_from(held), unique=True, max_size=6)) if held else []
        chosen.sort(key=lambda p: (self.depth[p], p))
        parents: dict[PageHash, PageHash | None] = {}
        for page in chosen:
            owner = self.oracles[0] if self.oracles[0].contains(page) else self.oracles[1]
            parents[page] = owner.parent(page)
        parent = chosen[-1] if chosen else None
        for _ in range(fresh):
            page = self._new_page()
            parents[page] = parent
            parent = page
        if not parents:
            return
        pages = set(parents)
        expected = self.oracle.room_for_run(pages, self.now, parents)
        got = self.tier.room_for_run(pages, self.now, parents)
        if expected is None:
            assert got is None
            return
        assert got is not None
        assert got[0] == expected[0]
        assert self.ids.hash_of(got[1]) == expected[1]
        if take:
            self.oracle.remove_victims(expected[1])
            self.tier.remove(got[1])
        else:
            self.oracle._order.enter_each(expected[1])
            self.tier.order.enter(got[1])

    @rule(data=st.data())
    def keep_prompt(self, data: st.DataObject) -> None:
        """A request keeps its prompt's (ids, generations); later, refreshed, they equal a fresh lookup, however
        many pages were evicted (ids freed and reused) or stored in between."""
        held = sorted(self.depth)
        prompt = data.draw(st.lists(st.sampled_from(held + [self._new_page()]), max_size=8))
        self.kept.append((prompt, *self.ids.resolve(prompt)))

    @invariant()
    def kept_prompts_refresh(self) -> None:
        for prompt, ids, gens in getattr(self, "kept", []):
            now_ids, now_gens = self.ids.refresh(prompt, ids, gens)
            assert now_ids.tolist() == self.ids.lookup(prompt).tolist()
            assert now_gens.tolist() == self.ids.resolve(prompt)[1].tolist()

    @rule(data=st.data())
    def prefix_walk(self, data: st.DataObject) -> None:
        """A prompt's reusable prefix (the walk of `PrefillScheduler._admit_gpu`: pages L1 or L2 holds, up
        to the first neither holds) from the id masks equals the page-by-page walk."""
        held = sorted(self.depth)
        prompt = data.draw(st.lists(st.sampled_from(held + [self._new_page()]), max_size=8))
        ids = self.ids.lookup(prompt)
        k = 0
        for page in prompt:
            if not (self.oracles[0].contains(page) or self.oracles[1].contains(page)):
                break
            k += 1
        assert held_prefix(self.tiers[0].holds(ids), self.tiers[1].holds(ids)) == k
        assert self.tiers[0].holds(ids).tolist() == [self.oracles[0].contains(p) for p in prompt]

    @precondition(lambda self: self.oracle.evictable() > 0)
    @rule(data=st.data(), with_exclude=st.booleans())
    def evict(self, data: st.DataObject, with_exclude: bool) -> None:
        exclude: frozenset[PageHash] = frozenset()
        if with_exclude:
            exclude = frozenset(data.draw(st.sets(st.sampled_from(self._resident()), max_size=3)))
        n = data.draw(st.integers(1, self.oracle.evictable(exclude) or 1))
        if self.oracle.evictable(exclude) < n:
            return
        self._evict(n, exclude)

    @invariant()
    def same_pages(self) -> None:
        if not hasattr(self, "oracle"):
            return
        for oracle, tier in zip(self.oracles, self.tiers):
            tier.check()
            resident = sorted(oracle.resident())
            ids = self._ids(resident)
            assert tier.resident == len(resident)
            gauges = oracle.gauges()
            assert (tier.free, tier.in_use) == (gauges.free, gauges.in_use)
            pinned = oracle.pinned_pages()
            assert tier.state[ids].tolist() == [PINNED if p in pinned else CACHED for p in resident]
            assert tier.cached == len(resident) - len(pinned)
            assert tier.access[ids].tolist() == [oracle.last_access(p) for p in resident]
        held = sorted(self.depth)
        assert len(self.ids) == len(held)
        # the counts: by id while a tier holds the page, by hash after (until it is held again)
        assert dict(self.ids.counts_view()) == self.counts
        assert self.ids.counted[self._ids(held)].tolist() == [p in self.counts for p in held]
        assert not self.ids.counts.keys() & set(held)
        assert self.ids.depth[self._ids(held)].tolist() == [self.depth[p] for p in held]


IdTierMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestIdTier = IdTierMachine.TestCase


@pytest.mark.parametrize("n", [1])
def test_depths_follow_chains(n: int) -> None:
    ids = PageIds()
    tier = IdTier("host", 8, BranchCountEviction(), ids)
    got = tier.insert({PageHash(10): None, PageHash(11): PageHash(10), PageHash(12): PageHash(11)}, 0.0)
    assert ids.depth[got].tolist() == [0, 1, 2]
    # the deepest page goes first among pages of one key
    assert ids.hash_of(tier.evict(n)) == [12]


def _table(ids: PageIds) -> tuple[object, ...]:
    live = sorted(ids._id.items())
    at = [i for _, i in live]
    return (
        live, ids.depth[at].tolist(), ids.hashes[at].tolist(), ids.holders[at].tolist(), ids.counted[at].tolist(),
        list(ids._free), ids._next,
    )  # fmt: skip


@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 79), st.integers(1, 60), st.booleans()), max_size=25),
    st.sets(st.integers(0, 159), max_size=40),
)
@example([(0, 10, 10, False), (0, 40, 5, False), (0, 20, 40, False)], set())  # parent known, new, known, new
@example([(0, 0, 30, True), (0, 20, 20, False), (0, 0, 50, False)], {10})  # freed ids reused around known pages
@example([(0, 0, 5, False), (0, 0, 40, False)], set())  # a run below the size the block path takes
def test_a_run_interned_at_once_equals_page_by_page(ops: list[tuple[int, int, int, bool]], counted: set[int]) -> None:
    """`intern_run` of a chain where some pages have ids already (a stretch at the start, in the middle, at the
    end, several), with freed ids waiting to be reused: the same ids, depths, hashes, counted flags and free list
    as interning page by page. `drop` frees the ids of a run again when the flag says so."""
    chains = [[PageHash(1000 * c + i + 1) for i in range(80)] for c in range(2)]
    tables = [PageIds({chains[j // 80][j % 80]: 1 for j in counted}) for _ in range(2)]
    for c, start, n, free in ops:
        pages = chains[c][start : start + n]
        items = {p: (chains[c][start + j - 1] if start + j else None) for j, p in enumerate(pages)}
        got = [
            tables[0].intern_run(items),
            np.array([tables[1].intern(p, q) for p, q in items.items()], dtype=np.int64),
        ]
        assert got[0].tolist() == got[1].tolist()
        for table, ids in zip(tables, got):
            table.hold(ids)
            if free:
                table.drop(ids)
        assert _table(tables[0]) == _table(tables[1])


@given(st.lists(st.integers(0, 63), max_size=40), st.lists(st.integers(0, 63), max_size=40), st.integers(0, 3))
def test_any_in_is_isin_and_leaves_its_scratch_clear(ids: list[int], among: list[int], grow: int) -> None:
    """`PageIds.any_in` (a victim plan's check that no victim is one of the run's own pages) against numpy's isin,
    called twice (its scratch marks are cleared after each call) and across a growth of the tables."""
    table = PageIds(capacity=16)
    for i in range(64 + 64 * grow):
        table.intern(PageHash(10_000 + i), None)  # the tables grow past 64 ids
    a, b = np.array(ids, dtype=np.int64), np.array(among, dtype=np.int64)
    expected = bool(np.isin(a, b).any())
    assert table.any_in(a, b) is expected
    assert table.any_in(a, b) is expected
    assert not table._mark.any()
    assert table.any_in(b.astype(np.int32), a) is bool(np.isin(b, a).any())
