"""The page-exact branch table: algorithms E.1 (branch version of a request) and E.2 (counts), page by page.

The simple form of `BranchTable` (`branches.py`, which keeps the counts per run of pages): the same calls and
answers, with C[β][n] as a set of pages and R[b][n] as one dictionary entry per page. Kept as the oracle the
run-based table is tested against (hypothesis state machine in `tests/router/test_branches_runs.py`), as the
table the run-based one falls back to when it is given paths that are not chains of pages, and for
comparisons in `bench router --page-exact-counts`. It also defines the records both tables answer with.

Notation as in the paper: a branch β has a version v_β, the path π_β of its latest request (the hashes of
the full pages of its input, including the pages its prefill adds), and per node n the set C[β][n] of pages
it is counted on there; N_β = {n : C[β][n] ≠ ∅}. R[b][n] is the number of active branches counted on page
b at node n. `Count(β, n, π)` makes β count exactly π on n: +1 on π \\ C[β][n], -1 on C[β][n] \\ π.

Invariants (after every public call; property-tested in tests/router/test_branches_machine.py
and tests/router/test_branches_runs.py):
1. no count is negative, and only positive counts are stored;
2. R[b][n] == |{β active : b ∈ C[β][n]}| for every page b and node n;
3. for every active branch β and phase φ not in β's `unsettled` phases, at most one node of phase φ holds
   counts of β ("at most one copy per phase"). A phase is unsettled only between a placement whose target
   does not yet hold the current version and the `confirm_held` of that target, and after a P->D phase
   switch carried a second decode copy over, until β's next settled decode placement;
4. after every branch has ended, every count is zero (no R entry remains).

Choices where the paper leaves room (docs/kv-directory.md explains them):
- Same-phase moves: `place(β, n, held=True)` says n already holds the current version (the source is
  released at once); `held=False` leaves the other same-phase copies counted until `confirm_held(β, n, v)`
  for the current version v and current target n of that phase. A confirmation for an older version, or for
  a node that is no longer β's target in its phase, changes nothing and is counted as stale.
- Releasing a same-phase copy releases every other node of that phase holding counts of β, including a copy
  a P->D switch carried over.
- Eviction (E.2 lines 19-20) drops the evicted pages from every C[β][n]; a later placement of β on n counts
  them again (n will hold them again after its prefill or fetch). R[·][n] serves as the index: evicted pages
  with no count on n are in no C[β][n], so only the branches on n are scanned, and only for counted pages.
- `drop_node` (the node died) releases every count on it and forgets its phase.

Boundary: pure bookkeeping; callers pass the node phases and the events (requests, placements,
confirmations, branch ends, phase switches, evictions). Nodes read their counts with `counts_for` or the
incremental `take_updates`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add, not_, sub

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase

_EMPTY: frozenset[PageHash] = frozenset()


@dataclass(frozen=True, slots=True)
class RequestVersion:
    """Output of algorithm E.1 for one request."""

    branch: BranchId
    version: int
    old_path: tuple[PageHash, ...]
    new_path: tuple[PageHash, ...]
    new_branch: bool
    rewritten: bool


@dataclass(frozen=True, slots=True)
class Placement:
    """Result of placing a branch on a node: which same-phase copies were released or still wait."""

    branch: BranchId
    node: NodeId
    version: int
    added: int
    released: tuple[NodeId, ...]
    awaiting: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class BranchState:
    """Read-only snapshot of one branch's row of the table."""

    version: int
    path: tuple[PageHash, ...]
    counted: dict[NodeId, frozenset[PageHash]]
    targets: dict[Phase, NodeId]
    unsettled: frozenset[Phase]


@dataclass(slots=True)
class BranchStats:
    requests: int = 0
    rewrites: int = 0
    placements: int = 0
    stale_confirmations: int = 0
    branches_ended: int = 0
    unknown_branch_ends: int = 0
    pages_evicted: int = 0
    page_exact: bool = False
    """The run-based table met a path that is not a chain and went on page by page."""


@dataclass(slots=True)
class _Branch:
    version: int = 1
    path: tuple[PageHash, ...] = ()
    path_set: frozenset[PageHash] = _EMPTY
    counted: dict[NodeId, frozenset[PageHash]] = field(default_factory=dict)
    targets: dict[Phase, NodeId] = field(default_factory=dict)
    unsettled: set[Phase] = field(default_factory=set)


