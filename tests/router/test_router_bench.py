"""`evolving-infra bench router`'s routing part runs end to end on a small load (figures printed, never asserted)."""

from __future__ import annotations

import argparse

from evolving_infra.cli.bench_router import bench_decisions


def test_small_routing_bench_reports_wall_and_cpu_figures() -> None:
    args = argparse.Namespace(prefill_nodes=4, prefixes=2, branches=20, decisions=30, seed=0)
    figures = bench_decisions(args)
    assert figures["decisions"] == 30 and figures["prefill_nodes"] == 4
    assert figures["directory_pages"] > 0
    for key in ("decisions_per_s", "latency_p50_ms", "latency_p99_ms", "decisions_per_cpu_s", "latency_cpu_p99_ms"):
        assert figures[key] > 0
    assert figures["latency_p50_ms"] <= figures["latency_p99_ms"]
