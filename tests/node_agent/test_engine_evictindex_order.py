"""The eviction order (`evictindex.EvictionOrder`) against its definition: after any sequence of the tier's
operations (stores, touches, pins and unpins, count changes and flips, evictions with and without `victims`,
victims put back), `victims(n, exclude)` returns the first `n` cached pages not in `exclude` sorted by
(policy key, rank), and every cached page is held under the module's invariant. Rebuilds are forced by a
small entry limit; a store at the same instant after an eviction gives a page a new depth under a key it had."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from evolving_infra.core.eviction import BranchCountEviction, EvictionPolicyName, HostPage, LruEviction
from evolving_infra.core.pages import PageHash
from evolving_infra.node_agent.engine.evictindex import EvictionOrder

PAGES = [PageHash(p) for p in (1, 2, 3, 5, 8, 2**63 + 7, 2**64 - 1, 2**40 + 3, 13, 21, 34, 55)]


class _CountModThree:
    """A policy the order cannot compute from (count > 0, last access): it asks `key` page by page."""

    def name(self) -> EvictionPolicyName | str:
        return "count-mod-three"

    def key(self, page: HostPage) -> tuple[float, ...]:
        return (float(page.count % 3), page.last_access)

    def victims(self, pages: Iterable[HostPage], n: int) -> list[PageHash]:  # pragma: no cover - unused
        raise NotImplementedError


POLICIES = {"branch": BranchCountEviction, "lru": LruEviction, "custom": _CountModThree}


class OrderMachine(RuleBasedStateMachine):
    """A tier's page tables driven the way `TierPool` drives them, with the order checked against them."""

    def __init__(self) -> None:
        super().__init__()
        self.cached: set[PageHash] = set()
        self.pinned: set[PageHash] = set()
        self.access: dict[PageHash, float] = {}
        self.counts: dict[PageHash, int] = {}
        self.depth: dict[PageHash, int] = {}
        self.now = 0.0

    @initialize(policy=st.sampled_from(sorted(POLICIES)), factor=st.sampled_from([1, 2, 8]), slack=st.integers(0, 4))
    def start(self, policy: str, factor: int, slack: int) -> None:
        self.policy = POLICIES[policy]()
        self.order = EvictionOrder(self.policy, self.cached, self.access, self.counts, self.depth)
        self.order._limit = lambda: factor * len(self.cached) + slack  # type: ignore[method-assign]  # force rebuilds

    # --- helpers -------------------------------------------------------------------------------------
    def _key(self, page: PageHash) -> tuple[float, ...]:
        return self.policy.key(HostPage(page, self.counts.get(page, 0), self.access[page]))

    def _expected(self, n: int, exclude: set[PageHash]) -> list[PageHash]:
        rank = lambda page: page - (self.depth[page] << 64)  # noqa: E731
        ordered = sorted(self.cached - exclude, key=lambda page: (self._key(page), rank(page)))
        return ordered[:n]

    def _evict(self, page: PageHash, keep_depth: bool) -> None:
        self.cached.discard(page)
        del self.access[page]
        if not keep_depth:  # (else the node's other tier still holds it)
            del self.depth[page]

    # --- rules ---------------------------------------------------------------------------------------
    @rule(dt=st.sampled_from([0.0, 0.0, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(
        depths=st.dictionaries(st.sampled_from(PAGES), st.integers(0, 3), min_size=1, max_size=6),
        pinned=st.booleans(),
        one=st.booleans(),
    )
    def store(self, depths: dict[PageHash, int], pinned: bool, one: bool) -> None:
        pages = depths.keys() - self.access.keys()
        for page in pages:
            self.depth.setdefault(page, depths[page])
            self.access[page] = self.now
        if pinned:
            self.pinned |= pages
        else:
            self.cached |= pages
            if one:
                for page in pages:
                    self.order.enter(page)
            else:
                self.order.enter_all(pages, self.now)

    @rule(picks=st.sets(st.sampled_from(PAGES)), how=st.sampled_from(["all", "each", "one"]))
    def touch(self, picks: set[PageHash], how: str) -> None:
        pages = picks & self.access.keys()
        for page in pages:
            self.access[page] = self.now
        cached = pages & self.cached
        if how == "all":
            self.order.enter_all(cached, self.now)
        elif how == "each":
            self.order.enter_each(list(cached))
        else:
            for page in cached:
                self.order.enter(page)

    @rule(picks=st.sets(st.sampled_from(PAGES)))
    def pin(self, picks: set[PageHash]) -> None:
        pages = picks & self.cached
        self.cached -= pages
        self.pinned |= pages

    @rule(picks=st.sets(st.sampled_from(PAGES)), touched=st.booleans())
    def unpin(self, picks: set[PageHash], touched: bool) -> None:
        pages = picks & self.pinned
        self.pinned -= pages
        self.cached |= pages
        if touched:
            for page in pages:
                self.access[page] = self.now
            self.order.enter_all(pages, self.now)
        else:
            self.order.enter_each(pages)

    @rule(changes=st.dictionaries(st.sampled_from(PAGES), st.integers(0, 4), max_size=6), one=st.booleans())
    def recount(self, changes: dict[PageHash, int], one: bool) -> None:
        flipped = {page for page, count in changes.items() if (count > 0) != (page in self.counts)}
        for page, count in changes.items():
            if count:
                self.counts[page] = count
            else:
                self.counts.pop(page, None)
        if one:  # `TierPool.rekey`, page by page
            for page in changes:
                if page in self.cached and self.order.keyed_by_count:
                    self.order.enter(page)
        else:
            self.order.recount(list(changes), flipped)

    @rule(picks=st.sets(st.sampled_from(PAGES), max_size=3), keep_depth=st.booleans())
    def remove(self, picks: set[PageHash], keep_depth: bool) -> None:
        for page in picks & self.cached:
            self._evict(page, keep_depth)

    @precondition(lambda self: hasattr(self, "order"))
    @rule(
        n=st.integers(0, 5),
        exclude=st.sets(st.sampled_from(PAGES), max_size=4),
        then=st.sampled_from(["evict", "evict", "put back"]),
        keep_depth=st.booleans(),
    )
    def victims(self, n: int, exclude: set[PageHash], then: str, keep_depth: bool) -> None:
        expected = self._expected(n, exclude)
        got = self.order.victims(n, frozenset(exclude) if exclude else ())
        assert got == expected
        if then == "put back":  # `TierRuns.room_for_run` declining: they stay cached
            self.order.enter_each(got)
        else:
            for page in got:
                self._evict(page, keep_depth)

    # --- invariants ----------------------------------------------------------------------------------
    @precondition(lambda self: hasattr(self, "order"))
    @invariant()
    def every_cached_page_is_held(self) -> None:
        assert all(self.order.holds(page) for page in self.cached)

    @precondition(lambda self: hasattr(self, "order"))
    @invariant()
    def entries_are_counted_and_indexed(self) -> None:
        buckets = self.order._buckets
        assert self.order._size == sum(len(b.members) for b in buckets.values())
        assert sorted(self.order._keys) == sorted(buckets)
        for key, bucket in buckets.items():
            if bucket.order is not None:  # an ordered bucket: its live members in descending rank (a stale
                assert set(bucket.order) <= bucket.members  # one's page may be back with another depth)
                live = [page for page in bucket.order if page in self.cached and self._key(page) == key]
                ranks = [page - (self.depth[page] << 64) for page in live]
                assert ranks == sorted(ranks, reverse=True)


OrderMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_order_machine = OrderMachine.TestCase


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_bucket_joined_after_ordering_stays_exact(policy: str) -> None:
    """Pages joining a bucket that was already ordered (and partly taken) merge into its order."""
    cached: set[PageHash] = set()
    access: dict[PageHash, float] = {}
    depth: dict[PageHash, int] = {}
    order = EvictionOrder(POLICIES[policy](), cached, access, {}, depth)
    for i, page in enumerate(PAGES[:6]):
        cached.add(page)
        access[page] = 1.0
        depth[page] = i % 3
    order.enter_all(set(PAGES[:6]), 1.0)
    first = order.victims(2, ())
    for page in first:
        cached.discard(page)
    for i, page in enumerate(PAGES[6:]):
        cached.add(page)
        access[page] = 1.0
        depth[page] = i % 4
    order.enter_all(set(PAGES[6:]), 1.0)
    rest = order.victims(len(PAGES), ())
    rank = lambda page: page - (depth[page] << 64)  # noqa: E731
    assert first == sorted(PAGES[:6], key=rank)[:2]
    assert rest == sorted(set(PAGES) - set(first), key=rank)


def _tables() -> tuple[set[PageHash], dict[PageHash, float], dict[PageHash, int], dict[PageHash, int]]:
    return set(), {}, {}, {}


def test_a_page_back_at_its_old_key_with_another_depth_is_ordered_by_the_new_one() -> None:
    """An ordered entry whose page left both tiers and came back under the same key with another depth."""
    cached, access, counts, depth = _tables()
    order = EvictionOrder(BranchCountEviction(), cached, access, counts, depth)
    p, q, r = PAGES[0], PAGES[1], PAGES[2]
    for page, d in ((p, 0), (q, 3), (r, 1)):
        cached.add(page)
        access[page] = 0.0
        depth[page] = d
    order.enter_all({p, q, r}, 0.0)
    assert order.victims(1, ()) == [q]  # the deepest; p and r stay ordered
    cached.discard(q)
    cached.discard(p)  # evicted without `victims`, from both tiers
    del depth[p]
    cached.add(p)  # stored again at the same instant, now deeper than r
    depth[p] = 2
    order.enter(p)
    assert all(order.holds(page) for page in cached)
    assert order.victims(3, ()) == [p, r]


def test_a_count_flip_to_positive_moves_an_ordered_entry_when_met() -> None:
    cached, access, counts, depth = _tables()
    order = EvictionOrder(BranchCountEviction(), cached, access, counts, depth)
    p, q, r = PAGES[0], PAGES[1], PAGES[2]
    for page, d, when in ((p, 0, 0.0), (q, 3, 0.0)):
        cached.add(page)
        access[page] = when
        depth[page] = d
        order.enter(page)
    assert order.victims(1, ()) == [q]
    cached.discard(q)
    counts[p] = 1
    order.recount([p], [p])  # (0, 0) -> (1, 0): the entry stays under (0, 0)
    assert order.holds(p)
    cached.add(r)
    access[r] = 1.0
    depth[r] = 0
    order.enter_all({r}, 1.0)
    assert order.victims(2, ()) == [r, p]  # (0, 1) before (1, 0)


def test_a_count_flip_to_positive_moves_a_fresh_entry_when_ordered() -> None:
    cached, access, counts, depth = _tables()
    order = EvictionOrder(BranchCountEviction(), cached, access, counts, depth)
    p, q, r = PAGES[0], PAGES[1], PAGES[2]
    for page, d in ((p, 0), (q, 1), (r, 2)):
        cached.add(page)
        access[page] = 0.0
        depth[page] = d
    order.enter_all({p, q, r}, 0.0)
    counts[q] = 2
    order.recount([q], [q])
    assert order.victims(3, ()) == [r, p, q]
