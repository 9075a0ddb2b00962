"""`evolving-infra bench router`'s routing part runs end to end on a small load (figures printed, never asserted)."""

from __future__ import annotations

import argparse

from evolving_infra.cli.bench_router import bench_decisions


def test_small_routing_bench_reports_wall_and_cpu_figures() -> None:
    args = argparse.Namespace(prefill_nodes=4, prefixes=2, branches=20, decisions=30, seed=0, page_exact_counts=False,
                              queue_max=8, reports=0)  # fmt: skip
    figures = bench_decisions(args)
    assert figures["decisions"] == 30 and figures["prefill_nodes"] == 4
    assert figures["directory_pages"] > 0
    for key in ("decisions_per_s", "latency_p50_ms", "latency_p99_ms", "decisions_per_cpu_s", "latency_cpu_p99_ms"):
        assert figures[key] > 0
    assert figures["latency_p50_ms"] <= figures["latency_p99_ms"]


def test_reports_between_decisions_cost_no_queue_replay_of_nodes_not_priced_exactly() -> None:
    """With nodes reporting before every decision (long queues), a report makes the node's backlog row computed
    in closed form; its queue is replayed only when the node is priced exactly (near the best), so the replays
    per decision stay below the reports per decision."""
    args = argparse.Namespace(prefill_nodes=12, prefixes=2, branches=40, decisions=40, seed=0, page_exact_counts=False,
                              queue_max=30, reports=3)  # fmt: skip
    figures = bench_decisions(args)
    assert figures["reports_per_decision"] == 3 and figures["mean_queue"] > 5
    assert figures["queue_replays_per_decision"] < 3


def test_counts_per_run_route_and_push_as_the_page_exact_counts() -> None:
    """The bench's load through both forms of the branch table: the same choices and the same count pushes."""
    import random

    from evolving_infra.cli.bench_router import _request, build_core

    cores = [build_core(6, 3, 40, random.Random(5), page_exact_counts=exact) for exact in (False, True)]
    assert [c.branches.stats.page_exact for c, _ in cores] == [False, True]
    rngs = [random.Random(9), random.Random(9)]
    for i in range(60):
        outcomes = []
        for (core, contexts), rng in zip(cores, rngs, strict=True):
            req = _request(core, f"t{i}", *rng.choice(contexts), rng)
            routed = core.route(req, 1.0 + i)
            assert routed is not None
            outcomes.append((routed.node, [(p.node, dict(p.counts)) for p in routed.counts]))
            if i % 3:
                core.forget(req, 1.0 + i)
        assert outcomes[0] == outcomes[1]
        assert outcomes[0][1], "a placement pushes counts"
