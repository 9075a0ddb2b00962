"""Branch counts per run against page-exact counts on `bench router`'s load, in one process: two router cores
built from the same seed (one `BranchTable`, one `BranchTable(page_exact=True)`), their timed decisions
alternated (ABAB..., the first of each pair swapped every decision) so that a shared machine's speed swings hit
both alike. Prints thread CPU time per decision (mean, p50, p99) and decisions per CPU second of each.
Usage: python -P scripts/bench_router_counts.py [prefill nodes (96)] [decisions (2000)]
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time

from evolving_infra.cli.bench_router import _request, build_core


def main(nodes: int, decisions: int) -> None:
    cores = []
    for exact in (False, True):
        rng = random.Random(0)
        core, contexts = build_core(nodes, 32, 2000, rng, page_exact_counts=exact)
        requests = [_request(core, f"t{i}", *rng.choice(contexts), rng) for i in range(decisions)]
        cores.append((core, requests))
    gc.collect()
    cpu: tuple[list[float], list[float]] = ([], [])
    now = 1.0
    for i in range(decisions):
        for k in (0, 1) if i % 2 else (1, 0):
            core, requests = cores[k]
            started = time.thread_time()
            core.route(requests[i], now)
            cpu[k].append(time.thread_time() - started)
            core.forget(requests[i], now)
        now += 0.001
    print(f"{nodes} prefill nodes, {decisions} decisions each, alternated; thread CPU time per decision:")
    for k, name in ((1, "page-exact counts"), (0, "counts per run")):
        v = sorted(cpu[k])
        print(f"  {name:18s} mean {1e3 * statistics.fmean(v):.3f} ms, p50 {1e3 * v[len(v) // 2]:.3f} ms, "
              f"p99 {1e3 * v[min(len(v) - 1, int(0.99 * len(v)))]:.3f} ms, {len(v) / sum(v):,.0f} decisions per CPU s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 96, int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
