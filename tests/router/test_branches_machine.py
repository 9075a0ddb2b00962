"""Random agent operations against the branch table; the count invariants hold after every step.

Operations: new root branches and sub-agents, appends, forks, compactions, branch ends, placements on
nodes of either phase (prefill routing, decode binding, P2P/D2D/P2D/D2P moves) with and without the
target already holding the version, confirmations (current and stale), phase switches, node failures, and
host eviction run through `BranchCountEviction` over the node's host pages.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from evolving_infra.core.eviction import BranchCountEviction, HostPage
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase
from evolving_infra.router.branches import BranchTable

NODES = tuple(NodeId(f"n{i}") for i in range(5))
node_st = st.sampled_from(NODES)
phase_st = st.sampled_from(list(Phase))


class BranchCountMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.phases = {n: (Phase.PREFILL if i % 2 == 0 else Phase.DECODE) for i, n in enumerate(NODES)}
        self.table = BranchTable(dict(self.phases))
        self.next_page = 1
        self.next_branch = 0
        self.clock = 0.0
        # What each node holds in host memory (the table only counts), with last access times.
        self.host: dict[NodeId, dict[PageHash, float]] = {n: {} for n in NODES}
        self.pushed: dict[NodeId, dict[PageHash, int]] = {n: {} for n in NODES}

    # ------------------------------------------------------------------------------------ helpers
    def _pages(self, k: int) -> tuple[PageHash, ...]:
        out = tuple(PageHash(self.next_page + i) for i in range(k))
        self.next_page += k
        return out

    def _new_branch(self, path: tuple[PageHash, ...], node: NodeId) -> None:
        branch = BranchId(f"b{self.next_branch}")
        self.next_branch += 1
        version = self.table.request(branch, path)
        assert version.new_branch and version.version == 1 and not version.rewritten
        self._place(branch, node, held=True)

    def _place(self, branch: BranchId, node: NodeId, held: bool) -> None:
        self.clock += 1.0
        placement = self.table.place(branch, node, held=held)
        assert node not in placement.released and node not in placement.awaiting
        for page in self.table.state(branch).path:
            self.host[node][page] = self.clock  # the node computes or fetches the path

    def _branch(self, data: st.DataObject) -> BranchId:
        return data.draw(st.sampled_from(sorted(self.table.branches())))

    # -------------------------------------------------------------------------------------- rules
    @rule(node=node_st, k=st.integers(1, 4))
    def new_root_or_sub_agent(self, node: NodeId, k: int) -> None:
        self._new_branch(self._pages(k), node)

    @precondition(lambda self: self.table.branches())
    @rule(data=st.data(), node=node_st, k=st.integers(0, 3))
    def fork(self, data: st.DataObject, node: NodeId, k: int) -> None:
        parent = self.table.state(self._branch(data)).path
        cut = data.draw(st.integers(0, len(parent)))
        self._new_branch(parent[:cut] + self._pages(k), node)

    @precondition(lambda self: self.table.branches())
    @rule(data=st.data(), node=node_st, k=st.integers(0, 3), held=st.booleans())
    def append(self, data: st.DataObject, node: NodeId, k: int, held: bool) -> None:
        branch = self._branch(data)
        before = self.table.state(branch)
        version = self.table.request(branch, before.path + self._pages(k))
        assert not version.rewritten and version.version == before.version
        self._place(branch, node, held)

    @precondition(lambda self: self.table.branches())
    @rule(data=st.data(), node=node_st, k=st.integers(1, 3), held=st.booleans())
    def compaction(self, data: st.DataObject, node: NodeId, k: int, held: bool) -> None:
        branch = self._branch(data)
        before = self.table.state(branch)
        if not before.path:
            return
        keep = data.draw(st.integers(0, len(before.path) - 1))  # drops at least the last page
        version = self.table.request(branch, before.path[:keep] + self._pages(k))
        assert version.rewritten and version.version == before.version + 1
        after = self.table.state(branch)
        for node_m, pages in after.counted.items():  # dropped history released once per node
            assert pages <= frozenset(after.path)
            assert pages == before.counted[node_m] & frozenset(after.path)
        self._place(branch, node, held)

    @precondition(lambda self: self.table.branches())
    @rule(data=st.data(), node=node_st, held=st.booleans())
    def transfer(self, data: st.DataObject, node: NodeId, held: bool) -> None:
        branch = self._branch(data)
        before = self.table.state(branch)
        self._place(branch, node, held)
        after = self.table.state(branch)
        phase = self.phases[node]
        for other, pages in before.counted.items():  # the other phase always keeps its copy
            if self.phases[other] is not phase:
                assert after.counted.get(other) == pages

    @precondition(lambda self: self.table.branches())
    @rule(data=st.data(), stale=st.booleans())
    def confirm(self, data: st.DataObject, stale: bool) -> None:
        branch = self._branch(data)
        state = self.table.state(branch)
        if not state.targets:
            return
        phase = data.draw(st.sampled_from(sorted(state.targets, key=lambda p: p.value)))
        target = state.targets[phase]
        released = self.table.confirm_held(branch, target, state.version - 1 if stale else state.version)
        after = self.table.state(branch)
        same_phase = [n for n in after.counted if self.phases[n] is phase]
        if stale:
            assert released == () and after.counted == state.counted
        else:
            assert phase not in after.unsettled
            assert set(same_phase) <= {target}

    @precondition(lambda self: self.table.branches())
    @rule(data=st.data())
    def branch_end(self, data: st.DataObject) -> None:
        assert self.table.end(self._branch(data))

    @rule(node=node_st, phase=phase_st)
    def phase_switch(self, node: NodeId, phase: Phase) -> None:
        before = self.table.counts_for(node)
        old = self.phases[node]
        self.phases[node] = phase
        self.table.set_phase(node, phase)
        if old is Phase.DECODE and phase is Phase.PREFILL:
            assert self.table.counts_for(node) == {}
        else:
            assert self.table.counts_for(node) == before

    @rule(node=node_st, n=st.integers(1, 6), data=st.data())
    def evict(self, node: NodeId, n: int, data: st.DataObject) -> None:
        held = sorted(self.host[node])
        if not held:
            return
        pinned = set(data.draw(st.lists(st.sampled_from(held), max_size=3)))
        counts = self.table.counts_for(node)
        pages = [HostPage(p, counts.get(p, 0), self.host[node][p], p in pinned) for p in held]
        victims = BranchCountEviction().victims(pages, n)
        assert len(victims) == min(n, len(held) - len(pinned))
        chosen = set(victims)
        assert not chosen & pinned
        unpinned = [p for p in pages if not p.pinned]
        zero_left = [p for p in unpinned if p.count == 0 and p.page not in chosen]
        for page in pages:
            if page.page in chosen and page.count > 0:
                assert not zero_left, "a positive-count page went before an unpinned zero-count page"
        order = {p: i for i, p in enumerate(victims)}
        by_page = {p.page: p for p in pages}
        for a in victims:  # LRU within each group: no unchosen page of the group is older
            group = by_page[a].count > 0
            for p in unpinned:
                if (p.count > 0) == group and p.page not in chosen:
                    assert p.last_access >= by_page[a].last_access
        for a, b in zip(victims, victims[1:]):
            assert (by_page[a].count > 0, by_page[a].last_access) <= (by_page[b].count > 0, by_page[b].last_access)
        assert sorted(order) == sorted(chosen)
        self.table.evicted(node, victims)
        for p in victims:
            del self.host[node][p]
            assert self.table.count(p, node) == 0

    @rule()
    def push_counts(self) -> None:
        for node in NODES:
            self.pushed[node].update(self.table.take_updates(node))
            self.pushed[node] = {p: c for p, c in self.pushed[node].items() if c}
            assert self.pushed[node] == self.table.counts_for(node)

    # ---------------------------------------------------------------------------------- invariants
    @invariant()
    def counts_match_the_branch_table(self) -> None:
        expected: dict[NodeId, Counter[PageHash]] = {n: Counter() for n in NODES}
        for branch in self.table.branches():
            for node, pages in self.table.state(branch).counted.items():
                assert pages, "an empty C[b][n] must not be stored"
                expected[node].update(pages)
        for node in NODES:
            counts = self.table.counts_for(node)
            assert all(c > 0 for c in counts.values())
            assert counts == dict(expected[node])
            for page, c in list(counts.items())[:5]:
                assert self.table.count(page, node) == c

    @invariant()
    def at_most_one_copy_per_settled_phase(self) -> None:
        for branch in self.table.branches():
            state = self.table.state(branch)
            for phase in Phase:
                copies = [n for n in state.counted if self.phases[n] is phase]
                if phase not in state.unsettled:
                    assert len(copies) <= 1, (branch, phase, copies)

    def teardown(self) -> None:
        for branch in self.table.branches():
            assert self.table.end(branch)
        for node in NODES:
            assert self.table.counts_for(node) == {}
        assert self.table.nodes_with_counts() == ()


TestBranchCounts = BranchCountMachine.TestCase
