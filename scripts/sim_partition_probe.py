"""Probe of a partition-scale simulation: where its memory and time go while it runs (issue #11).

    python scripts/sim_partition_probe.py [--nodes 96] [--agents 3840] [--every 100000] [--limit-mib 5000]

Runs `bench sim`'s configuration (CC, closed loop, the default split for the node count, profile models) and,
every `--every` kernel events, prints one JSON line: simulated time, events, process CPU seconds, resident
memory, requests finished, resident pages per tier over all nodes, eviction-order entries per tier (stale ones
included), and the sizes of the engines' page tables in MiB, summed over the nodes (numpy arrays by `nbytes`,
dicts by `sys.getsizeof`: the hash tables themselves, not the page ints they share). It stops once resident memory passes `--limit-mib` (or at `--duration`), then
prints the KV directory's pages, runs and deep size, and the most numerous live object types. The figures are
docs/benchmarks.md's "partition probe".

Boundary: a development tool; reads the simulator's private tables, never imported by the package.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import Counter
from typing import Any

from evolving_infra.cli.bench_directory import deep_size
from evolving_infra.cli.bench_sim import bench_config, current_rss_mib
from evolving_infra.node_agent.engine.labelblocks import LabelBlocks
from evolving_infra.sim.kernel import Progress
from evolving_infra.sim.run import simulate, workload_stream

class _Stop(Exception):
    pass


def _probe(state: Any, progress: Progress, cpu0: float) -> dict[str, Any]:
    """One probe line. With the id tables (the default) a node's tables are: per tier the id arrays (state, last
    access, pin counts), the pins per owner and the eviction order's entries (id and generation arrays, stale ones
    included); per node the id table (`PageIds`: hash -> id map, a dict or with dense labels the arrays of
    `labelblocks.LabelBlocks` with their block dict, and per-id arrays: hash, depth, generation,
    holders, counted flag, parent) and the branch counts (by id, and a dict for counted pages no tier holds). With the set tables (`TierPool`) their dicts
    and sets."""
    tables: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    pages: Counter[str] = Counter()
    for node in state.nodes.values():
        engine = node.engine
        if engine is None:
            continue
        pool = engine.pool
        ids = pool.page_ids
        for name in ("l1", "l2"):
            tier = getattr(pool, name)
            pages[name] += len(tier.resident_set())
            if ids is None:  # the set tables
                for table in ("_parent", "_access", "_cached", "_pinned"):
                    tables[table] += sys.getsizeof(getattr(tier, table))
                entries[name] += tier._order._size
                continue
            t = tier.t
            tables["tier arrays"] += t.state.nbytes + t.access.nbytes + t.pins.nbytes
            tables["pins by owner"] += sum(sum(c.nbytes for c in chunks) for chunks in t._owner.values())
            order_bytes = 0
            n = 0
            for bucket in t.order._buckets.values():
                for chunk_ids, gens in bucket.chunks:
                    order_bytes += chunk_ids.nbytes + gens.nbytes
                    n += len(chunk_ids)
            tables["order"] += order_bytes
            entries[name] += n
        if ids is not None:
            blocks = ids._id  # (dense labels: blocks of labels instead of a dict)
            if isinstance(blocks, LabelBlocks):
                tables["id dict"] += blocks.memory_bytes() + sys.getsizeof(blocks._row)
            else:
                tables["id dict"] += sys.getsizeof(blocks)
            tables["id arrays"] += sum(
                a.nbytes for a in (ids.hashes, ids.depth, ids.gen, ids.holders, ids.counted, ids.parent, ids.rooted)
            )
            tables["counts"] += ids.count.nbytes + sys.getsizeof(ids.counts)  # by id, and by hash for unheld pages
        else:
            tables["_depth"] += sys.getsizeof(pool._depth)
            tables["counts"] += sys.getsizeof(pool._counts)
    return {
        "simulated_s": round(progress.now, 1), "events": progress.processed,
        "cpu_s": round(time.process_time() - cpu0, 1), "rss_mib": round(current_rss_mib()),
        "requests_finished": len(state.records), "pages": dict(pages), "order_entries": dict(entries),
        "tables_mib": {k: round(v / 2**20) for k, v in tables.items()},
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=96)
    ap.add_argument("--agents", type=int, default=3840)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", type=int, default=100_000, help="kernel events between two probes")
    ap.add_argument("--limit-mib", type=float, default=5000.0, help="stop once resident memory passes this")
    a = ap.parse_args()
    args = argparse.Namespace(system="evolving", agents=a.agents, nodes=a.nodes, split=None, seed=a.seed,
                              warmup=0.0, duration=a.duration, workload="cc")  # fmt: skip
    cfg = bench_config(args)
    box: dict[str, Any] = {}
    cpu0 = time.process_time()

    def report(progress: Progress) -> None:
        line = _probe(box["state"], progress, cpu0)
        print(json.dumps(line), flush=True)
        if line["rss_mib"] > a.limit_mib:
            raise _Stop

    trace = workload_stream("cc", 2 * a.agents, a.seed)
    print(json.dumps({"workload_cpu_s": round(time.process_time() - cpu0, 1), "rss_mib": round(current_rss_mib())}))
    try:
        simulate(cfg, trace, prepare=lambda s: box.__setitem__("state", s), progress=report, progress_every=a.every)
    except _Stop:
        pass
    gc.collect()
    directory = box["state"].core.directory
    print(json.dumps({"directory_pages": directory.page_count, "directory_runs": directory.run_count,
                      "directory_mib": round(deep_size(directory, Counter()) / 2**20)}))  # fmt: skip
    print(json.dumps({"live_objects": Counter(type(o).__name__ for o in gc.get_objects()).most_common(12)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
