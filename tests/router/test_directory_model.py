"""The KV directory against a brute-force model: random KV events, node failures and touches; every
lookup answer (per node and tier, either tier, anywhere, pooled, reachable, fetch plans) and every parent
recomputed from plain sets."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from evolving_infra.core.kv_events import KvCleared, KvRemoved, KvStored
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.router.directory import KvDirectory
from evolving_infra.router.prefix_match import FetchRun

NODES = tuple(NodeId(f"n{i}") for i in range(4))
PAGES = tuple(PageHash(1000 + i) for i in range(10))
node_st = st.sampled_from(NODES)
tier_st = st.sampled_from(list(Tier))
page_st = st.sampled_from(PAGES)


class Model:
    def __init__(self) -> None:
        self.held: dict[tuple[NodeId, Tier], dict[PageHash, float]] = {}
        self.parent: dict[PageHash, PageHash | None] = {}

    def holds(self, node: NodeId, tier: Tier, page: PageHash) -> bool:
        return page in self.held.get((node, tier), {})

    def either(self, node: NodeId, page: PageHash) -> bool:
        return any(self.holds(node, t, page) for t in Tier)

    def in_host(self, page: PageHash) -> bool:
        return any(self.holds(n, Tier.HOST, page) for n in NODES)

    def forget_unheld(self) -> None:
        held = set().union(*self.held.values()) if self.held else set()
        self.parent = {p: q for p, q in self.parent.items() if p in held}


def lead(prompt: list[PageHash], ok: object) -> int:
    n = 0
    for page in prompt:
        if not ok(page):  # type: ignore[operator]
            break
        n += 1
    return n


class DirectoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.d = KvDirectory()
        self.m = Model()
        self.clock = 0.0
        self.known_nodes: list[NodeId] = []

    @rule(node=node_st, tier=tier_st, parent=st.one_of(st.none(), page_st), chain=st.lists(page_st, max_size=5))
    def store(self, node: NodeId, tier: Tier, parent: PageHash | None, chain: list[PageHash]) -> None:
        self.clock += 1
        self.d.apply(KvStored(node, tier, parent, tuple(chain), self.clock))
        if node not in self.known_nodes:
            self.known_nodes.append(node)
        prev = parent if parent in self.m.parent else None
        held = self.m.held.setdefault((node, tier), {})
        for page in chain:
            self.m.parent.setdefault(page, prev)
            held[page] = self.clock
            prev = page

    @rule(node=node_st, tier=tier_st, pages=st.lists(page_st, max_size=4))
    def remove(self, node: NodeId, tier: Tier, pages: list[PageHash]) -> None:
        self.d.apply(KvRemoved(node, tier, tuple(pages), self.clock))
        for page in pages:
            self.m.held.get((node, tier), {}).pop(page, None)
        self.m.forget_unheld()

    @rule(node=node_st, tier=st.one_of(st.none(), tier_st))
    def clear(self, node: NodeId, tier: Tier | None) -> None:
        self.d.apply(KvCleared(node, tier, self.clock))
        for t in Tier if tier is None else (tier,):
            self.m.held.pop((node, t), None)
        self.m.forget_unheld()

    @rule(node=node_st)
    def node_dies(self, node: NodeId) -> None:
        self.d.drop_node(node)
        for t in Tier:
            self.m.held.pop((node, t), None)
        if node in self.known_nodes:
            self.known_nodes.remove(node)
        self.m.forget_unheld()

    @rule(node=node_st, tier=tier_st, pages=st.lists(page_st, max_size=4))
    def touch(self, node: NodeId, tier: Tier, pages: list[PageHash]) -> None:
        self.clock += 1
        self.d.touch(node, tier, pages, self.clock)
        held = self.m.held.get((node, tier), {})
        for page in pages:
            if page in held:
                held[page] = self.clock

    @rule(prompt=st.lists(page_st, max_size=8))
    def lookup(self, prompt: list[PageHash]) -> None:
        m, match = self.m, self.d.lookup(prompt)
        assert match.pages == len(prompt)
        for tier, got in ((Tier.GPU, match.gpu), (Tier.HOST, match.host)):
            want = {n: lead(prompt, lambda p, n=n, t=tier: m.holds(n, t, p)) for n in NODES}
            assert got == {n: k for n, k in want.items() if k}
        want = {n: lead(prompt, lambda p, n=n: m.either(n, p)) for n in NODES}
        assert match.either == {n: k for n, k in want.items() if k}
        assert match.anywhere == lead(prompt, lambda p: any(m.either(n, p) for n in NODES))
        assert match.pooled == lead(prompt, m.in_host)
        for node in NODES:
            reach = lead(prompt, lambda p, n=node: m.either(n, p) or m.in_host(p))
            if node not in self.known_nodes:
                reach = match.pooled  # the directory never saw it: it can only fetch
            assert match.reachable_for(node) == reach
            runs: list[FetchRun] = []
            for i, page in enumerate(prompt[:reach]):
                peers = frozenset() if m.either(node, page) else frozenset(
                    n for n in NODES if n != node and m.holds(n, Tier.HOST, page)
                )
                if runs and runs[-1].end == i and runs[-1].peers == peers:
                    runs[-1] = FetchRun(runs[-1].start, i + 1, peers)
                elif peers:
                    runs.append(FetchRun(i, i + 1, peers))
            assert match.fetch_plan(node).runs == tuple(runs)

    @invariant()
    def same_pages_parents_and_times(self) -> None:
        assert self.d.page_count == len(self.m.parent)
        for page, parent in self.m.parent.items():
            assert self.d.parent(page) == parent
        for node in NODES:
            for tier in Tier:
                assert self.d.pages_on(node, tier) == self.m.held.get((node, tier), {})
        for page in PAGES:
            for tier in Tier:
                assert self.d.holders(page, tier) == {n for n in NODES if self.m.holds(n, tier, page)}
        assert set(self.d.nodes()) == set(self.known_nodes)


TestDirectoryAgainstModel = DirectoryMachine.TestCase
