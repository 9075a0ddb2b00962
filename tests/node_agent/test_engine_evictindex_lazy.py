"""Lower-bound entries of the eviction order (`evictindex`, coarse keys) driven through a `TierPool`: after any
sequence of the tier's operations (stores page by page and as runs, cached or pinned; touches of one page
and of runs; pins and unpins, one page or all of an owner's, with later pin touches; count changes both ways,
pushed as a batch or page by page; removals, one page or several; evictions with and without an excluded
set; `room_for_run` plans taken or put back; rebuilds forced by a small entry limit), the tier's `check`
holds (the lower-bound invariant among them) and the whole order, peeked on a copy, is the cached pages
sorted by (policy key, rank), with and without excluded pages. Also: touching cached pages enters nothing,
and a release enters only pages without an entry."""

from __future__ import annotations

import copy
from collections.abc import Container, Iterable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from evolving_infra.core.eviction import BranchCountEviction, EvictionPolicyName, HostPage, LruEviction
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.evictindex import EvictionOrder, _Bucket
from evolving_infra.node_agent.engine.tier import TierPool

PAGES = [PageHash(p) for p in (1, 2, 3, 5, 8, 2**63 + 7, 2**64 - 1, 2**40 + 3, 13, 21, 34, 55, 89, 144)]
FEW = PAGES[:9]  # the machine's pages: few, so that one page meets many operations
OWNERS = ["a", "b", "c"]
EXCLUDED = frozenset(FEW[1::3])


class _CountModThree:
    """A policy whose key can fall with any count change (entries stay exact for it)."""

    def name(self) -> EvictionPolicyName | str:
        return "count-mod-three"

    def key(self, page: HostPage) -> tuple[float, ...]:
        return (float(page.count % 3), page.last_access)

    def victims(self, pages: Iterable[HostPage], n: int) -> list[PageHash]:  # pragma: no cover - unused
        raise NotImplementedError


POLICIES = {"branch": BranchCountEviction, "lru": LruEviction, "custom": _CountModThree}


def peek_victims(order: EvictionOrder, exclude: Container[PageHash] = ()) -> list[PageHash]:
    """What `order.victims` returns for every cached page not in `exclude`, taken from a copy of the order's
    buckets, heap and entered set (the order itself is left as it was; the tier's tables are only read)."""
    twin = copy.copy(order)
    twin._buckets = {}
    for key, bucket in order._buckets.items():
        twin._buckets[key] = copied = _Bucket(set(bucket.members))
        copied.order = None if bucket.order is None else list(bucket.order)
    twin._keys = list(order._keys)
    twin._entered = set(order._entered)
    return twin.victims(len(order._cached) + 1, exclude)


