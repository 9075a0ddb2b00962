"""The run-based KV directory against the page-exact one (the oracle): random KV events on a tree of chained
pages (paths that fork, stores of any stretch of a path, evictions that split runs, touches, clears, node
deaths) and on arbitrary page lists; after every step every query and every lookup answers the same."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from evolving_infra.core.kv_events import KvCleared, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.directory_pages import PageKvDirectory

NODES = tuple(NodeId(f"n{i}") for i in range(4))
_BASE = tuple(chain_hashes(b"base%d" % i for i in range(12)))
PATHS = (
    _BASE,
    _BASE[:4] + tuple(chain_hashes((b"a%d" % i for i in range(8)), parent=_BASE[3])),
    _BASE[:9] + tuple(chain_hashes((b"b%d" % i for i in range(5)), parent=_BASE[8])),
    tuple(chain_hashes(b"other%d" % i for i in range(6))),
)
ALL_PAGES = tuple(dict.fromkeys(p for path in PATHS for p in path))
node_st = st.sampled_from(NODES)
tier_st = st.sampled_from(list(Tier))
path_st = st.sampled_from(PATHS)
span_st = st.tuples(st.integers(0, 13), st.integers(0, 13))


class RunsAgainstPages(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runs = KvDirectory()
        self.pages = PageKvDirectory()
        self.clock = 0.0

    def both(self, event: object) -> None:
        self.runs.apply(event)  # type: ignore[arg-type]
        self.pages.apply(event)  # type: ignore[arg-type]

    @rule(node=node_st, tier=tier_st, path=path_st, span=span_st, known_parent=st.booleans())
    def store_stretch(self, node: NodeId, tier: Tier, path: tuple[PageHash, ...], span: tuple[int, int],
                      known_parent: bool) -> None:  # fmt: skip
        lo, hi = sorted(span)
        self.clock += 1
        parent = path[lo - 1] if lo and lo <= len(path) and known_parent else None
        self.both(KvStored(node, tier, parent, path[lo:hi], self.clock))

    @rule(node=node_st, tier=tier_st, parent=st.one_of(st.none(), st.sampled_from(ALL_PAGES)),
          chain=st.lists(st.sampled_from(ALL_PAGES), max_size=6))  # fmt: skip
    def store_any(self, node: NodeId, tier: Tier, parent: PageHash | None, chain: list[PageHash]) -> None:
        self.clock += 1
        self.both(KvStored(node, tier, parent, tuple(chain), self.clock))

    @rule(node=node_st, tier=tier_st, path=path_st, span=span_st)
    def evict_stretch(self, node: NodeId, tier: Tier, path: tuple[PageHash, ...], span: tuple[int, int]) -> None:
        lo, hi = sorted(span)
        self.both(KvRemoved(node, tier, path[lo:hi], self.clock))

    @rule(node=node_st, tier=tier_st, pages=st.lists(st.sampled_from(ALL_PAGES), max_size=6))
    def evict_any(self, node: NodeId, tier: Tier, pages: list[PageHash]) -> None:
        self.both(KvRemoved(node, tier, tuple(pages), self.clock))

    @rule(node=node_st, tier=tier_st, paths=st.lists(st.tuples(path_st, span_st), min_size=1, max_size=3),
          order=st.randoms(use_true_random=False))  # fmt: skip
    def evict_mixed(self, node: NodeId, tier: Tier, paths: list[tuple[tuple[PageHash, ...], tuple[int, int]]],
                    order: object) -> None:  # fmt: skip
        """Victims of several stretches in eviction order (shuffled, runs interleaved and reversed)."""
        pages = [p for path, span in paths for p in path[min(span) : max(span)]]
        order.shuffle(pages)  # type: ignore[attr-defined]
        self.both(KvRemoved(node, tier, tuple(pages), self.clock))

    @rule(node=node_st, tier=tier_st, path=path_st, span=span_st, scattered=st.lists(st.sampled_from(ALL_PAGES),
                                                                                  max_size=4))  # fmt: skip
    def touch(self, node: NodeId, tier: Tier, path: tuple[PageHash, ...], span: tuple[int, int],
              scattered: list[PageHash]) -> None:  # fmt: skip
        lo, hi = sorted(span)
        self.clock += 1
        pages = list(path[lo:hi]) + scattered
        assert self.runs.touch(node, tier, pages, self.clock) == self.pages.touch(node, tier, pages, self.clock)

    @rule(node=node_st, tier=st.one_of(st.none(), tier_st))
    def clear(self, node: NodeId, tier: Tier | None) -> None:
        self.both(KvCleared(node, tier, self.clock))

    @rule(node=node_st)
    def node_dies(self, node: NodeId) -> None:
        assert self.runs.drop_node(node) == self.pages.drop_node(node)

    @rule(path=path_st, length=st.integers(0, 14), tail=st.lists(st.sampled_from(ALL_PAGES), max_size=3))
    def lookup(self, path: tuple[PageHash, ...], length: int, tail: list[PageHash]) -> None:
        prompt = list(path[:length]) + tail
        got, want = self.runs.lookup(prompt), self.pages.lookup(prompt)
        assert got == want  # pages, anywhere, pooled and the per-node mappings
        for node in (*NODES, NodeId("never-seen")):
            assert got.reachable_for(node) == want.reachable_for(node)
            assert got.fetch_plan(node) == want.fetch_plan(node)
        cols_got, cols_want = got.columns(NODES), want.columns(NODES)
        assert all((a == b).all() for a, b in zip(cols_got, cols_want, strict=True))

    @invariant()
    def same_state(self) -> None:
        r, p = self.runs, self.pages
        assert r.page_count == p.page_count
        assert r.nodes() == p.nodes()
        assert r.stats == p.stats
        for page in ALL_PAGES:
            assert (page in r) == (page in p)
            if page in p:
                assert r.parent(page) == p.parent(page)
            for tier in Tier:
                assert r.holders(page, tier) == p.holders(page, tier)
                for node in NODES:
                    assert r.last_used(page, node, tier) == p.last_used(page, node, tier)
        for node in NODES:
            for tier in Tier:
                assert r.pages_on(node, tier) == p.pages_on(node, tier)
                assert r.held_count(node, tier) == p.held_count(node, tier)


RunsAgainstPages.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRunsAgainstPages = RunsAgainstPages.TestCase
