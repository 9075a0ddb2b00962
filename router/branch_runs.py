"""The run tree of the branch table (`branches.BranchTable`): runs of pages shared by the active paths, split,
cut and merged as paths attach and detach, with one count per node added per run.

Page hashes are chained (a page's hash names its whole prefix), so the active paths form a prefix tree, and
page b sits at the same depth (index) in every path holding it. The tree is kept as runs: consecutive pages of
the paths that every active path holds entirely or not at all (a run ends where a path ends or forks), with one
count per node for the whole run. `RunTree._add` changes a node's counts on index ranges of a path one step
per run: it cuts runs at the ranges' ends, adds to each run between, and merges again. Adjacent runs merge
again when nothing tells them apart (one child, the same paths and the same counts). Each changed run is
recorded as its (pages, depth) in the node's list of changes. A path that breaks the chain rule (a page at
two depths, or under two parents) is refused with `_NotChained` before anything changes (`RunTree._plan`).

Run invariant (invariant 5 of `branches`; checked by `BranchTable.check`): every page of an active path maps
to the one run holding it; a run's pages are consecutive pages of every path through it (all or none of them),
`refs` is the number of those paths and `children` the number of runs starting under its last page.

Boundary: the tree, its runs and their per-node counts, over the tables declared on `RunTree`; no branch
semantics (versions, which ranges a branch counts on which node, phases, placements) — those are `branches`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import repeat

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId

Ranges = tuple[tuple[int, int], ...]
"""Sorted, disjoint, non-adjacent [lo, hi) index ranges over a branch's path."""


class _NotChained(Exception):
    """A path breaks the chain rule; the table turns page-exact."""


class _Run:
    """Consecutive pages of the active paths' tree: `depth` is the index of the first page in every path
    holding it, `parent` the page before it (None at a root); one count per node (positive only)."""

    __slots__ = ("pages", "depth", "parent", "counts", "refs", "children")

    def __init__(self, pages: tuple[PageHash, ...], depth: int, parent: PageHash | None) -> None:
        self.pages = pages
        self.depth = depth
        self.parent = parent
        self.counts: dict[NodeId, int] = {}
        self.refs = 0
        self.children = 0


def _minus(a: Ranges, b: Ranges) -> Ranges:
    """a \\ b."""
    if not b or not a:
        return a
    out: list[tuple[int, int]] = []
    j = 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k = j
        while lo < hi and k < len(b) and b[k][0] < hi:
            if b[k][0] > lo:
                out.append((lo, b[k][0]))
            lo = max(lo, b[k][1])
            k += 1
        if lo < hi:
            out.append((lo, hi))
    return tuple(out)


def _ranges(positions: Iterable[int]) -> Ranges:
    out: list[tuple[int, int]] = []
    for p in sorted(set(positions)):
        if out and out[-1][1] == p:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return tuple(out)


def _size(ranges: Ranges) -> int:
    return sum(hi - lo for lo, hi in ranges)


