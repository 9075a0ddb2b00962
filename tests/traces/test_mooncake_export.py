"""Mooncake export: rows keep lengths, prefix sharing and branches; a round trip through the importer keeps
every request's shared prompt run (property tests over random traces)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.loader import load_trace, trace_from_records
from evolving_infra.traces.mooncake import MooncakeRow, convert_mooncake, read_mooncake
from evolving_infra.traces.mooncake_export import arrival_estimates, export_mooncake, export_rows
from evolving_infra.traces.records import Trace
from evolving_infra.traces.testing import TraceShape, random_trace, traces

# Prompts of a few 512-token blocks, so sharing at Mooncake's block size is exercised.
SHAPE = TraceShape(max_prefixes=2, max_agents=3, max_steps=8, max_tokens=1400)


def seen_runs(pages_per_row: list[list[int]], full_per_row: list[int]) -> list[int]:
    """For each row, the leading run of its full pages that appeared as full pages of earlier rows."""
    seen: set[int] = set()
    runs = []
    for pages, full in zip(pages_per_row, full_per_row, strict=True):
        run = 0
        while run < full and pages[run] in seen:
            run += 1
        runs.append(run)
        seen.update(pages[:full])
    return runs


def model_runs(trace: Trace, order: list[str], page: int) -> list[int]:
    model = ContentModel(trace, page)
    pages = [[int(h) for h in model.prompt_pages(rid)] for rid in order]
    return seen_runs(pages, [len(p) for p in pages])


def to_rows(rows: list[dict[str, Any]]) -> list[MooncakeRow]:
    return [
        MooncakeRow(i + 1, r["timestamp"], r["input_length"], r["output_length"], tuple(r["hash_ids"]))
        for i, r in enumerate(rows)
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(SHAPE))
def test_round_trip_keeps_lengths_and_sharing(trace: Trace) -> None:
    rows, report = export_rows(trace, 512)
    assert report.rows == len(trace.requests) == len(rows)
    order = [r["request_id"] for r in rows]
    by_id = {r.id: r for r in trace.requests}
    for row in rows:
        req = by_id[row["request_id"]]
        assert row["input_length"] == req.prompt_tokens
        assert row["output_length"] == req.output_tokens
        assert len(row["hash_ids"]) == -(-req.prompt_tokens // 512)
    records, _ = convert_mooncake(to_rows(rows), name="rt", source="test")
    back = trace_from_records(records)
    assert [r.prompt_tokens for r in back.requests] == [r["input_length"] for r in rows]
    assert [r.output_tokens for r in back.requests] == [r["output_length"] for r in rows]
    # Sharing: every request shares the same leading run of 512-token prompt pages with earlier requests.
    assert model_runs(back, [r.id for r in back.requests], 512) == model_runs(trace, order, 512)
    # ... which is exactly what the hash ids say.
    full = [r["input_length"] // 512 for r in rows]
    assert seen_runs([r["hash_ids"] for r in rows], full) == model_runs(trace, order, 512)


@settings(max_examples=60, deadline=None)
@given(traces(SHAPE))
def test_sessions_are_branches_in_order(trace: Trace) -> None:
    rows, report = export_rows(trace, 64)
    sessions: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sessions[row["session_id"]].append(row)
    assert report.sessions == len(sessions) == len(trace.branches)
    for branch, members in sessions.items():
        assert [r["request_id"] for r in members] == list(trace.branches[branch].requests)
        assert "delay" not in members[0]
        assert all(r["delay"] >= 0 for r in members[1:])
    stamps = [r["timestamp"] for r in rows]
    assert stamps == sorted(stamps)


@settings(max_examples=40, deadline=None)
@given(traces(SHAPE))
def test_hash_ids_name_whole_prefixes(trace: Trace) -> None:
    """Equal ids at a position mean equal ids before it (so the importer's binary search is sound), and ids
    are numbered in order of first appearance."""
    rows, _ = export_rows(trace, 64)
    prefix_of: dict[int, tuple[int, ...]] = {}
    next_id = 0
    for row in rows:
        ids = row["hash_ids"]
        for j, h in enumerate(ids):
            assert prefix_of.setdefault(h, tuple(ids[:j])) == tuple(ids[:j])
            if h >= next_id:
                assert h == next_id
                next_id += 1


def test_arrivals_follow_dependencies() -> None:
    trace = random_trace(3, SHAPE)
    arrival = arrival_estimates(trace, service_s=2.0)
    index = {r.id: r.index for r in trace.requests}
    for r in trace.requests:
        for a in r.after:
            assert arrival[r.index] >= arrival[index[a]] + 2.0 + r.delay_s - 1e-9
        if not r.after:
            assert arrival[r.index] == pytest.approx(trace.agents[r.agent].start_s + r.delay_s)
    with pytest.raises(ValueError, match="service_s"):
        arrival_estimates(trace, service_s=-1)


def test_append_delay_and_partial_block() -> None:
    records = [
        {"kind": "agent", "agent": "a", "workload": "cc", "start_s": 1.5},
        {"kind": "request", "id": "r0", "agent": "a", "branch": "a.m", "after": [], "delay_s": 0,
         "input": {"new": 600}, "output_tokens": 40},
        {"kind": "request", "id": "r1", "agent": "a", "branch": "a.m", "after": ["r0"], "delay_s": 3.25,
         "input": {"base": "r0", "keep": 640, "new": 500}, "output_tokens": 9},
    ]  # fmt: skip
    rows, report = export_rows(trace_from_records(records), 512)
    assert [r["timestamp"] for r in rows] == [1500, 4750]
    assert rows[1]["delay"] == 3250
    assert rows[0]["hash_ids"] == [0, 1]  # one full block, then r0's own partial block
    assert rows[1]["hash_ids"][:1] == [0] and len(rows[1]["hash_ids"]) == 3
    assert 1 not in rows[1]["hash_ids"]  # r1's second block holds r0's output: not r0's partial block
    assert report.distinct_blocks == 4
    with pytest.raises(ValueError, match="block_tokens"):
        export_rows(trace_from_records(records), 0)


def test_cli_export_then_import(tmp_path: Path) -> None:
    trace_path = tmp_path / "t.jsonl"
    from evolving_infra.traces.writer import trace_to_records, write_records

    write_records(trace_to_records(random_trace(7, SHAPE)), trace_path)
    out = tmp_path / "t.mooncake.jsonl"
    cmd = [sys.executable, "-m", "evolving_infra", "trace", "export", "mooncake", str(trace_path), str(out), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert report["rows"] == len(read_mooncake(out)) == len(load_trace(trace_path).requests)
    assert export_mooncake(trace_path, tmp_path / "again.jsonl").to_dict() == report
    bad = subprocess.run(
        [*cmd[:-1], "--block-tokens", "100"], capture_output=True, text=True, check=False
    )  # argparse refuses sizes other than 512 and 64
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    imported = tmp_path / "back.jsonl"
    back = subprocess.run(
        [sys.executable, "-m", "evolving_infra", "trace", "import", "mooncake", str(out), str(imported), "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(back.stdout)["rows"] == report["rows"]