class PageBranchTable:
    """Branch versions and paths (E.1) and the counts R[b][n] (E.2), page by page (the oracle)."""

    __slots__ = ("_branches", "_phase", "_counts", "_on_node", "_dirty", "stats")

    def __init__(self, phases: dict[NodeId, Phase] | None = None) -> None:
        self._branches: dict[BranchId, _Branch] = {}
        self._phase: dict[NodeId, Phase] = dict(phases or {})
        self._counts: dict[NodeId, dict[PageHash, int]] = {}
        self._on_node: dict[NodeId, set[BranchId]] = {}
        self._dirty: dict[NodeId, set[PageHash]] = {}
        self.stats = BranchStats()

    # ------------------------------------------------------------------------------------- E.2 Count
    def _count(self, branch: BranchId, b: _Branch, node: NodeId, pages: frozenset[PageHash]) -> int:
        """Count(β, n, π); returns the number of pages newly counted."""
        current = b.counted.get(node, _EMPTY)
        if current == pages:
            return 0
        added = pages - current
        dropped = current - pages
        counts = self._counts.setdefault(node, {})
        # Page by page as C-level maps: +1 on `added`; -1 on `dropped`, dropping the counts that reach 0.
        counts.update(zip(added, map(add, map(counts.get, added, repeat(0)), repeat(1))))
        if dropped:
            counts.update(zip(dropped, map(sub, map(counts.__getitem__, dropped), repeat(1))))
            for page in compress(dropped, map(not_, map(counts.__getitem__, dropped))):
                del counts[page]
        dirty = self._dirty.setdefault(node, set())
        dirty |= added
        dirty |= dropped
        if pages:
            b.counted[node] = pages
            self._on_node.setdefault(node, set()).add(branch)
        else:
            del b.counted[node]
            self._on_node[node].discard(branch)
        return len(added)

    def _release_same_phase(
        self, branch: BranchId, b: _Branch, keep: NodeId, phase: Phase
    ) -> tuple[NodeId, ...]:
        others = tuple(m for m in b.counted if m != keep and self._phase.get(m) is phase)
        for m in others:
            self._count(branch, b, m, _EMPTY)
        b.unsettled.discard(phase)
        return others

    # ----------------------------------------------------------------------------------------- nodes
    def set_phase(self, node: NodeId, phase: Phase) -> tuple[BranchId, ...]:
        """Record `node`'s phase. D->P releases every branch's counts on it (returned); P->D keeps them."""
        old = self._phase.get(node)
        self._phase[node] = phase
        if old is None or old is phase:
            return ()
        branches = tuple(sorted(self._on_node.get(node, ())))
        for branch in branches:
            b = self._branches[branch]
            if old is Phase.DECODE:
                self._count(branch, b, node, _EMPTY)
            elif sum(1 for m in b.counted if self._phase[m] is phase) > 1:
                b.unsettled.add(phase)
        for row in self._branches.values():
            if row.targets.get(old) == node:
                del row.targets[old]
        return branches if old is Phase.DECODE else ()

    def phase(self, node: NodeId) -> Phase:
        try:
            return self._phase[node]
        except KeyError:
            raise KeyError(f"node {node!r} has no phase; call set_phase({node!r}, Phase.X) first") from None

    def drop_node(self, node: NodeId) -> tuple[BranchId, ...]:
        """The node died: release every branch's counts on it and forget its phase."""
        branches = tuple(sorted(self._on_node.get(node, ())))
        for branch in branches:
            self._count(branch, self._branches[branch], node, _EMPTY)
        for row in self._branches.values():
            for phase, target in list(row.targets.items()):
                if target == node:
                    del row.targets[phase]
        self._phase.pop(node, None)
        self._on_node.pop(node, None)
        self._counts.pop(node, None)
        return branches

    # -------------------------------------------------------------------------------- E.1 + requests
    def request(self, branch: BranchId, path: Sequence[PageHash]) -> RequestVersion:
        """Algorithm E.1 for a request of `branch` whose input's full pages are `path`, then E.2 lines 5-8."""
        self.stats.requests += 1
        new_path = tuple(path)
        b = self._branches.get(branch)
        if b is None:
            b = self._branches[branch] = _Branch()
            old_path: tuple[PageHash, ...] = ()
            new_branch, rewritten = True, False
        else:
            old_path = b.path
            new_branch = False
            rewritten = new_path[: len(old_path)] != old_path
        b.path = new_path
        b.path_set = frozenset(new_path)
        if rewritten:
            b.version += 1
            self.stats.rewrites += 1
            for node in tuple(b.counted):
                self._count(branch, b, node, b.counted[node] & b.path_set)
        return RequestVersion(branch, b.version, old_path, new_path, new_branch, rewritten)

    def place(self, branch: BranchId, node: NodeId, *, held: bool = True) -> Placement:
        """Place `branch` on `node` (prefill routing or decode binding): Count(β, n, π_β).

        `held=True`: `node` already holds the branch's current version, so the other copies of the same
        phase are released now (P2P/D2D move). `held=False`: they stay counted until `confirm_held`.
        Copies on nodes of the other phase always keep their counts (P2D/D2P).
        """
        b = self._row(branch, "place")
        phase = self.phase(node)
        self.stats.placements += 1
        added = self._count(branch, b, node, b.path_set)
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
        b = self._branches.get(branch)
        phase = self._phase.get(node)
        if b is None or phase is None or version != b.version or b.targets.get(phase) != node:
            self.stats.stale_confirmations += 1
            return ()
        return self._release_same_phase(branch, b, node, phase)

    def end(self, branch: BranchId) -> bool:
        """The branch finished: release all its counts and remove it. False if the branch is unknown."""
        b = self._branches.pop(branch, None)
        if b is None:
            self.stats.unknown_branch_ends += 1
            return False
        for node in tuple(b.counted):
            self._count(branch, b, node, _EMPTY)
        self.stats.branches_ended += 1
        return True

    def evicted(self, node: NodeId, pages: Iterable[PageHash]) -> int:
        """E.2 lines 19-20: `node` freed its host copies of `pages`; returns counts dropped."""
        gone = frozenset(pages)
        self.stats.pages_evicted += len(gone)
        counts = self._counts.get(node)
        # R[b][n] indexes the counted pages: only a page with a positive count is in some C[β][n] (invariant 2).
        counted = counts.keys() & gone if counts else None
        if not counted:
            return 0
        dropped = 0
        for branch in sorted(self._on_node.get(node, ())):
            b = self._branches[branch]
            current = b.counted[node]
            if not current.isdisjoint(counted):
                hit = current & counted
                dropped += len(hit)
                self._count(branch, b, node, current - hit)
        return dropped

    def restore(self, branch: BranchId, state: BranchState) -> None:
        """Persistence hook (`router.branch_snapshot`): recreate `branch` as a snapshot recorded it. Its pages
        are counted again on each node with a phase (so invariant 2 holds by construction); copies on nodes
        without one are dropped, with the targets naming them. Raises ValueError for a branch already here."""
        if branch in self._branches:
            raise ValueError(f"branch {branch!r} is already in the table")
        b = self._branches[branch] = _Branch(state.version, tuple(state.path), frozenset(state.path))
        for node, pages in state.counted.items():
            if node in self._phase and pages:
                self._count(branch, b, node, frozenset(pages))
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
        return self._counts.get(node, {}).get(page, 0)

    def counts_for(self, node: NodeId) -> dict[PageHash, int]:
        """A copy of the positive counts on `node`."""
        return dict(self._counts.get(node, {}))

    def take_updates(self, node: NodeId) -> dict[PageHash, int]:
        """Counts on `node` that changed since the last call for it (0 = released); clears the record."""
        dirty = self._dirty.pop(node, None)
        if not dirty:
            return {}
        counts = self._counts.get(node, {})
        return dict(zip(dirty, map(counts.get, dirty, repeat(0))))

    def dirty_nodes(self) -> tuple[NodeId, ...]:
        """Nodes with count changes not yet taken (`take_updates`), in the order they first changed."""
        return tuple(self._dirty)

    def branches(self) -> tuple[BranchId, ...]:
        return tuple(self._branches)

    def __contains__(self, branch: object) -> bool:
        return branch in self._branches

    def __len__(self) -> int:
        """Active branches."""
        return len(self._branches)

    def active_pages(self) -> int:
        """Distinct pages on the active branches' paths (a prefix shared by several paths counts once)."""
        return len(frozenset().union(*(b.path_set for b in self._branches.values())))

    def state(self, branch: BranchId) -> BranchState:
        b = self._row(branch, "read")
        return BranchState(b.version, b.path, dict(b.counted), dict(b.targets), frozenset(b.unsettled))

    def nodes_with_counts(self) -> tuple[NodeId, ...]:
        return tuple(n for n, c in self._counts.items() if c)

    def phases(self) -> dict[NodeId, Phase]:
        return dict(self._phase)
