"""Microbenchmark of the router's branch counts under one-page host evictions (issue #11):

    python scripts/bench_branch_evicted.py [BRANCHES ...]

For each count of branches (default 40 and 160), that many branches with 2,000-page paths are counted on one
node, and 20,000 one-page evictions (each path's end first, in turn) go through `BranchTable.evicted`; prints the
process CPU time per call. At partition scale a node whose host pool holds only counted pages writes back L1
evictions page by page, and each page is its own KV event (docs/benchmarks.md).

Boundary: a development tool; drives the public `BranchTable` only.
"""

from __future__ import annotations

import sys
import time

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase
from evolving_infra.router.branches import BranchTable

PATH_PAGES = 2000
EVENTS = 20_000


def per_call_us(branches: int) -> float:
    node = NodeId("n0")
    table = BranchTable({node: Phase.PREFILL})
    paths = []
    for b in range(branches):
        path = [PageHash(10**9 * (b + 1) + i) for i in range(PATH_PAGES)]
        paths.append(path)
        table.request(BranchId(f"b{b}"), path)
        table.place(BranchId(f"b{b}"), node)
    events = [[paths[j % branches][PATH_PAGES - 1 - j // branches]] for j in range(min(branches * PATH_PAGES, EVENTS))]
    start = time.process_time()
    for pages in events:
        table.evicted(node, pages)
    return 1e6 * (time.process_time() - start) / len(events)


def main(argv: list[str]) -> int:
    for branches in [int(a) for a in argv] or [40, 160]:
        if branches < 1:
            raise SystemExit(f"branches must be >= 1, got {branches}")
        print(f"{branches} branches of {PATH_PAGES} pages: {per_call_us(branches):.1f} us per one-page eviction")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
