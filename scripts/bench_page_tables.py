"""What one page costs in the engine's tables, per kind of operation: the figures behind the design of the
pools as arrays of page ids (docs/benchmarks.md, "Where the per-page cost comes from").

Measures, on tables the size of one node's host tier (default 130,000 resident pages, random 64-bit page
hashes as the content hashes are), the cost per page of a run of pages (default 2,000, a CC prompt's order):
- the hash tables the tier keeps today (`dict.update`, `set.update`, `set.difference_update`, lookups);
- the same operations on numpy arrays indexed by dense page ids (`arr[ids] = now`, gathers, a lexsort);
- the resolution of a run's hashes to ids (one dict lookup per page), which the array design pays once per
  request and operation where it holds no ids yet;
- `TierPool` itself: a run pinned at one time and released at a later one (`pin_all`, `unpin_all`), the
  two operations every admitted request makes on every prompt page; and the same on `idpages.IdTier` (the
  tier over page ids, work in progress), with the run's hashes resolved to ids each time or with the ids kept;
- eviction in policy order (500 pages at a time) from both tiers filled alike, checking that they choose the
  same pages;
- the admission walk (how many pages from a prompt's start a tier holds): page by page over the resident set
  as today, and from the id masks (`IdTier.holds`, `held_prefix`);
- a decode's stores, one page at a time into L1 and through to L2, by `KvPool` over each kind of tables.

Prints one JSON object (nanoseconds per page). Not a test: figures depend on the machine's caches; compare
within one run.

    .venv/bin/python scripts/bench_page_tables.py [--resident 130000] [--run 2000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

import numpy as np

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, Tier
from evolving_infra.node_agent.engine import KvPool
from evolving_infra.node_agent.engine.idpages import IdTier, PageIds, held_prefix
from evolving_infra.node_agent.engine.idpool import PageTables
from evolving_infra.node_agent.engine.tier import TierPool


def _per_page(fn: Callable[[int], object], repeat: int, run: int) -> float:
    """Nanoseconds per page of `fn(i)` over `repeat` calls on runs of `run` pages (best of three rounds)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter_ns()
        for i in range(repeat):
            fn(i)
        best = min(best, (time.perf_counter_ns() - start) / (repeat * run))
    return round(best, 1)


