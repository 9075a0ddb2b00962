"""The comparison logic of `evaluate peers`, without any peer installed: one figure definition for both sides,
relative differences, the 10 % flag, request matching and the parsing of Dynamo's per-request output."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.peers.dynamo_replay import parse_dynamo_output
from evolving_infra.peers.judge import SideRun, matched, parse_split, request_keys
from evolving_infra.peers.metrics import (
    Figure,
    PeerMetricsError,
    PeerRequest,
    compare,
    relative_difference,
    render_markdown,
    summarize,
)
from evolving_infra.traces.testing import random_trace


def req(i: int, arrival: float, ttft: float, e2e: float, prompt: int = 100, reused: int = 50, out: int = 10) -> PeerRequest:
    return PeerRequest(f"r{i}", arrival, ttft, e2e, prompt, reused, out)


def test_summarize_by_hand() -> None:
    rs = [req(0, 0.0, 1.0, 3.0), req(1, 1.0, 2.0, 4.0, prompt=300, reused=0), req(2, 2.0, 3.0, 8.0)]
    m = summarize(rs)
    assert m.requests == 3
    assert m.ttft_mean_s == pytest.approx(2.0)
    assert m.ttft_p50_s == pytest.approx(2.0)
    assert m.e2e_mean_s == pytest.approx(5.0)
    assert m.makespan_s == pytest.approx(10.0)  # first arrival 0, last completion 2 + 8
    assert m.throughput_rps == pytest.approx(0.3)
    assert m.output_tok_s == pytest.approx(3.0)
    assert m.prefix_reuse == pytest.approx(100 / 500)


def test_bad_records_are_refused() -> None:
    with pytest.raises(PeerMetricsError, match="no completed requests"):
        summarize([])
    with pytest.raises(PeerMetricsError, match="ttft"):
        req(0, 0.0, 5.0, 1.0)
    with pytest.raises(PeerMetricsError, match="reused tokens"):
        req(0, 0.0, 1.0, 2.0, prompt=10, reused=11)
    with pytest.raises(PeerMetricsError, match="finite"):
        req(0, math.nan, 1.0, 2.0)


def test_compare_flags_over_tolerance() -> None:
    base = summarize([req(0, 0.0, 1.0, 2.0), req(1, 0.0, 1.0, 2.0)])
    close = summarize([req(0, 0.0, 1.05, 2.0), req(1, 0.0, 1.05, 2.0)])
    far = summarize([req(0, 0.0, 1.5, 2.0), req(1, 0.0, 1.5, 2.0)])
    rows = {r.figure: r for r in compare({"ref": base, "close": close, "far": far}, "ref")}
    ttft = rows[Figure.TTFT_MEAN]
    assert ttft.differences["close"] == pytest.approx(0.05)
    assert ttft.differences["far"] == pytest.approx(0.5)
    assert ttft.flagged == ("far",)
    assert rows[Figure.E2E_MEAN].flagged == ()
    assert "ref" not in ttft.differences
    table = render_markdown(list(rows.values()), "ref")
    assert "(**+50%**)" in table and "(+5%)" in table
    with pytest.raises(KeyError, match="reference"):
        compare({"a": base}, "b")
    with pytest.raises(ValueError, match="tolerance"):
        compare({"a": base}, "a", tolerance=-0.1)


@given(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.one_of(st.just(0.0), st.floats(1e-3, 1e6), st.floats(-1e6, -1e-3)),
)
def test_relative_difference(value: float, reference: float) -> None:
    d = relative_difference(value, reference)
    if reference == 0:
        assert d == (0.0 if value == 0 else None)
    else:
        assert d is not None
        assert reference + d * abs(reference) == pytest.approx(value, rel=1e-9, abs=1e-6)


@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 100), st.floats(0, 100)), min_size=1, max_size=30))
def test_summary_invariants(raw: list[tuple[float, float, float]]) -> None:
    rs = [req(i, a, min(t, e), max(t, e)) for i, (a, t, e) in enumerate(raw)]
    m = summarize(rs)
    assert m.ttft_p50_s <= m.ttft_p95_s + 1e-9
    assert m.ttft_mean_s <= m.e2e_mean_s + 1e-9
    assert 0.0 <= m.prefix_reuse <= 1.0
    assert m.makespan_s >= max(r.e2e_s for r in rs) - 1e-9
    # the same records compare equal to themselves: nothing flagged
    assert all(not row.flagged for row in compare({"a": m, "b": summarize(rs)}, "a"))


def test_request_keys_are_branch_and_turn() -> None:
    trace = random_trace(5)
    keys = request_keys(trace)
    assert len(set(keys.values())) == len(trace.requests)
    for branch in trace.branches.values():
        for i, rid in enumerate(branch.requests):
            assert keys[rid] == f"{branch.id}#{i}"


def test_matched_keeps_common_requests() -> None:
    a = SideRun("a", [req(0, 0, 1, 2), req(1, 0, 1, 2)], 1.0)
    b = SideRun("b", [req(1, 0, 1, 2), req(2, 0, 1, 2)], 2.0)
    (ma, mb), dropped = matched([a, b])
    assert [r.request_id for r in ma.requests] == ["r1"] == [r.request_id for r in mb.requests]
    assert dropped == 1
    assert mb.requests_per_wall_s == pytest.approx(0.5)


def test_parse_dynamo_output() -> None:
    data = {
        "summary": {"mean_ttft_ms": 1.0},
        "wall_s": 0.5,
        "dynamo_version": "1.6.1",
        "requests": [
            {"session_id": "a.b0", "turn_index": 1, "arrival_time_ms": 2000.0, "ttft_ms": 150.0,
             "e2e_latency_ms": 900.0, "input_length": 1000, "output_length": 20, "reused_input_tokens": 640,
             "terminal_status": "completed"},
            {"session_id": "a.b0", "turn_index": 2, "arrival_time_ms": 3000.0, "ttft_ms": None,
             "e2e_latency_ms": None, "input_length": 10, "output_length": 0, "reused_input_tokens": 0,
             "terminal_status": "failed"},
        ],
    }  # fmt: skip
    run = parse_dynamo_output(data)
    assert run.failed == 1 and run.wall_s == 0.5 and run.dynamo_version == "1.6.1"
    (r,) = run.requests
    assert r == PeerRequest("a.b0#1", 2.0, 0.15, 0.9, 1000, 640, 20)


def test_parse_split() -> None:
    assert parse_split("4P5D") == (4, 5) and parse_split(" 2p7d ") == (2, 7)
    for bad in ("4P", "P5D", "0P9D", "4X5D", "4P5"):
        with pytest.raises(ValueError, match="split"):
            parse_split(bad)


def test_cli_without_the_side_environment(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from evolving_infra.cli.main import main

    monkeypatch.setenv("EVOLVING_INFRA_DYNAMO_PYTHON", "/nonexistent/python")
    code = main(["evaluate", "peers", "--workload", "putnam", "--agents", "1", "--split", "1P1D"])
    assert code == 2
    assert "scripts/peers/setup-dynamo.sh" in capsys.readouterr().err
    assert main(["evaluate", "peers", "--workload", "putnam", "--trace", "x.jsonl"]) == 2
    assert main(["evaluate", "peers", "--workload", "putnam", "--sides", "nope"]) == 2


def test_local_report_peers_section(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from evolving_infra.local.report import collect_peer_reports, peers_markdown
    from evolving_infra.peers.metrics import compare as compare_sides

    a = summarize([req(0, 0.0, 1.0, 2.0)])
    b = summarize([req(0, 0.0, 2.0, 2.0)])
    judge = {"trace": {"requests": 1}, "split": "4P5D", "reference": "dynamo-replay",
             "comparison": [r.to_dict() for r in compare_sides({"dynamo-replay": a, "dynamo": b}, "dynamo-replay")]}
    (tmp_path / "j.json").write_text(json.dumps(judge))
    (tmp_path / "g.json").write_text(json.dumps({"requests": 10, "agreement_rate": 0.9, "causes": {"tie": 1}}))
    (tmp_path / "junk.json").write_text("{not json")
    reports = collect_peer_reports(tmp_path)
    assert sorted(r["file"] for r in reports) == ["g.json", "j.json"]
    text = "\n".join(peers_markdown(reports))
    assert "## Ours vs the real peers" in text and "| ttft_mean_s | 1.000 | 2.000 (+100%) |" in text
    assert "| g.json | 10 | 90.0% | tie 1 |" in text
    assert peers_markdown([]) == [] and collect_peer_reports(tmp_path / "none") == []


FAKE_DRIVER = r'''
import json, sys
args = [a for a in sys.argv[1:] if a != "-I"]
job = json.load(open(args[1]))
rows = [json.loads(line) for line in open(job["trace"]) if line.strip()]
turns = {}
requests = []
for row in rows:
    turn = turns.get(row["session_id"], 0)
    turns[row["session_id"]] = turn + 1
    requests.append({"uuid": row["request_id"], "session_id": row["session_id"], "turn_index": turn,
                     "arrival_time_ms": float(row["timestamp"]), "ttft_ms": 100.0, "e2e_latency_ms": 500.0,
                     "input_length": row["input_length"], "output_length": row["output_length"],
                     "reused_input_tokens": 0, "terminal_status": "completed"})
json.dump({"summary": {"num_requests": len(rows)}, "requests": requests, "wall_s": 0.01,
           "dynamo_version": "fake"}, open(args[2], "w"))
'''


def test_judge_end_to_end_with_a_stand_in_for_dynamo(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The orchestration (export, job, subprocess, matching by branch and turn, comparison) with a stand-in
    interpreter that answers like the driver: every request 0.1 s TTFT and 0.5 s E2E, nothing reused."""
    import stat
    import sys

    from evolving_infra.peers.judge import REFERENCE, OurSide, judge_dynamo
    from evolving_infra.traces.loader import trace_from_records
    from evolving_infra.workloads import generate

    script = tmp_path / "fake_driver.py"
    script.write_text(FAKE_DRIVER)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    trace = trace_from_records(generate("putnam", 1, 0))
    report = judge_dynamo(trace, profile="glm-5.2-4xgb300-tp4", split="1P1D", sides=[OurSide.DYNAMO_KV],
                          python=exe, timeout_s=120)  # fmt: skip
    assert report["matched_requests"] == len(trace.requests) and report["unmatched_requests"] == 0
    ref = report["metrics"][REFERENCE]
    assert ref["ttft_mean_s"] == pytest.approx(0.1) and ref["e2e_mean_s"] == pytest.approx(0.5)
    assert ref["prefix_reuse"] == 0.0 and report["metrics"]["dynamo-kv"]["prefix_reuse"] > 0.5
    reuse = next(r for r in report["comparison"] if r["figure"] == "prefix_reuse")
    assert reuse["differences"]["dynamo-kv"] is None and reuse["flagged"] == ["dynamo-kv"]  # reference is 0
    assert report["details"][REFERENCE]["version"] == "fake"
