"""A decode node's admission of received prompts, timed alone (issue #11: where the partition's time goes).

    python scripts/bench_decode_admission.py [--pages 1700] [--l1 20000] [--l2 60000] [--admissions 300]
                                             [--tree TREE]

One node's pool over the id tables and dense labels (as the simulator runs it), L1 and L2 filled first: each
admission (`walks.admit_prompt`) receives a prompt of `--pages` pages none of its tiers holds (a chain of new
labels), so it evicts as many pages from L1 (written through to L2, which evicts too), stores the prompt and
records its KV events; the request is then released (its pages cached) and the events drained. Printed: thread CPU
per admission, min / median / p90 over `--admissions` (after 60 untimed ones). `--tree TREE` imports every
component from a copy of another tree (`scripts/sim_reference_runs.py`'s finder), to compare two trees run one
after the other.

Boundary: a development benchmark; never imported by the package.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=1700, help="pages per received prompt")
    parser.add_argument("--l1", type=int, default=20_000, help="L1 pages")
    parser.add_argument("--l2", type=int, default=60_000, help="L2 pages")
    parser.add_argument("--admissions", type=int, default=300, help="timed admissions")
    parser.add_argument("--tree", type=Path, help="import the components from this copy of a tree")
    args = parser.parse_args()
    if min(args.pages, args.l1, args.l2, args.admissions) < 1 or args.pages + 8 > args.l1:
        parser.error("--pages, --l1, --l2 and --admissions must be >= 1, and a prompt must fit L1")
    if args.tree is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import sim_reference_runs

        sim_reference_runs.import_from(args.tree.resolve())

    from evolving_infra.core.eviction import BranchCountEviction
    from evolving_infra.core.pages import PageHash
    from evolving_infra.core.types import NodeId
    from evolving_infra.node_agent.engine import KvPool, walks
    from evolving_infra.node_agent.engine.idpool import PageTables

    pool = KvPool(NodeId("n"), args.l1, args.l2, BranchCountEviction(), tables=PageTables.IDS, dense_labels=True)
    times: list[float] = []
    now = 0.0
    for k in range(args.admissions + 60):
        now += 1.0
        first = 1_000_000 + k * (args.pages + 7)  # new labels for every prompt
        prompt = tuple(PageHash(first + i) for i in range(args.pages))
        owner = f"r{k}"
        started = time.thread_time()
        admitted = walks.admit_prompt(pool, owner, prompt, args.pages + 8, now)
        took = time.thread_time() - started
        if not admitted:
            raise SystemExit(f"admission {k} found no room (L1 {args.l1} pages)")
        pool.release(owner, now)
        pool.drain_events()
        if k >= 60:
            times.append(took)
    times.sort()
    print(f"admission of {args.pages:,} new pages (L1 {args.l1:,}, L2 {args.l2:,} pages, {len(times)} timed): "
          f"min {1e6 * times[0]:.0f} us, median {1e6 * statistics.median(times):.0f} us, "
          f"p90 {1e6 * times[int(0.9 * len(times))]:.0f} us")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
