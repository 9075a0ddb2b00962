"""The Dynamo judge (`evaluate peers`): our side runs the engines Dynamo's mocker is given (the profile's eq. 1/2,
no ground-truth effects, no noise), and `--concurrency N` compares closed loop. Our side and the refusal of traces
whose sessions are not agents are checked without Dynamo; the closed-loop check against the replay (both sides keep
N agents in flight, every request matched) needs the side environment (scripts/peers/setup-dynamo.sh) and skips
otherwise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from evolving_infra.cli.main import main
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.peers.dynamo_replay import DynamoSetup, dynamo_ready, run_dynamo_replay
from evolving_infra.peers.dynamo_timing import fit_timing
from evolving_infra.peers.judge import REFERENCE, OurSide, judge_dynamo, run_ours
from evolving_infra.peers.metrics import PeerRequest
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.mooncake_export import export_rows, write_rows
from evolving_infra.workloads import generate

PROFILE = "glm-5.2-4xgb300-tp4"


def test_our_side_runs_the_engines_dynamo_is_given() -> None:
    """A lone 20,000-token prompt: our TTFT is eq. 1 over its three chunks exactly (no per-chunk ground-truth cost,
    no noise), the same fitted prefill Dynamo's mocker is given; a second run is identical."""
    records = [
        {"kind": "agent", "agent": "a", "workload": "putnam", "start_s": 0},
        {"kind": "request", "id": "r0", "agent": "a", "branch": "m", "after": [], "delay_s": 0,
         "input": {"new": 20000}, "output_tokens": 41},
    ]  # fmt: skip
    trace = trace_from_records(records)
    hw = load_profile(PROFILE)
    a = fit_timing(hw, trace).arrays()
    prefill = sum(np.interp(n, a["prefill_isl"], a["prefill_ttft_ms"]) for n in (8192, 8192, 3616)) / 1000
    (first,) = run_ours(OurSide.DYNAMO_KV, trace, profile=PROFILE, split="1P1D").requests
    (again,) = run_ours(OurSide.DYNAMO_KV, trace, profile=PROFILE, split="1P1D").requests
    assert first.ttft_s == pytest.approx(prefill, rel=0.02) and first == again


def test_closed_loop_needs_one_branch_per_agent(capsys: pytest.CaptureFixture[str]) -> None:
    trace = trace_from_records(generate("cc", 2, 0))  # sub-agents: more branches (Dynamo sessions) than agents
    assert len(trace.branches) > len(trace.agents)
    with pytest.raises(ValueError, match="one branch per agent"):
        judge_dynamo(trace, profile=PROFILE, split="2P2D", concurrency=1)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        judge_dynamo(trace, profile=PROFILE, split="2P2D", concurrency=0)
    assert main(["evaluate", "peers", "--workload", "cc", "--agents", "2", "--split", "2P2D", "--concurrency", "1"]) == 2
    assert "one branch per agent" in capsys.readouterr().err
    assert main(["evaluate", "peers", "--workload", "putnam", "--concurrency", "0"]) == 2
    assert "--concurrency must be >= 1" in capsys.readouterr().err


def _most_in_flight(requests: list[PeerRequest]) -> int:
    """The most branches with a request open at once (arrival to end), from per-request records."""
    events = sorted([(r.arrival_s, 1) for r in requests] + [(r.arrival_s + r.e2e_s, -1) for r in requests],
                    key=lambda e: (e[0], e[1]))  # fmt: skip
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.skipif(dynamo_ready() is not None, reason=f"optional peer Dynamo unavailable: {dynamo_ready()}")
def test_both_sides_keep_the_same_number_of_agents_in_flight(tmp_path: Path) -> None:
    trace = trace_from_records(generate("putnam", 4, 0))
    rows, _ = export_rows(trace, 64)
    write_rows(rows, tmp_path / "t.jsonl")
    hw = load_profile(PROFILE)
    setup = dataclasses.replace(DynamoSetup.for_profile(hw, 2, 2), replay_concurrency=2)
    dynamo = run_dynamo_replay(tmp_path / "t.jsonl", setup, fit_timing(hw, trace), timeout_s=300)
    ours = run_ours(OurSide.DYNAMO_KV, trace, profile=PROFILE, split="2P2D", concurrency=2)
    assert dynamo.failed == 0 and len(dynamo.requests) == len(ours.requests) == len(trace.requests)
    assert _most_in_flight(dynamo.requests) == _most_in_flight(ours.requests) == 2
    open_loop = run_ours(OurSide.DYNAMO_KV, trace, profile=PROFILE, split="2P2D")
    assert _most_in_flight(open_loop.requests) > 2  # the generated agents overlap when nothing holds them back
    report = judge_dynamo(trace, profile=PROFILE, split="2P2D", sides=[OurSide.DYNAMO_KV], timeout_s=300, concurrency=2)
    assert report["loop"] == {"closed": 2} and report["unmatched_requests"] == 0
    assert report["details"][REFERENCE]["failed"] == 0
