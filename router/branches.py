"""Branch table and branch counts: algorithms E.1 (branch version of a request) and E.2 (counts), per run.

Notation as in the paper: a branch β has a version v_β, the path π_β of its latest request (the hashes of
the full pages of its input, including the pages its prefill adds), and per node n the set C[β][n] of pages
it is counted on there; N_β = {n : C[β][n] ≠ ∅}. R[b][n] is the number of active branches counted on page
b at node n. `Count(β, n, π)` makes β count exactly π on n: +1 on π \\ C[β][n], -1 on C[β][n] \\ π.

**Runs.** Page hashes are chained (a page's hash names its whole prefix), so the active paths form a prefix
tree; the table keeps it as runs of pages that every active path holds entirely or not at all, with one count
per node for the whole run (`branch_runs.RunTree`, which `BranchTable` inherits, explains the tree). C[β][n]
is a list of [lo, hi) index ranges over π_β whose ends are run boundaries, so Count(β, n, π) is one step per
run: placing a branch of 850 pages that is new to a node adds 1 to each run of its path (usually a few)
instead of to 850 pages. The changed counts are recorded as the changed runs' pages; `take_updates` still
answers page -> count, built with one C-level dict update per run.

If a path breaks the chain rule (a page at two depths, or under two parents: arbitrary page ids, or a 64-bit
hash collision), the table converts itself into the page-exact table (`branches_pages.PageBranchTable`, the
oracle) and goes on page by page (`stats.page_exact` is then True). Answers are the same either way.

Invariants (after every public call; property-tested in tests/router/test_branches_machine.py, and against
the page-exact table in tests/router/test_branches_runs.py):
1. no count is negative, and only positive counts are stored;
2. R[b][n] == |{β active : b ∈ C[β][n]}| for every page b and node n;
3. for every active branch β and phase φ not in β's `unsettled` phases, at most one node of phase φ holds
   counts of β ("at most one copy per phase"). A phase is unsettled only between a placement whose target
   does not yet hold the current version and the `confirm_held` of that target, and after a P->D phase
   switch carried a second decode copy over, until β's next settled decode placement;
4. after every branch has ended, every count is zero (no R entry remains);
5. (runs) the run tree's invariant (`branch_runs`) holds; C[β][n]'s ranges end at run boundaries, so every
   page of a run has the run's counts.

Choices where the paper leaves room (docs/kv-directory.md explains them):
- Same-phase moves: `place(β, n, held=True)` says n already holds the current version (the source is
  released at once); `held=False` leaves the other same-phase copies counted until `confirm_held(β, n, v)`
  for the current version v and current target n of that phase. A confirmation for an older version, or for
  a node that is no longer β's target in its phase, changes nothing and is counted as stale.
- Releasing a same-phase copy releases every other node of that phase holding counts of β, including a copy
  a P->D switch carried over.
- Eviction (E.2 lines 19-20) drops the evicted pages from every C[β][n]; a later placement of β on n counts
  them again (n will hold them again after its prefill or fetch).
- `drop_node` (the node died) releases every count on it and forgets its phase.

Boundary: pure bookkeeping; callers pass the node phases and the events (requests, placements,
confirmations, branch ends, phase switches, evictions). Nodes read their counts with `counts_for` or the
incremental `take_updates`. The run tree itself (runs, split/cut/merge, counts added per run) is
`branch_runs`'s; this module gives it its branch semantics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat

from evolving_infra.core.pages import CountUpdates, PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase
from evolving_infra.router.branch_runs import Ranges, RunTree, _NotChained, _Run, _common, _minus, _ranges, _size
from evolving_infra.router.branches_pages import BranchState, BranchStats, PageBranchTable, Placement, RequestVersion

__all__ = ["BranchState", "BranchStats", "BranchTable", "PageBranchTable", "Placement", "RequestVersion"]

_NONE: Ranges = ()


@dataclass(slots=True)
class _Branch:
    version: int = 1
    path: tuple[PageHash, ...] = ()
    counted: dict[NodeId, Ranges] = field(default_factory=dict)
    targets: dict[Phase, NodeId] = field(default_factory=dict)
    unsettled: set[Phase] = field(default_factory=set)


class BranchTable(RunTree):
    """Branch versions and paths (E.1) and the counts R[b][n] (E.2) per run of pages, over nodes whose phases
    it is told (see the module docstring)."""

    __slots__ = ("_branches", "_phase", "_run", "_node_runs", "_on_node", "_dirty", "_exact", "stats")

    def __init__(self, phases: dict[NodeId, Phase] | None = None, *, page_exact: bool = False) -> None:
        """`page_exact`: keep the counts page by page from the start (the oracle's form, for comparisons)."""
        self._branches: dict[BranchId, _Branch] = {}
        self._phase: dict[NodeId, Phase] = dict(phases or {})
        self._run: dict[PageHash, _Run] = {}  # every page of an active path -> its run
        self._node_runs: dict[NodeId, dict[_Run, None]] = {}  # runs with a positive count on the node
        self._on_node: dict[NodeId, set[BranchId]] = {}
        self._dirty: dict[NodeId, list[tuple[tuple[PageHash, ...], int]]] = {}  # changed (pages, depth)
        self._exact: PageBranchTable | None = None
        self.stats = BranchStats()
        if page_exact:
            self._to_exact()

    # ------------------------------------------------------------------------------------- E.2 Count
    def _count(self, branch: BranchId, b: _Branch, node: NodeId, target: Ranges) -> int:
        """Count(β, n, π) for π given as index ranges of β's path; returns the number of pages newly counted."""
        current = b.counted.get(node, _NONE)
        if current == target:
            return 0
        self._node_runs.setdefault(node, {})
        added = _minus(target, current)
        dropped = _minus(current, target)
        if added:
            self._add(b.path, node, added, 1)
        if dropped:
            self._add(b.path, node, dropped, -1)
        if target:
            b.counted[node] = target
            self._on_node.setdefault(node, set()).add(branch)
        else:
            del b.counted[node]
            self._on_node[node].discard(branch)
        return _size(added)

    def _whole(self, b: _Branch) -> Ranges:
        return ((0, len(b.path)),) if b.path else _NONE

    def _release_same_phase(
        self, branch: BranchId, b: _Branch, keep: NodeId, phase: Phase
    ) -> tuple[NodeId, ...]:
        others = tuple(m for m in b.counted if m != keep and self._phase.get(m) is phase)
        for m in others:
            self._count(branch, b, m, _NONE)
        b.unsettled.discard(phase)
        return others

    # ------------------------------------------------------------------------------- page-exact form
    def _to_exact(self) -> PageBranchTable:
        """Turn page-exact (a path broke the chain rule): the same branches, counts and pending changes."""
        pending = {node: self._take(node) for node in tuple(self._dirty)}
        exact = PageBranchTable(self._phase)
        for node in self._node_runs:  # the nodes in the order they first held counts (`nodes_with_counts`)
            exact._counts[node] = {}
        for branch, b in self._branches.items():
            exact.restore(branch, self._state(b))
        exact._dirty.clear()  # restoring counted the pages again; only the changes not yet taken are pending
        for node, updates in pending.items():
            if updates:
                exact._dirty[node] = set(updates)
        exact.stats = self.stats
        self.stats.page_exact = True
        self._exact = exact
        self._branches.clear()
        self._run.clear()
        self._node_runs.clear()
        self._on_node.clear()
        self._dirty.clear()
        return exact

    # ----------------------------------------------------------------------------------------- nodes
    def set_phase(self, node: NodeId, phase: Phase) -> tuple[BranchId, ...]:
        """Record `node`'s phase. D->P releases every branch's counts on it (returned); P->D keeps them."""
        if self._exact is not None:
            return self._exact.set_phase(node, phase)
        old = self._phase.get(node)
        self._phase[node] = phase
        if old is None or old is phase:
            return ()
        branches = tuple(sorted(self._on_node.get(node, ())))
        for branch in branches:
            b = self._branches[branch]
            if old is Phase.DECODE:
                self._count(branch, b, node, _NONE)
            elif sum(1 for m in b.counted if self._phase[m] is phase) > 1:
                b.unsettled.add(phase)
        for row in self._branches.values():
            if row.targets.get(old) == node:
                del row.targets[old]
        return branches if old is Phase.DECODE else ()

    def phase(self, node: NodeId) -> Phase:
        if self._exact is not None:
            return self._exact.phase(node)
        try:
            return self._phase[node]
        except KeyError:
            raise KeyError(f"node {node!r} has no phase; call set_phase({node!r}, Phase.X) first") from None

    def drop_node(self, node: NodeId) -> tuple[BranchId, ...]:
        """The node died: release every branch's counts on it and forget its phase."""
        if self._exact is not None:
            return self._exact.drop_node(node)
        branches = tuple(sorted(self._on_node.get(node, ())))
        for branch in branches:
            self._count(branch, self._branches[branch], node, _NONE)
        for row in self._branches.values():
            for phase, target in list(row.targets.items()):
                if target == node:
                    del row.targets[phase]
        self._phase.pop(node, None)
        self._on_node.pop(node, None)
        self._node_runs.pop(node, None)
        return branches

    # -------------------------------------------------------------------------------- E.1 + requests
    def request(self, branch: BranchId, path: Sequence[PageHash]) -> RequestVersion:
        """Algorithm E.1 for a request of `branch` whose input's full pages are `path`, then E.2 lines 5-8."""
        if self._exact is not None:
            return self._exact.request(branch, path)
        new_path = tuple(path)
        b = self._branches.get(branch)
        old_path = b.path if b is not None else ()
        keep = _common(old_path, new_path)
        try:
            self._plan(new_path, keep)
        except _NotChained:
            return self._to_exact().request(branch, new_path)
        self.stats.requests += 1
        if b is None:
            b = self._branches[branch] = _Branch()
            new_branch, rewritten = True, False
        else:
            new_branch = False
            rewritten = keep < len(old_path)
        if rewritten:
            b.version += 1
            self.stats.rewrites += 1
            for node in tuple(b.counted):
                self._count(branch, b, node, tuple((lo, min(hi, keep)) for lo, hi in b.counted[node] if lo < keep))
            self._detach(old_path, keep)
        b.path = new_path
        self._attach(new_path, keep)
        if not rewritten:
            self._merge(new_path, len(old_path))
        return RequestVersion(branch, b.version, old_path, new_path, new_branch, rewritten)

    def place(self, branch: BranchId, node: NodeId, *, held: bool = True) -> Placement:
        """Place `branch` on `node` (prefill routing or decode binding): Count(β, n, π_β).

        `held=True`: `node` already holds the branch's current version, so the other copies of the same
        phase are released now (P2P/D2D move). `held=False`: they stay counted until `confirm_held`.
        Copies on nodes of the other phase always keep their counts (P2D/D2P).
        """
        if self._exact is not None:
            return self._exact.place(branch, node, held=held)
        b = self._row(branch, "place")
        phase = self.phase(node)
        self.stats.placements += 1
        added = self._count(branch, b, node, self._whole(b))
        b.targets[phase] = node
        released: tuple[NodeId, ...] = ()
        awaiting: tuple[NodeId, ...] = ()
        if held:
            released = self._release_same_phase(branch, b, node, phase)
        else:
            awaiting = tuple(m for m in b.counted if m != node and self._phase.get(m) is phase)
            if awaiting:
                b.unsettled.add(phase)
            else:
                b.unsettled.discard(phase)
        return Placement(branch, node, b.version, added, released, awaiting)

    def confirm_held(self, branch: BranchId, node: NodeId, version: int) -> tuple[NodeId, ...]:
        """`node` now holds `version` of `branch`: release the other copies of its phase (returned).

        Stale (unknown branch, older version, or `node` not the branch's current target in its phase):
        nothing changes and `stats.stale_confirmations` grows.
        """
        if self._exact is not None:
            return self._exact.confirm_held(branch, node, version)
        b = self._branches.get(branch)
        phase = self._phase.get(node)
        if b is None or phase is None or version != b.version or b.targets.get(phase) != node:
            self.stats.stale_confirmations += 1
            return ()
        return self._release_same_phase(branch, b, node, phase)

    def end(self, branch: BranchId) -> bool:
        """The branch finished: release all its counts and remove it. False if the branch is unknown."""
        if self._exact is not None:
            return self._exact.end(branch)
        b = self._branches.pop(branch, None)
        if b is None:
            self.stats.unknown_branch_ends += 1
            return False
        for node in tuple(b.counted):
            self._count(branch, b, node, _NONE)
        self._detach(b.path, 0)
        self.stats.branches_ended += 1
        return True

    def evicted(self, node: NodeId, pages: Iterable[PageHash]) -> int:
        """E.2 lines 19-20: `node` freed its host copies of `pages`; returns counts dropped."""
        if self._exact is not None:
            return self._exact.evicted(node, pages)
        gone = frozenset(pages)
        self.stats.pages_evicted += len(gone)
        mine = self._node_runs.get(node)
        if not mine:
            return 0
        hit: dict[_Run, list[PageHash]] = {}
        run = self._run
        for page in run.keys() & gone:
            r = run[page]
            if r in mine:
                hit.setdefault(r, []).append(page)
        if not hit:
            return 0
        spans: list[tuple[PageHash, int, int]] = []  # (first page, lo, hi) in depth, evicted and counted here
        for r, got in hit.items():
            if len(got) == len(r.pages):  # the whole run
                spans.append((r.pages[0], r.depth, r.depth + len(r.pages)))
            else:
                hits = set(got)
                for lo, hi in _ranges(i for i, p in enumerate(r.pages) if p in hits):
                    spans.append((r.pages[lo], r.depth + lo, r.depth + hi))
        dropped = 0
        branches = self._branches
        on_node = self._on_node.get(node, ())
        through: list[tuple[BranchId, tuple[tuple[int, int], ...]]]
        if len(spans) == 1:  # (the usual event: one stretch) only the branches through it, found in one pass
            first, lo, hi = spans[0]
            through = [(br, ((lo, hi),)) for br in on_node if lo < len(p := branches[br].path) and p[lo] == first]
        else:
            through = []
            for br in on_node:
                path = branches[br].path
                cut = tuple(sorted((lo, hi) for first, lo, hi in spans if lo < len(path) and path[lo] == first))
                if cut:
                    through.append((br, cut))
        for branch, cut in sorted(through):  # (in branch order, as the counts were always changed)
            b = branches[branch]
            current = b.counted[node]
            left = _minus(current, cut)
            if left != current:
                dropped += _size(current) - _size(left)
                self._count(branch, b, node, left)
        return dropped

    def restore(self, branch: BranchId, state: BranchState) -> None:
        """Persistence hook (`router.branch_snapshot`): recreate `branch` as a snapshot recorded it. Its pages
        are counted again on each node with a phase (so invariant 2 holds by construction); copies on nodes
        without one are dropped, with the targets naming them. Raises ValueError for a branch already here."""
        if self._exact is not None:
            return self._exact.restore(branch, state)
        if branch in self._branches:
            raise ValueError(f"branch {branch!r} is already in the table")
        path = tuple(state.path)
        where = {p: i for i, p in enumerate(path)}
        counted = {n: pages for n, pages in state.counted.items() if n in self._phase and pages}
        try:
            if len(where) != len(path) or any(not where.keys() >= pages for pages in counted.values()):
                raise _NotChained
            self._plan(path, 0)
        except _NotChained:
            return self._to_exact().restore(branch, state)
        b = self._branches[branch] = _Branch(state.version, path)
        self._attach(path, 0)
        for node, pages in counted.items():
            self._count(branch, b, node, _ranges(map(where.__getitem__, pages)))
        b.targets = {phase: node for phase, node in state.targets.items() if self._phase.get(node) is phase}
        b.unsettled = set(state.unsettled)

    # --------------------------------------------------------------------------------------- queries
    def _row(self, branch: BranchId, action: str) -> _Branch:
        b = self._branches.get(branch)
        if b is None:
            raise KeyError(f"cannot {action} branch {branch!r}: it has no request yet (call request() first)")
        return b

    def count(self, page: PageHash, node: NodeId) -> int:
        """R[page][node]."""
        if self._exact is not None:
            return self._exact.count(page, node)
        r = self._run.get(page)
        return r.counts.get(node, 0) if r is not None else 0

    def counts_for(self, node: NodeId) -> dict[PageHash, int]:
        """A copy of the positive counts on `node`."""
        if self._exact is not None:
            return self._exact.counts_for(node)
        out: dict[PageHash, int] = {}
        for r in self._node_runs.get(node, ()):
            out.update(zip(r.pages, repeat(r.counts[node])))
        return out

    def _take(self, node: NodeId) -> Mapping[PageHash, int]:
        marks = self._dirty.pop(node, None)
        if not marks:
            return {}
        run = self._run
        # the stretches of one count each, every count read now (so a page in two stretches has one count)
        out = CountUpdates(consistent=True)
        add = out.add
        for pages, depth in marks:
            i, n = 0, len(pages)
            while i < n:
                r = run.get(pages[i])
                if r is None:  # no active path holds it, nor (chained) the pages after it
                    add(pages[i:] if i else pages, 0)
                    break
                o = depth + i - r.depth
                m = min(n - i, len(r.pages) - o)
                part = pages if m == n else pages[i : i + m]
                if not (pages is r.pages or part == r.pages[o : o + m]):
                    m = _common(part, r.pages[o : o + m])  # the rest left the tree
                    add(pages[i : i + m], r.counts.get(node, 0))
                    add(pages[i + m :], 0)
                    break
                add(part, r.counts.get(node, 0))
                i += m
        return out

    def take_updates(self, node: NodeId) -> Mapping[PageHash, int]:
        """Counts on `node` that changed since the last call for it (0 = released); clears the record."""
        if self._exact is not None:
            return self._exact.take_updates(node)
        return self._take(node)

    def dirty_nodes(self) -> tuple[NodeId, ...]:
        """Nodes with count changes not yet taken (`take_updates`), in the order they first changed."""
        if self._exact is not None:
            return self._exact.dirty_nodes()
        return tuple(self._dirty)  # a node's list of changed runs is never empty

    def branches(self) -> tuple[BranchId, ...]:
        if self._exact is not None:
            return self._exact.branches()
        return tuple(self._branches)

    def __contains__(self, branch: object) -> bool:
        if self._exact is not None:
            return branch in self._exact
        return branch in self._branches

    def __len__(self) -> int:
        """Active branches."""
        if self._exact is not None:
            return len(self._exact)
        return len(self._branches)

    def active_pages(self) -> int:
        """Distinct pages on the active branches' paths (a prefix shared by several paths counts once): every
        such page maps to its run (run invariant), so this is O(1)."""
        if self._exact is not None:
            return self._exact.active_pages()
        return len(self._run)

    def _state(self, b: _Branch) -> BranchState:
        path = b.path
        counted = {n: frozenset(chain.from_iterable(path[lo:hi] for lo, hi in r)) for n, r in b.counted.items()}
        return BranchState(b.version, path, counted, dict(b.targets), frozenset(b.unsettled))

    def state(self, branch: BranchId) -> BranchState:
        if self._exact is not None:
            return self._exact.state(branch)
        return self._state(self._row(branch, "read"))

    def nodes_with_counts(self) -> tuple[NodeId, ...]:
        if self._exact is not None:
            return self._exact.nodes_with_counts()
        return tuple(n for n, runs in self._node_runs.items() if runs)

    def phases(self) -> dict[NodeId, Phase]:
        if self._exact is not None:
            return self._exact.phases()
        return dict(self._phase)

    @property
    def runs(self) -> int:
        """Runs in the tree (0 once page-exact)."""
        return len(set(map(id, self._run.values())))

    def check(self) -> None:
        """Assert invariant 5 and the counts against the branches' ranges (for tests; walks everything)."""
        if self._exact is not None:
            return
        runs = {id(r): r for r in self._run.values()}.values()
        for r in runs:
            assert r.pages and all(self._run[p] is r for p in r.pages), "a run's pages map to it"
            assert r.refs > 0
            assert all(c > 0 for c in r.counts.values())
            kids = sum(1 for s in runs if s.parent is not None and s.parent == r.pages[-1])
            assert kids == r.children, (kids, r.children)
            if r.parent is not None:
                up = self._run[r.parent]
                assert up.depth + len(up.pages) == r.depth and up.pages[-1] == r.parent
            else:
                assert r.depth == 0
        refs: dict[int, int] = {}
        counts: dict[int, dict[NodeId, int]] = {}
        for b in self._branches.values():
            i = 0
            while i < len(b.path):
                r = self._run[b.path[i]]
                assert r.depth == i and b.path[i : i + len(r.pages)] == r.pages, "a path holds whole runs"
                refs[id(r)] = refs.get(id(r), 0) + 1
                i += len(r.pages)
            for node, ranges in b.counted.items():
                assert ranges and all(lo < hi <= len(b.path) for lo, hi in ranges)
                for lo, hi in ranges:
                    i = lo
                    while i < hi:
                        r = self._run[b.path[i]]
                        assert r.depth == i and i + len(r.pages) <= hi, "ranges end at run boundaries"
                        per = counts.setdefault(id(r), {})
                        per[node] = per.get(node, 0) + 1
                        i += len(r.pages)
        for r in runs:
            assert refs.get(id(r), 0) == r.refs, "refs count the paths through the run"
            assert counts.get(id(r), {}) == r.counts, "a run's counts are its branches' ranges"
        for node, mine in self._node_runs.items():
            assert set(map(id, mine)) == {id(r) for r in runs if node in r.counts}
