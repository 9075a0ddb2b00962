"""Optional peer: NVIDIA Dynamo's own replay (ai-dynamo 1.6.1 in the side environment made by
scripts/peers/setup-dynamo.sh). Skips with the reason when that environment is missing; bounded in time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evolving_infra.core.itermodel import decode_iteration_time
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.peers.dynamo_replay import DynamoSetup, dynamo_ready, run_dynamo_replay
from evolving_infra.peers.dynamo_timing import fit_timing
from evolving_infra.peers.judge import REFERENCE, OurSide, judge_dynamo
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.mooncake_export import export_rows, write_rows
from evolving_infra.workloads import generate

REASON = dynamo_ready()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"optional peer Dynamo unavailable: {REASON}")
PROFILE = load_profile("glm-5.2-4xgb300-tp4")


def test_one_request_costs_what_our_profile_says(tmp_path: Path) -> None:
    """A lone 20,000-token prompt: Dynamo's TTFT is the fitted prefill of its three chunks, the P->D transfer
    and one decode step at batch 1, so the timing model reached the mocker as fitted."""
    records = [
        {"kind": "agent", "agent": "a", "workload": "cc", "start_s": 0},
        {"kind": "request", "id": "r0", "agent": "a", "branch": "m", "after": [], "delay_s": 0,
         "input": {"new": 20000}, "output_tokens": 41},
    ]  # fmt: skip
    trace = trace_from_records(records)
    rows, _ = export_rows(trace, 64)
    path = tmp_path / "one.jsonl"
    write_rows(rows, path)
    fit = fit_timing(PROFILE, trace)
    run = run_dynamo_replay(path, DynamoSetup.for_profile(PROFILE, 1, 1), fit, timeout_s=120)
    (r,) = run.requests
    a = fit.arrays()
    prefill = sum(np.interp(n, a["prefill_isl"], a["prefill_ttft_ms"]) for n in (8192, 8192, 3616)) / 1000
    step = decode_iteration_time(PROFILE.decode.coefficients(), 1) / PROFILE.decode.t_acc
    expected = prefill + PROFILE.transfer_time(20000) + step
    assert r.ttft_s == pytest.approx(expected, rel=0.02)
    assert r.e2e_s == pytest.approx(r.ttft_s + 40 * step, rel=0.02)
    assert r.reused_tokens == 0 and run.failed == 0


def test_judge_small_workload() -> None:
    """Two Putnam agents through Dynamo's replay and our KV-router baseline: every request completes on both
    sides and is matched by (branch, turn); both see the trace's prefix sharing."""
    trace = trace_from_records(generate("putnam", 2, 0))
    report = judge_dynamo(trace, profile=PROFILE.name, split="2P2D", sides=[OurSide.DYNAMO_KV], timeout_s=300)
    assert report["unmatched_requests"] == 0
    assert report["matched_requests"] == len(trace.requests)
    assert report["details"][REFERENCE]["failed"] == 0
    for side in (REFERENCE, "dynamo-kv"):
        assert 0.3 < report["metrics"][side]["prefix_reuse"] <= 1.0
    figures = {row["figure"] for row in report["comparison"]}
    assert {"ttft_mean_s", "e2e_mean_s", "throughput_rps", "prefix_reuse"} <= figures
    assert report["speed"][REFERENCE]["wall_s"] > 0
