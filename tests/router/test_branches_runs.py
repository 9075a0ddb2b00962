"""The run-based branch table against the page-exact one (the oracle), call by call.

Both tables get the same random operations: new branches and sub-agents, appends, forks at any page, compactions
(rewrites that keep any prefix), placements with and without the target holding the version, confirmations,
branch ends, phase switches, node failures and evictions of arbitrary host pages (splitting runs anywhere), and
snapshot restores. Every answer must be equal (versions, placements, released nodes, dropped counts, states,
counts, the pages `take_updates` reports and their counts), and the run tree's own invariant (module docstring,
5) must hold after every step. A rule feeding a path that is not a chain checks the switch to page-exact.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from evolving_infra.core.pages import CountUpdates, PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, Phase
from evolving_infra.router.branches import BranchState, BranchTable, PageBranchTable

NODES = tuple(NodeId(f"n{i}") for i in range(4))
node_st = st.sampled_from(NODES)


class RunsAgainstPages(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.phases = {n: (Phase.PREFILL if i % 2 == 0 else Phase.DECODE) for i, n in enumerate(NODES)}
        self.runs = BranchTable(dict(self.phases))
        self.pages = PageBranchTable(dict(self.phases))
        self.next_page = 0
        self.next_branch = 0
        self.chained = True

    # ------------------------------------------------------------------------------------ helpers
    def _extend(self, path: tuple[PageHash, ...], k: int) -> tuple[PageHash, ...]:
        """`path` plus k fresh chained pages (a page's hash names its prefix)."""
        contents = (f"p{self.next_page + i}".encode() for i in range(k))
        fresh = tuple(chain_hashes(contents, parent=path[-1]) if path else chain_hashes(contents))
        self.next_page += k
        return path + fresh

    def _both(self, call: str, *args: object, **kwargs: object) -> object:
        a = getattr(self.runs, call)(*args, **kwargs)
        b = getattr(self.pages, call)(*args, **kwargs)
        assert a == b, (call, args, a, b)
        return a

    def _branch(self, data: st.DataObject) -> BranchId:
        return data.draw(st.sampled_from(sorted(self.pages.branches())))

    def _new(self, path: tuple[PageHash, ...], node: NodeId, held: bool) -> None:
        branch = BranchId(f"b{self.next_branch}")
        self.next_branch += 1
        self._both("request", branch, path)
        self._both("place", branch, node, held=held)

    # -------------------------------------------------------------------------------------- rules
    @rule(node=node_st, k=st.integers(0, 6), held=st.booleans())
    def new_root(self, node: NodeId, k: int, held: bool) -> None:
        self._new(self._extend((), k), node, held)

    @precondition(lambda self: self.pages.branches())
    @rule(data=st.data(), node=node_st, k=st.integers(0, 4), held=st.booleans())
    def fork(self, data: st.DataObject, node: NodeId, k: int, held: bool) -> None:
        parent = self.pages.state(self._branch(data)).path
        cut = data.draw(st.integers(0, len(parent)))
        self._new(self._extend(parent[:cut], k), node, held)

    @precondition(lambda self: self.pages.branches())
    @rule(data=st.data(), k=st.integers(0, 5))
    def append(self, data: st.DataObject, k: int) -> None:
        branch = self._branch(data)
        self._both("request", branch, self._extend(self.pages.state(branch).path, k))

    @precondition(lambda self: self.pages.branches())
    @rule(data=st.data(), k=st.integers(0, 4))
    def compaction(self, data: st.DataObject, k: int) -> None:
        branch = self._branch(data)
        path = self.pages.state(branch).path
        keep = data.draw(st.integers(0, len(path)))
        self._both("request", branch, self._extend(path[:keep], k))

    @precondition(lambda self: self.pages.branches())
    @rule(data=st.data())
    def adopt_another_path(self, data: st.DataObject) -> None:
        """A branch's next request is (a prefix of) another branch's path: shared runs, no new pages."""
        branch, other = self._branch(data), self._branch(data)
        path = self.pages.state(other).path
        self._both("request", branch, path[: data.draw(st.integers(0, len(path)))])

    @precondition(lambda self: self.pages.branches())
    @rule(data=st.data(), node=node_st, held=st.booleans())
    def place(self, data: st.DataObject, node: NodeId, held: bool) -> None:
        self._both("place", self._branch(data), node, held=held)

    @precondition(lambda self: self.pages.branches())
    @rule(data=st.data(), stale=st.booleans())
    def confirm(self, data: st.DataObject, stale: bool) -> None:
        branch = self._branch(data)
        state = self.pages.state(branch)
        for phase, node in sorted(state.targets.items(), key=lambda t: t[0].value):
            self._both("confirm_held", branch, node, state.version - int(stale))

    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        known = sorted(self.pages.branches())
        branch = data.draw(st.sampled_from(known)) if known and data.draw(st.booleans()) else BranchId("nobody")
        self._both("end", branch)

    @rule(node=node_st, phase=st.sampled_from(list(Phase)))
    def phase_switch(self, node: NodeId, phase: Phase) -> None:
        self._both("set_phase", node, phase)

    @rule(node=node_st, phase=st.sampled_from(list(Phase)))
    def node_dies_and_returns(self, node: NodeId, phase: Phase) -> None:
        self._both("drop_node", node)
        self._both("set_phase", node, phase)

    @rule(node=node_st, data=st.data())
    def evict(self, node: NodeId, data: st.DataObject) -> None:
        """Arbitrary pages of any branch's path (counted here or not): runs split where the victims are."""
        pool = sorted({p for b in self.pages.branches() for p in self.pages.state(b).path})
        victims = data.draw(st.lists(st.sampled_from(pool), max_size=8)) if pool else []
        victims += [PageHash(7)] if data.draw(st.booleans()) else []  # a page no branch has
        self._both("evicted", node, victims)

    @precondition(lambda self: self.pages.branches())
    @rule(data=st.data())
    def snapshot_restore(self, data: st.DataObject) -> None:
        """A branch ends and comes back from its recorded state (the persistence hook)."""
        branch = self._branch(data)
        state = self.pages.state(branch)
        self._both("end", branch)
        self._both("restore", branch, state)
        with pytest.raises(ValueError):
            self.runs.restore(branch, state)

    @rule()
    def take_updates(self) -> None:
        assert self.runs.dirty_nodes() == self.pages.dirty_nodes() or set(self.runs.dirty_nodes()) == set(
            self.pages.dirty_nodes()
        )
        for node in NODES:
            got = self._both("take_updates", node)
            if isinstance(got, CountUpdates):  # its stretches, applied in order, are the same updates
                replay: dict[PageHash, int] = {}
                for pages, count in got.groups:
                    assert got.consistent and all(replay.get(p, count) == count for p in pages)  # one count a page
                    replay.update(dict.fromkeys(pages, count))
                assert list(replay.items()) == list(got.items())
        assert self.runs.dirty_nodes() == ()

    @precondition(lambda self: self.chained and self.pages.branches())
    @rule(data=st.data())
    def a_path_that_is_not_a_chain(self, data: st.DataObject) -> None:
        """An existing page under a new parent: the run table turns page-exact and answers the same."""
        path = self.pages.state(self._branch(data)).path
        if not path:
            return
        branch = BranchId(f"b{self.next_branch}")
        self.next_branch += 1
        self._both("request", branch, (PageHash(12345),) + path[-1:])
        assert self.runs.stats.page_exact
        self.chained = False

    # ---------------------------------------------------------------------------------- invariants
    @invariant()
    def same_tables(self) -> None:
        self.runs.check()
        assert self.runs.branches() == self.pages.branches()
        assert len(self.runs) == len(self.pages)
        assert self.runs.active_pages() == self.pages.active_pages()  # (the planner's active contexts)
        for branch in self.pages.branches():
            assert self.runs.state(branch) == self.pages.state(branch)
        for node in NODES:
            counts = self.pages.counts_for(node)
            assert self.runs.counts_for(node) == counts
            for page in list(counts)[:3]:
                assert self.runs.count(page, node) == counts[page]
        assert self.runs.nodes_with_counts() == self.pages.nodes_with_counts()
        assert self.runs.phases() == self.pages.phases()
        assert self.runs.stats == self.pages.stats or self.runs.stats.page_exact

    def teardown(self) -> None:
        for branch in self.pages.branches():
            self._both("end", branch)
        for node in NODES:
            self._both("take_updates", node)
            assert self.runs.counts_for(node) == {}
        if not self.runs.stats.page_exact:
            assert self.runs.runs == 0, "runs without paths left the tree"


RunsAgainstPages.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestRunsAgainstPages = RunsAgainstPages.TestCase


def test_a_new_branch_counts_one_step_per_run() -> None:
    """Placing a long branch new to a node touches its few runs, and the update still names every page."""
    table = BranchTable({NodeId("p"): Phase.PREFILL, NodeId("q"): Phase.PREFILL})
    system = tuple(chain_hashes(f"s{i}".encode() for i in range(300)))
    own = tuple(chain_hashes((f"a{i}".encode() for i in range(550)), parent=system[-1]))
    table.request(BranchId("a"), system + own)
    table.request(BranchId("b"), system + own[:10])
    assert table.runs == 2  # the pages both paths hold (the system prompt and a's first ten), the rest of a
    placement = table.place(BranchId("a"), NodeId("q"))
    assert placement.added == 850
    updates = table.take_updates(NodeId("q"))
    assert updates == dict.fromkeys(system + own, 1)
    table.place(BranchId("b"), NodeId("q"))
    assert table.take_updates(NodeId("q")) == dict.fromkeys(system + own[:10], 2)
    assert table.runs == 2 and not table.stats.page_exact


def test_stats_of_both_forms_match_on_a_restore_snapshot() -> None:
    state = BranchState(3, (PageHash(1), PageHash(2)), {NodeId("p"): frozenset({PageHash(2)})}, {}, frozenset())
    runs, pages = BranchTable({NodeId("p"): Phase.PREFILL}), PageBranchTable({NodeId("p"): Phase.PREFILL})
    runs.restore(BranchId("x"), state)
    pages.restore(BranchId("x"), state)
    assert runs.state(BranchId("x")) == pages.state(BranchId("x"))
    assert runs.take_updates(NodeId("p")) == pages.take_updates(NodeId("p")) == {PageHash(2): 1}
