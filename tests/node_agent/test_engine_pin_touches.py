"""Pin touches kept per run (`TierPool._pin_touches`) against the page-exact oracle, `pin` page by page: after
any sequence of inserts, whole-run and single pins, unpins, releases, touches, count changes and evictions
(times going back and forth, so some touches come later than the release), both tiers have the same last
access for every page, the same cached pages and choose the same victims."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction, LruEviction
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import Tier
from evolving_infra.node_agent.engine.tier import Owner, TierPool

PAGES = chain_hashes(f"t{i}".encode() for i in range(10))


class PageByPage(TierPool):
    """The oracle: `pin_all` pins page by page, so every touch goes into `_access` at once."""

    def pin_all(self, owner: Owner, pages: Iterable[PageHash], now: float) -> None:
        for page in sorted(set(pages)):
            self.pin(owner, page, now)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "pin_all", "pin_all", "pin", "unpin", "release", "release", "touch", "touch_all",
                         "count", "evict"]),
        st.integers(0, 9), st.integers(1, 6), st.integers(0, 2), st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0]),
    ),  # fmt: skip
    max_size=70,
)


@given(ops=OPS, lru=st.booleans())
def test_pin_touches_per_run_equal_page_by_page_pins(ops: list[tuple[str, int, int, int, float]], lru: bool) -> None:
    counts: list[dict[PageHash, int]] = [{}, {}]
    pools = [
        cls(Tier.HOST, 8, LruEviction() if lru else BranchCountEviction(), c)
        for cls, c in zip((TierPool, PageByPage), counts, strict=True)
    ]
    for op, start, n, k, now in ops:
        owner = f"o{k}"
        run = PAGES[start : start + n]
        picked: list[object] = []
        for pool, count in zip(pools, counts, strict=True):
            held = [p for p in run if pool.contains(p)]
            if op == "insert":
                new = {p: (PAGES[PAGES.index(p) - 1] if PAGES.index(p) else None) for p in run if not pool.contains(p)}
                new = dict(list(new.items())[: pool.free])
                pool.insert_all(new, now, owner=owner if k else None)
            elif op == "pin_all":
                pool.pin_all(owner, held, now)
            elif op == "pin" and held:
                pool.pin(owner, held[0], now)
            elif op == "unpin":
                mine = sorted(pool.pinned_by(owner))
                if mine:
                    pool.unpin(owner, mine[start % len(mine)])
            elif op == "release":
                pool.unpin_all(owner, now)
            elif op == "touch" and held:
                pool.touch(held[-1], now)
            elif op == "touch_all":
                pool.touch_all(set(held), now)
            elif op == "count":
                changed = {p: k for p in run}
                flipped = [p for p in run if (p in count) != bool(k)]
                for p, c in changed.items():
                    if c:
                        count[p] = c
                    else:
                        count.pop(p, None)
                pool.counts_changed(changed, flipped)
            elif op == "evict":
                victims = pool.victims(min(n, pool.evictable()))
                pool.remove_all(victims)
                picked.append(victims)
            pool.check()
        if picked:
            assert picked[0] == picked[1]
        assert pools[0].last_accesses() == pools[1].last_accesses()
        assert pools[0]._cached == pools[1]._cached
        assert {o: set(p) for o, p in pools[0]._owner_pins.items()} == {o: set(p) for o, p in pools[1]._owner_pins.items()}


def test_a_single_unpin_settles_the_pages_pin_touches_first() -> None:
    for cls in (TierPool, PageByPage):
        t = cls(Tier.HOST, 8, LruEviction(), {})
        t.insert_all({PAGES[0]: None, PAGES[1]: PAGES[0], PAGES[2]: PAGES[1]}, 0.0)
        t.pin_all("a", PAGES[:2], 3.0)
        t.unpin("a", PAGES[0])  # cached again, last accessed by the pin at 3.0
        assert t.last_access(PAGES[0]) == 3.0
        assert t.victims(2) == [PAGES[2], PAGES[0]]  # PAGES[2] (0.0) first, then PAGES[0] (3.0)
        t.remove_all([PAGES[2], PAGES[0]])
        t.unpin_all("a", 2.0)  # a release before the pin's touch keeps the later access
        assert t.last_access(PAGES[1]) == 3.0
        t.check()


@given(
    cached=st.sets(st.integers(0, 9)), pinned=st.sets(st.integers(0, 9)), spare=st.integers(0, 4),
    exclude=st.lists(st.integers(0, 9), max_size=12), n=st.integers(0, 16),
)  # fmt: skip
def test_lacks_room_equals_room_below_n(cached: set[int], pinned: set[int], spare: int, exclude: list[int], n: int) -> None:
    t = TierPool(Tier.HOST, 10 + spare, LruEviction(), {})
    t.insert_all({PAGES[i]: None for i in sorted(cached | pinned)}, 0.0)
    t.pin_all("a", [PAGES[i] for i in pinned], 1.0)
    ex = [PAGES[i] for i in exclude]  # duplicates and pinned pages too
    assert t.lacks_room(n, ex) == (t.room(ex) < n)
