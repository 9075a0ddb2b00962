"""The fleet's summary figures (`fleet.sim_report`) on hand-made partition results."""

from __future__ import annotations

from typing import Any

import pytest

from evolving_infra.fleet.sim import FleetOptions, FleetResult, PartitionResult
from evolving_infra.fleet.sim_report import COARSE, fleet_summary, planner_holds, render_markdown, shifting


def result(key: str, uncached: list[int], output: list[int], width: float = 300.0) -> PartitionResult:
    series: list[dict[str, Any]] = [
        {"t0": i * width, "t1": (i + 1) * width, "issued": 10, "finished": 10, "prefills": 10,
         "uncached_tokens": u, "output_tokens": o, "queue_s_sum": 1.0, "issued_by_workload": {"cc": 10},
         "prefill_nodes": 2, "decode_nodes": 2, "collocated_nodes": 0}
        for i, (u, o) in enumerate(zip(uncached, output, strict=True))
    ]
    metrics = {"window": {"start": 0.0, "end": width * len(uncached)}, "overall": {"throughput_rps": 1.0}}
    return PartitionResult(key=key, nodes=4, split="2P2D", planner="ours", concurrency=8, trace_agents=20, users=4,
                           metrics=metrics, records_sha256="", requests=100, events=0, sim_end_s=width * len(uncached),
                           wall_s=1.0, peak_rss_mb=1.0, series=series, splits=[(0.0, 2, 2, 0)])


def test_the_aggregate_pd_ratio_sums_partitions_tokens_and_is_also_given_over_wider_buckets() -> None:
    # Two partitions whose ratios alternate in opposite phase: the aggregate is flat per bucket pair.
    a = result("a/p0", [300, 100] * 4, [100] * 8)
    b = result("a/p1", [100, 300] * 4, [100] * 8)
    summary = fleet_summary(FleetResult(FleetOptions(), [a, b], 0.0))
    assert summary["pd_ratio_series"] == [2.0] * 8 and summary["pd_ratio_variation"] == 0.0
    # One partition alone: 3, 1, 3, 1, ... per bucket (variation (3 - 1) / 2 = 100 %), flat over groups of 4.
    alone = fleet_summary(FleetResult(FleetOptions(), [a], 0.0))
    assert alone["pd_ratio_variation"] == pytest.approx(1.0)
    assert alone["pd_ratio_variation_coarse"] == {"bucket_s": 300.0 * COARSE, "variation": 0.0}
    # A trend shows at both widths: 1, 1, 1, 1, 3, 3, 3, 3 -> coarse 1 and 3, (3 - 1) / 2.
    trend = fleet_summary(FleetResult(FleetOptions(), [result("a/p2", [100] * 4 + [300] * 4, [100] * 8)], 0.0))
    assert trend["pd_ratio_variation_coarse"]["variation"] == pytest.approx(1.0)
    # Fewer buckets than two whole groups: no coarse figure.
    short = fleet_summary(FleetResult(FleetOptions(), [result("a/p3", [100] * 6, [100] * 6)], 0.0))
    assert short["pd_ratio_variation_coarse"]["variation"] is None
    assert "(0.0 %)" in render_markdown(FleetResult(FleetOptions(), [a], 0.0))


def test_the_figure_marks_partitions_whose_demand_shifts_over_wide_buckets_not_noisy_ones() -> None:
    steady = [result(f"a/p{i}", [200] * 8, [100] * 8) for i in range(5)]
    noisy = result("a/p5", [200, 200, 200, 400, 200, 200, 200, 200], [100] * 8)  # one heavy bucket: x2 for 300 s
    shift = result("a/p6", [100] * 4 + [500] * 4, [100] * 8)  # the PD ratio moves from 1 to 5 and stays
    fleet = FleetResult(FleetOptions(), [*steady, noisy, shift], 0.0)
    assert shifting(fleet) == ["p6"]
    # Over the results' own buckets the noisy partition would be marked as well.
    per_bucket = fleet_summary(FleetResult(FleetOptions(), [noisy], 0.0))["pd_ratio_variation"]
    assert per_bucket > 2 * fleet_summary(fleet)["pd_ratio_variation"]
    # Too short a window for wide buckets: the results' own buckets decide.
    short = [result(f"a/p{i}", [200] * 4, [100] * 4) for i in range(5)]
    short.append(result("a/p5", [100, 100, 500, 500], [100] * 4))
    assert shifting(FleetResult(FleetOptions(), short, 0.0)) == ["p5"]


def test_planner_holds_counts_the_holds_and_every_refused_candidate() -> None:
    short, low = {"verdict": "prefill_kv_short"}, {"verdict": "below_threshold"}
    metrics = {"planner_hold_decisions": [{"candidates": [short, short, low]}, {"candidates": [low]}],
               "planner_switch_decisions": [{"candidates": [short, {"verdict": "qualified"}]}, {"outcome": "switch"}]}
    assert planner_holds(metrics) == {"planner_holds": 2, "kv_refused_moves": 3}
    assert planner_holds({}) == {"planner_holds": 0, "kv_refused_moves": 0}