def _common(a: Sequence[PageHash], b: Sequence[PageHash]) -> int:
    """Length of the common prefix of two page tuples (C-level slice comparisons, binary search)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RunTree:
    """Run-tree operations over the tables of `BranchTable` (declared here for type checkers)."""

    __slots__ = ()

    _run: dict[PageHash, _Run]  # every page of an active path -> its run
    _node_runs: dict[NodeId, dict[_Run, None]]  # runs with a positive count on the node
    _dirty: dict[NodeId, list[tuple[tuple[PageHash, ...], int]]]  # changed (pages, depth)

    def _split(self, r: _Run, o: int) -> None:
        """Split run `r` before its page `o` (0 < o < len); the smaller part moves to a new run object."""
        pages = r.pages
        run = self._run
        if o * 2 >= len(pages):  # the right part is the smaller: it moves
            new = _Run(pages[o:], r.depth + o, pages[o - 1])
            new.children = r.children
            r.pages = pages[:o]
            r.children = 1
            moved = new.pages
        else:
            new = _Run(pages[:o], r.depth, r.parent)
            new.children = 1
            r.pages = pages[o:]
            r.depth += o
            r.parent = pages[o - 1]
            moved = new.pages
        new.refs = r.refs
        new.counts = dict(r.counts)
        for node in r.counts:
            self._node_runs[node][new] = None
        run.update(zip(moved, repeat(new)))

    def _cut(self, path: tuple[PageHash, ...], i: int) -> None:
        """A run boundary before index `i` of `path` (whose page `i - 1` is in the tree)."""
        if 0 < i < len(path):
            r = self._run[path[i - 1]]
            if r.depth + len(r.pages) > i:
                self._split(r, i - r.depth)

    def _merge(self, path: tuple[PageHash, ...], i: int) -> None:
        """Merge the runs on either side of index `i` of `path` if nothing tells them apart."""
        if not 0 < i < len(path):
            return
        run = self._run
        left = run.get(path[i - 1])
        right = run.get(path[i])
        if (
            left is None or right is None or left is right or left.children != 1 or right.depth != i
            or left.refs != right.refs or left.counts != right.counts
        ):  # fmt: skip
            return
        if len(left.pages) >= len(right.pages):
            keep, gone = left, right
            keep.pages = left.pages + right.pages
            keep.children = right.children
            run.update(zip(right.pages, repeat(keep)))
        else:
            keep, gone = right, left
            keep.pages = left.pages + right.pages
            keep.depth = left.depth
            keep.parent = left.parent
            run.update(zip(left.pages, repeat(keep)))
        for node in gone.counts:
            del self._node_runs[node][gone]

    def _plan(self, path: tuple[PageHash, ...], start: int) -> int:
        """Check that `path[start:]` continues the tree as a chain (`path[:start]` is in it already); the index
        where its new pages begin. Raises `_NotChained`."""
        run = self._run
        n = len(path)
        i = start
        while i < n:
            r = run.get(path[i])
            if r is None:
                break
            o = i - r.depth
            if not (0 <= o < len(r.pages) and r.pages[o] == path[i]):
                raise _NotChained  # the page sits at another depth in the tree
            if (r.pages[o - 1] if o else r.parent) != (path[i - 1] if i else None):
                raise _NotChained  # the page sits under another parent in the tree
            m = min(len(r.pages) - o, n - i)
            k = _common(r.pages[o : o + m], path[i : i + m])
            i += k
            if k < m:
                break  # the path leaves the run inside it: the rest is new (checked below)
        if i < n:
            new = path[i:]
            if not run.keys().isdisjoint(new) or len(set(new)) != len(new):
                raise _NotChained
        return i

    def _attach(self, path: tuple[PageHash, ...], start: int) -> None:
        """`path` becomes an active path from index `start` on (its pages before `start` already are)."""
        n = len(path)
        if start >= n:
            return
        fresh = self._plan(path, start)
        run = self._run
        self._cut(path, start)
        i = start
        while i < fresh:
            r = run[path[i]]
            m = min(len(r.pages), fresh - i)
            if m < len(r.pages):
                self._split(r, m)
                r = run[path[i]]
            r.refs += 1
            i += m
        if fresh < n:
            new = _Run(path[fresh:], fresh, path[fresh - 1] if fresh else None)
            new.refs = 1
            run.update(zip(new.pages, repeat(new)))
            if fresh:
                run[path[fresh - 1]].children += 1

    def _detach(self, path: tuple[PageHash, ...], start: int) -> None:
        """`path` is no longer an active path from index `start` on; runs no path holds leave."""
        n = len(path)
        if start >= n:
            return
        run = self._run
        self._cut(path, start)
        gone: list[_Run] = []
        i = start
        while i < n:
            r = run[path[i]]
            r.refs -= 1
            if not r.refs:
                gone.append(r)
            i += len(r.pages)
        for r in gone:
            assert not r.counts, "a run without paths kept counts"
            deque(map(run.pop, r.pages), maxlen=0)
        if gone and gone[0].parent is not None:
            parent = run.get(gone[0].parent)
            if parent is not None:
                parent.children -= 1
        self._merge(path, start)

    def _add(self, path: tuple[PageHash, ...], node: NodeId, ranges: Ranges, delta: int) -> None:
        """R[·][node] += delta on the pages of `ranges` of `path`."""
        run = self._run
        marks = self._dirty.setdefault(node, [])
        mine = self._node_runs[node]
        for lo, hi in ranges:
            self._cut(path, lo)
            self._cut(path, hi)
            i = lo
            while i < hi:
                r = run[path[i]]
                c = r.counts.get(node, 0) + delta
                if c:
                    if c == 1 and delta > 0:
                        mine[r] = None
                    r.counts[node] = c
                else:
                    del r.counts[node]
                    del mine[r]
                marks.append((r.pages, r.depth))
                i += len(r.pages)
        for lo, hi in ranges:
            self._merge(path, hi)
            self._merge(path, lo)