def _eviction(pages: list[int], run: int, rng: random.Random) -> dict[str, float]:
    """Eviction in policy order, 500 pages at a time, from both tiers filled alike: chains of `run` pages
    stored at distinct times, then 300 prefixes of them touched at later times (so buckets of many sizes)."""
    n = len(pages)
    pool = TierPool(Tier.HOST, n, BranchCountEviction(), {})
    page_ids = PageIds({})
    id_tier = IdTier("host", n, BranchCountEviction(), page_ids)
    now = 0.0
    for start in range(0, n, run):
        now += 1.0
        part = pages[start : start + run]
        items: dict[int, int | None] = dict(zip(part, [None, *part[:-1]]))
        pool.insert_all(items, now)
        id_tier.insert(items, now)
    for _ in range(300):
        now += 1.0
        start = rng.randrange(0, n, run)
        touched = pages[start : start + rng.randrange(1, run)]
        pool.touch_all(set(touched), now)
        id_tier.touch(page_ids.ids(touched), now)
    rounds = min(100, n // 1000)

    def old() -> None:
        pool.remove_victims(pool.victims(500))

    def new() -> None:
        id_tier.evict(500)

    out = {}
    for name, fn in (("tierpool_evict_ns", old), ("idtier_evict_ns", new)):
        start_ns = time.perf_counter_ns()
        for _ in range(rounds):
            fn()
        out[name] = round((time.perf_counter_ns() - start_ns) / (rounds * 500), 1)
    if pool.victims(500) != page_ids.hash_of(id_tier.order.victims(500)):
        raise SystemExit("the two tiers' eviction orders differ (a defect of idpages)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resident", type=int, default=130_000, help="pages in the tables (one node's host tier)")
    parser.add_argument("--run", type=int, default=2_000, help="pages per operation (one prompt's order)")
    parser.add_argument("--repeat", type=int, default=200, help="operations per measurement")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.run > args.resident:
        parser.error("--run must not exceed --resident")
    rng = random.Random(args.seed)
    pages = [rng.getrandbits(64) for _ in range(args.resident)]
    # a run is a stretch of pages stored together (adjacent in the tables' insertion order), as a chain is
    starts = [rng.randrange(args.resident - args.run + 1) for _ in range(args.repeat)]
    runs = [pages[s : s + args.run] for s in starts]
    run_sets = [set(r) for r in runs]
    out: dict[str, float | int] = {"resident_pages": args.resident, "run_pages": args.run}

    access = dict.fromkeys(pages, 0.0)
    out["dict_update_ns"] = _per_page(lambda i: access.update(dict.fromkeys(runs[i], float(i))), args.repeat, args.run)
    out["dict_lookup_ns"] = _per_page(lambda i: list(map(access.__getitem__, runs[i])), args.repeat, args.run)
    cached = set(pages)

    def remove_and_add(i: int) -> None:
        cached.difference_update(run_sets[i])
        cached.update(run_sets[i])

    out["set_remove_and_add_ns"] = _per_page(remove_and_add, args.repeat, args.run)

    ids = {page: i for i, page in enumerate(pages)}
    id_runs = [np.fromiter(map(ids.__getitem__, r), dtype=np.int64, count=args.run) for r in runs]
    out["resolve_ids_ns"] = _per_page(
        lambda i: np.fromiter(map(ids.__getitem__, runs[i]), dtype=np.int64, count=args.run), args.repeat, args.run
    )
    last = np.zeros(args.resident)
    state = np.zeros(args.resident, dtype=np.int8)
    depth = np.array([rng.randrange(4096) for _ in range(args.resident)], dtype=np.int32)
    hashes = np.array(pages, dtype=np.uint64)

    def arrays(i: int) -> None:
        r = id_runs[i]
        last[r] = float(i)
        state[r] = 1
        state[r] = 0

    out["array_assign_ns"] = _per_page(arrays, args.repeat, args.run)
    out["array_order_ns"] = _per_page(lambda i: np.lexsort((hashes[id_runs[i]], -depth[id_runs[i]])), args.repeat, args.run)

    pool = TierPool(Tier.HOST, args.resident, BranchCountEviction(), {})
    parent: int | None = None
    chain: dict[int, int | None] = {}
    for page in pages:
        chain[page] = parent
        parent = page
    pool.insert_all(chain, 0.0)
    now = [1.0]

    def pin_release(i: int) -> None:
        now[0] += 1.0
        pool.pin_all("r", run_sets[i], now[0])
        now[0] += 1.0
        pool.unpin_all("r", now[0])

    out["tierpool_pin_and_release_ns"] = _per_page(pin_release, args.repeat, args.run)

    page_ids = PageIds({})
    id_tier = IdTier("host", args.resident, BranchCountEviction(), page_ids)
    id_tier.insert(chain, 0.0)
    kept = [page_ids.ids(r) for r in runs]

    def id_pin_release(i: int, resolve: bool) -> None:
        now[0] += 1.0
        ids_of_run = page_ids.ids(runs[i]) if resolve else kept[i]
        id_tier.pin("r", ids_of_run, now[0])
        now[0] += 1.0
        id_tier.unpin_all("r", now[0])

    resident = pool.resident_set()

    def walk_sets(i: int) -> None:  # the admission walk as the engine does it today
        k = 0
        for page in runs[i]:
            if page not in resident:
                break
            k += 1

    def walk_ids(i: int) -> None:
        held_prefix(id_tier.holds(page_ids.lookup(runs[i])))

    out["walk_sets_ns"] = _per_page(walk_sets, args.repeat, args.run)
    out["walk_ids_lookup_ns"] = _per_page(walk_ids, args.repeat, args.run)
    out["walk_ids_kept_ns"] = _per_page(lambda i: held_prefix(id_tier.holds(kept[i])), args.repeat, args.run)
    out["idtier_pin_and_release_resolved_ns"] = _per_page(lambda i: id_pin_release(i, True), args.repeat, args.run)
    out["idtier_pin_and_release_kept_ids_ns"] = _per_page(lambda i: id_pin_release(i, False), args.repeat, args.run)
    out.update(_eviction(pages, args.run, rng))
    out.update(_single_stores(pages[: args.run * 5]))
    print(json.dumps(out, indent=2))


def _single_stores(pages: list[int]) -> dict[str, float]:
    """A decode's stores: one page at a time (a chain) into L1, written through to L2, by `KvPool` over each kind
    of tables; nanoseconds per page."""
    out: dict[str, float] = {}
    for tables in (PageTables.SETS, PageTables.IDS):
        pool = KvPool(NodeId("n"), len(pages), 2 * len(pages), BranchCountEviction(), tables=tables)
        started = time.perf_counter()
        for i, page in enumerate(pages):
            pool.store(Tier.GPU, PageHash(page), PageHash(pages[i - 1]) if i else None, float(i), owner="r",
                       from_reservation=False)  # fmt: skip
        out[f"kvpool_single_store_{tables.value}_ns"] = 1e9 * (time.perf_counter() - started) / len(pages)
    return out


if __name__ == "__main__":
    main()
