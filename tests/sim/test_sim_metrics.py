"""Run metrics on hand-computed records: percentiles, warmup exclusion, hit rate and lost reuse, queue
balance, switches, split over time, idle fractions, Little's law, validation and export."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.types import Phase
from evolving_infra.sim.export import REQUEST_COLUMNS, write_metrics_json, write_requests_csv, write_requests_jsonl
from evolving_infra.sim.metrics import Summary, compute_run_metrics, queue_balance
from evolving_infra.sim.records import (
    NodeSpan,
    RecordError,
    RequestRecord,
    ScoreWindow,
    SplitRecord,
    SwitchRecord,
)


def rec(
    rid: str,
    issued: float,
    *,
    workload: str = "cc",
    queue: float = 0.0,
    prefill: float = 1.0,
    decode: float = 2.0,
    node: str = "p0",
    prompt: int = 100,
    cached: int = 0,
    fetched: int = 0,
    out: int = 11,
    since: float | None = None,
    pause: float = 0.0,
) -> RequestRecord:
    """A record issued at `issued`, queued on arrival, waiting `queue`, prefilling `prefill` s, decoding `decode` s."""
    start = issued + queue
    first = start + prefill
    return RequestRecord(
        request_id=rid,
        agent=rid.split(".")[0],
        workload=workload,
        branch=rid.split(".")[0] + ".main",
        issued=issued,
        prefill_node=node,
        decode_node="d0",
        queued=issued,
        prefill_start=start,
        first_token=first,
        finish=first + decode,
        prompt_tokens=prompt,
        cached_tokens=cached,
        fetched_tokens=fetched,
        output_tokens=out,
        since=since,
        pause_s=pause,
    )


def test_summary_uses_linear_interpolation() -> None:
    s = Summary.of([10.0, 1.0, 3.0, 2.0, 4.0])
    assert s.count == 5 and s.mean == 4.0 and s.p50 == 3.0
    assert s.p95 == pytest.approx(8.8)  # position 0.95 * 4 = 3.8: 4 + 0.8 * (10 - 4)
    assert Summary.of([]) == Summary(0, None, None, None)


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50))
def test_summary_matches_numpy(values: list[float]) -> None:
    s = Summary.of(values)
    assert s.p95 == pytest.approx(float(np.percentile(values, 95)))
    assert min(values) <= s.p50 <= max(values)


def test_warmup_exclusion_and_throughput_window() -> None:
    records = [
        rec("a.1", 50.0),  # warmup: not scored
        rec("a.2", 100.0, prefill=1.0),  # scored (TTFT 1)
        rec("a.3", 150.0, prefill=3.0),  # scored (TTFT 3)
        rec("a.4", 199.0, prefill=2.0, decode=60.0),  # scored, finishes after the window: not in throughput
        rec("a.5", 200.0),  # issued at the end: not scored
    ]
    m = compute_run_metrics(records, ScoreWindow(100.0, 200.0))
    assert m.overall.requests == 3 and m.overall.finished_in_window == 2
    assert m.overall.throughput_rps == pytest.approx(2 / 100)
    assert m.overall.ttft_s.mean == pytest.approx(2.0) and m.overall.ttft_s.p50 == 2.0
    default = compute_run_metrics(records)
    assert default.window_start == 0.0 and default.window_end == pytest.approx(261.0)
    assert default.overall.requests == 5


def test_latency_counts_from_since_for_admission_waits() -> None:
    m = compute_run_metrics([rec("a.1", 10.0, since=4.0, prefill=1.0, decode=2.0)], ScoreWindow(0.0, 100.0))
    assert m.overall.ttft_s.mean == pytest.approx(7.0) and m.overall.e2e_s.mean == pytest.approx(9.0)


def test_kv_hit_rate_and_lost_reuse_per_run_and_workload() -> None:
    records = [
        rec("a.1", 1.0, workload="cc", prompt=100, cached=50, fetched=20),
        rec("b.1", 2.0, workload="putnam", prompt=300, cached=240),
        rec("c.1", 0.5, workload="cc", prompt=1000, cached=0),  # warmup, ignored everywhere
    ]
    ideal = {"a.1": 90, "b.1": 270, "c.1": 900}
    m = compute_run_metrics(records, ScoreWindow(1.0, 50.0), ideal=ideal)
    o = m.overall
    assert (o.prompt_tokens, o.cached_tokens, o.fetched_tokens, o.uncached_tokens) == (400, 290, 20, 110)
    assert o.kv_hit_rate == pytest.approx(290 / 400)
    assert o.ideal_hit_rate == pytest.approx(360 / 400)
    assert o.lost_kv_reuse == pytest.approx(1 - (290 / 400) / (360 / 400))
    assert o.uncached_tokens_per_request == pytest.approx(55.0)
    cc = m.by_workload["cc"]
    assert cc.kv_hit_rate == pytest.approx(0.5) and cc.lost_kv_reuse == pytest.approx(1 - 0.5 / 0.9)
    assert m.by_workload["putnam"].lost_kv_reuse == pytest.approx(1 - 0.8 / 0.9)

    one_rate = compute_run_metrics(records, ScoreWindow(1.0, 50.0), ideal=0.8)
    assert one_rate.overall.lost_kv_reuse == pytest.approx(1 - 0.725 / 0.8)
    assert one_rate.by_workload["cc"].lost_kv_reuse is None  # one rate cannot be split by workload
    assert compute_run_metrics(records, ScoreWindow(1.0, 50.0)).overall.lost_kv_reuse is None
    with pytest.raises(RecordError, match="missing for 1 scored request"):
        compute_run_metrics(records, ScoreWindow(1.0, 50.0), ideal={"a.1": 90})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        compute_run_metrics(records, ideal=1.5)


def test_queue_balance_per_minute_then_averaged() -> None:
    records = [
        # minute 0: p1 waits 2 and 4 (mean 3), p2 waits 1 -> mean of nodes 2, ratio 1.5
        rec("a.1", 10.0, queue=2.0, node="p1"),
        rec("a.2", 20.0, queue=4.0, node="p1"),
        rec("a.3", 30.0, queue=1.0, node="p2"),
        # minute 1: nobody waits -> skipped
        rec("a.4", 70.0, node="p1"),
        rec("a.5", 80.0, node="p2"),
        # minute 2 (by prefill start 126): p1 6, p2 2, p3 1 -> mean 3, ratio 2
        rec("a.6", 120.0, queue=6.0, node="p1"),
        rec("a.7", 125.0, queue=2.0, node="p2"),
        rec("a.8", 130.0, queue=1.0, node="p3"),
    ]
    m = compute_run_metrics(records, ScoreWindow(0.0, 300.0))
    assert m.queue_balance_ratio == pytest.approx(1.75) and m.queue_balance_buckets == 2
    assert m.overall.prefill_queue_s.mean == pytest.approx(16.0 / 8)
    assert queue_balance([], 0.0) == (None, 0)


def test_tpot_skips_single_token_outputs() -> None:
    m = compute_run_metrics([rec("a.1", 0.0, out=11, decode=2.0), rec("a.2", 0.0, out=1, decode=0.0)], ScoreWindow(0, 10))
    assert m.overall.tpot_s.count == 1 and m.overall.tpot_s.mean == pytest.approx(0.2)


def test_switches_split_timeline_and_idle_fractions() -> None:
    switches = [
        SwitchRecord("n1", Phase.PREFILL, Phase.DECODE, decided=90.0, completed=95.0),  # before the window
        SwitchRecord("n1", Phase.DECODE, Phase.PREFILL, decided=120.0, completed=121.0),
        SwitchRecord("n2", Phase.PREFILL, Phase.DECODE, decided=150.0, completed=154.0),
    ]
    splits = [
        SplitRecord(0.0, 6, 3),
        SplitRecord(150.0, 4, 5),
        SplitRecord(160.0, 4, 5),  # no change
        SplitRecord(180.0, 3, 6),
        SplitRecord(250.0, 2, 7),  # after the window
    ]
    spans = [
        NodeSpan("n1", Phase.PREFILL, 0.0, 200.0, busy_s=100.0),  # half inside: 50 s busy of 100 s
        NodeSpan("n2", Phase.DECODE, 100.0, 150.0, busy_s=50.0),
        NodeSpan("n2", Phase.DECODE, 150.0, 200.0, busy_s=25.0),
        NodeSpan("n3", Phase.DECODE, 300.0, 400.0, busy_s=0.0),  # outside
    ]
    m = compute_run_metrics([], ScoreWindow(100.0, 200.0), switches=switches, splits=splits, spans=spans)
    assert m.switches == 2 and m.mean_switch_s == pytest.approx(2.5)
    assert m.split_timeline == ((100.0, "6P3D"), (150.0, "4P5D"), (180.0, "3P6D"))
    assert m.split_share == pytest.approx({"6P3D": 0.5, "4P5D": 0.3, "3P6D": 0.2})
    assert m.idle_fraction[Phase.PREFILL] == pytest.approx(0.5)
    assert m.idle_fraction[Phase.DECODE] == pytest.approx(0.25)
    assert m.overall.requests == 0 and m.overall.ttft_s.mean is None and m.overall.kv_hit_rate is None
    assert compute_run_metrics([], ScoreWindow(0, 1)).idle_fraction == {Phase.PREFILL: None, Phase.DECODE: None}


def test_littles_law_figure() -> None:
    records = [rec(f"a.{i}", float(i), prefill=1.0, decode=3.0, pause=6.0) for i in range(10)]
    m = compute_run_metrics(records, ScoreWindow(0.0, 20.0))
    assert m.overall.throughput_rps == pytest.approx(0.5)
    assert m.overall.mean_pause_s == pytest.approx(6.0)
    assert m.overall.little_n_branch == pytest.approx(0.5 * (4.0 + 6.0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"queued": 0.5}, "queued=0.5 precedes issued=1.0"),
        ({"first_token": 0.0}, "first_token=0.0 precedes prefill_start"),
        ({"since": 2.0}, "issued=1.0 precedes since=2.0"),
        ({"cached_tokens": 200}, r"cached_tokens=200 must lie in \[0, prompt_tokens=100\]"),
        ({"fetched_tokens": 60}, r"fetched_tokens=60 must lie in \[0, cached_tokens=50\]"),
        ({"output_tokens": 0}, "output_tokens must be >= 1"),
        ({"finish": float("inf")}, "finish must be a finite number"),
    ],
)
def test_request_record_refuses_inconsistent_values(kwargs: dict, message: str) -> None:
    base = dict(
        request_id="a.1", agent="a", workload="cc", branch="a.m", issued=1.0, prefill_node="p", decode_node="d",
        queued=1.0, prefill_start=2.0, first_token=3.0, finish=4.0, prompt_tokens=100, cached_tokens=50,
        fetched_tokens=0, output_tokens=5,
    )
    base.update(kwargs)
    with pytest.raises(RecordError, match=message):
        RequestRecord(**base)


def test_other_records_refuse_bad_values() -> None:
    with pytest.raises(RecordError, match="completed=1.0 precedes decided=2.0"):
        SwitchRecord("n", Phase.PREFILL, Phase.DECODE, 2.0, 1.0)
    with pytest.raises(RecordError, match="both prefill"):
        SwitchRecord("n", Phase.PREFILL, Phase.PREFILL, 1.0, 2.0)
    with pytest.raises(RecordError, match="busy_s=5.0 must lie"):
        NodeSpan("n", Phase.DECODE, 0.0, 1.0, 5.0)
    with pytest.raises(RecordError, match="must be after start"):
        ScoreWindow(5.0, 5.0)
    with pytest.raises(RecordError, match="-1P2D"):
        SplitRecord(0.0, -1, 2)


def test_exports_round_trip(tmp_path: Path) -> None:
    records = [rec("a.1", 1.0, cached=30, fetched=10, out=1), rec("b.1", 2.0, workload="osworld", since=1.5)]
    m = compute_run_metrics(
        records,
        ScoreWindow(0.0, 10.0),
        ideal={"a.1": 40, "b.1": 0},
        spans=[NodeSpan("n", Phase.PREFILL, 0.0, 10.0, 2.0)],
        extra={"planner": "ours"},
    )
    doc = m.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["planner"] == "ours" and doc["gpu_idle_fraction"] == {"prefill": pytest.approx(0.8), "decode": None}
    assert doc["by_workload"]["osworld"]["lost_kv_reuse"] is None  # h* = 0 for this group
    assert set(doc["by_workload"]) == {"cc", "osworld"}
    write_metrics_json(m, tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text()) == doc

    assert write_requests_csv(records, tmp_path / "r.csv") == 2
    with (tmp_path / "r.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == REQUEST_COLUMNS
    assert rows[0]["since"] == "1.0" and rows[0]["tpot_s"] == "" and rows[0]["uncached_tokens"] == "70"
    assert write_requests_jsonl(records, tmp_path / "r.jsonl") == 2
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert lines[1]["ttft_s"] == pytest.approx(records[1].ttft_s) and lines[0]["tpot_s"] is None