class TierMachine(RuleBasedStateMachine):
    """One `TierPool` (no peer tier) with its counts table, driven as `KvPool` drives it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[PageHash, int] = {}
        self.now = 0.0

    @initialize(
        policy=st.sampled_from(sorted(POLICIES)),
        capacity=st.integers(3, len(FEW)),
        factor=st.sampled_from([1, 2, 8]),
        slack=st.integers(0, 4),
    )
    def start(self, policy: str, capacity: int, factor: int, slack: int) -> None:
        self.policy = POLICIES[policy]()
        self.pool = TierPool(Tier.HOST, capacity, self.policy, self.counts)
        cached = self.pool._cached
        self.pool._order._limit = lambda: factor * len(cached) + slack  # type: ignore[method-assign]  # rebuilds

    # --- helpers -------------------------------------------------------------------------------------
    def _expected(self, n: int, exclude: Container[PageHash]) -> list[PageHash]:
        pool = self.pool

        def sort_key(page: PageHash) -> tuple[tuple[float, ...], int]:
            snapshot = HostPage(page, self.counts.get(page, 0), pool.last_access(page))
            return self.policy.key(snapshot), page - (pool._depth[page] << 64)

        return sorted((p for p in pool._cached if p not in exclude), key=sort_key)[:n]

    def _resident(self, picks: Iterable[PageHash]) -> list[PageHash]:
        return [page for page in picks if self.pool.contains(page)]

    def _cached(self, picks: Iterable[PageHash]) -> list[PageHash]:
        return [page for page in picks if page in self.pool._cached]

    # --- rules ---------------------------------------------------------------------------------------
    @precondition(lambda self: hasattr(self, "pool"))
    @rule(dt=st.sampled_from([0.0, 0.0, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(picks=st.lists(st.sampled_from(FEW), unique=True, min_size=1, max_size=5),
          owner=st.sampled_from([None, *OWNERS]), run=st.booleans())  # fmt: skip
    def store(self, picks: list[PageHash], owner: str | None, run: bool) -> None:
        pages = [page for page in picks if not self.pool.contains(page)][: self.pool.free]
        if not pages:
            return
        items = dict(zip(pages, [None, *pages[:-1]]))  # one chain
        if run:
            self.pool.insert_all(items, self.now, owner=owner)
        else:
            for page, parent in items.items():
                self.pool.insert(page, parent, self.now, pin_owner=owner)

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(picks=st.sets(st.sampled_from(FEW)), run=st.booleans())
    def touch(self, picks: set[PageHash], run: bool) -> None:
        pages = set(self._resident(picks))
        if run:
            self.pool.touch_all(pages, self.now)
        else:
            for page in pages:
                self.pool.touch(page, self.now)

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(picks=st.sets(st.sampled_from(FEW), max_size=5), owner=st.sampled_from(OWNERS), run=st.booleans())
    def pin(self, picks: set[PageHash], owner: str, run: bool) -> None:
        pages = self._resident(picks)
        if run:
            self.pool.pin_all(owner, pages, self.now)
        else:
            for page in pages:
                self.pool.pin(owner, page, self.now)

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(owner=st.sampled_from(OWNERS), picks=st.sets(st.sampled_from(FEW), max_size=3), every=st.booleans())
    def unpin(self, owner: str, picks: set[PageHash], every: bool) -> None:
        if every:
            self.pool.unpin_all(owner, self.now)
            return
        for page in picks:
            if self.pool.is_pinned_by(owner, page):
                self.pool.unpin(owner, page)

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(changes=st.dictionaries(st.sampled_from(FEW), st.integers(0, 4), max_size=6), one=st.booleans())
    def recount(self, changes: dict[PageHash, int], one: bool) -> None:
        """`KvPool.set_counts`: the counts table changes, then each tier hears of it."""
        flipped = [page for page, count in changes.items() if (count > 0) != (page in self.counts)]
        for page, count in changes.items():
            if count:
                self.counts[page] = count
            else:
                self.counts.pop(page, None)
        if one:
            for page in self._resident(changes):
                self.pool.rekey(page)
        else:
            self.pool.counts_changed(changes, flipped)

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(picks=st.sets(st.sampled_from(FEW), max_size=3), run=st.booleans())
    def remove(self, picks: set[PageHash], run: bool) -> None:
        pages = self._cached(picks)
        if run:
            self.pool.remove_all(pages)
        else:
            for page in pages:
                self.pool.remove(page)

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(n=st.integers(0, 6), exclude=st.sets(st.sampled_from(FEW), max_size=4))
    def evict(self, n: int, exclude: set[PageHash]) -> None:
        expected = self._expected(n, exclude)
        got = self.pool.victims(n, frozenset(exclude))
        assert got == expected
        self.pool.remove_victims(got)

    @precondition(lambda self: hasattr(self, "pool"))
    @rule(picks=st.lists(st.sampled_from(FEW), unique=True, min_size=1, max_size=6))
    def write_run(self, picks: list[PageHash]) -> None:
        """`KvPool._write_through`: plan a run's room, then evict, touch and insert by the plan (or nothing:
        the victims were put back)."""
        parents = dict(zip(picks, [None, *picks[:-1]]))
        pages = set(picks)
        need = len(pages.difference(self.pool.resident_set())) - self.pool.free
        expected = self._expected(max(need, 0), ())
        plan = self.pool.room_for_run(pages, self.now, parents)
        if plan is None:
            return
        missing, victims = plan
        assert victims == expected
        self.pool.remove_victims(victims)
        self.pool.touch_all(pages - missing, self.now)
        self.pool.insert_all({page: parents[page] for page in picks if page in missing}, self.now)

    # --- invariants ----------------------------------------------------------------------------------
    @precondition(lambda self: hasattr(self, "pool"))
    @invariant()
    def accounts_and_order_hold(self) -> None:
        self.pool.check()
        order = self.pool._order
        assert order._size == sum(len(b.members) for b in order._buckets.values())
        assert sorted(order._keys) == sorted(order._buckets)

    @precondition(lambda self: hasattr(self, "pool"))
    @invariant()
    def the_order_is_the_sorted_cached_pages(self) -> None:
        assert peek_victims(self.pool._order) == self._expected(len(FEW), ())
        assert peek_victims(self.pool._order, EXCLUDED) == self._expected(len(FEW), EXCLUDED)


TierMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_tier_machine = TierMachine.TestCase


# --- what the lower bounds save ----------------------------------------------------------------------
def _pool(policy: str = "branch") -> TierPool:
    return TierPool(Tier.HOST, len(PAGES), POLICIES[policy](), {})


@pytest.mark.parametrize("policy", ["branch", "lru"])
def test_touching_cached_pages_enters_nothing(policy: str) -> None:
    pool = _pool(policy)
    pool.insert_all(dict.fromkeys(PAGES[:6]), 1.0)
    size = pool._order._size
    pool.touch_all(set(PAGES[:3]), 2.0)
    pool.touch(PAGES[4], 3.0)
    assert pool._order._size == size
    assert peek_victims(pool._order) == [PAGES[3], PAGES[5], *PAGES[:3], PAGES[4]]  # by access, then hash
    pool.check()


def test_a_release_enters_only_pages_without_an_entry() -> None:
    pool = _pool()
    pool.insert_all(dict.fromkeys(PAGES[:4]), 1.0)
    pool.pin_all("a", PAGES[:4], 2.0)
    size = pool._order._size
    pool.unpin_all("a", 3.0)  # every page still holds its entry under (0, 1): a lower bound of (0, 3)
    assert pool._order._size == size
    victims = pool.victims(1, frozenset())
    assert victims == [min(PAGES[:4])]  # (each moved to (0, 3) on the way)
    pool.remove_victims(victims)
    pool.check()


def test_a_count_dropping_to_zero_enters_a_cached_page_at_once_and_forgets_a_pinned_one() -> None:
    counts: dict[PageHash, int] = {PAGES[0]: 2, PAGES[1]: 1}
    pool = TierPool(Tier.HOST, len(PAGES), BranchCountEviction(), counts)
    pool.insert_all({PAGES[0]: None, PAGES[1]: None, PAGES[2]: None}, 1.0)  # (1, 1), (1, 1), (0, 1)
    pool.touch(PAGES[2], 5.0)
    pool.pin("a", PAGES[1], 6.0)
    del counts[PAGES[0]], counts[PAGES[1]]
    pool.counts_changed([PAGES[0], PAGES[1]], [PAGES[0], PAGES[1]])
    assert not pool._order.unheld()
    pool.unpin("a", PAGES[1])  # entered again under (0, 6)
    pool.check()
    assert pool.victims(3, frozenset()) == [PAGES[0], PAGES[2], PAGES[1]]  # (0, 1), (0, 5), (0, 6)
