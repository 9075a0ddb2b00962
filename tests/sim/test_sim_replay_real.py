"""The replayer and metrics on real loaded traces: synthetic workloads written to a file, read back by the
trace loader, replayed against an ideal server, and scored with the trace's ideal hit tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from evolving_infra.sim.metrics import compute_run_metrics
from evolving_infra.sim.records import RequestRecord, ScoreWindow
from evolving_infra.sim.replay import AgentReplayer, AgentStarted, IssueRequest, ReplayMode
from evolving_infra.sim.replay_loop import ReplayLog, run_replay
from evolving_infra.sim.replay_plan import RequestSpec
from evolving_infra.traces.loader import load_trace
from evolving_infra.traces.records import Trace
from evolving_infra.traces.stats import ideal_hit_tokens

workloads = pytest.importorskip("evolving_infra.workloads")


@pytest.fixture(scope="module", params=["cc", "mixed"])
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trace:
    path = tmp_path_factory.mktemp("traces") / f"{request.param}.jsonl.gz"
    workloads.write_trace(workloads.generate(request.param, 4, 7), path)
    return load_trace(path)


def service_s(spec: RequestSpec) -> float:
    """A made-up cost: 0.1 ms per prompt token plus 20 ms per output token."""
    return 1e-4 * spec.prompt_tokens + 0.02 * spec.output_tokens


@pytest.mark.parametrize("mode", [ReplayMode.closed_loop(2), ReplayMode.open_loop(max_active=2)], ids=["closed", "open"])
def test_replay_of_a_loaded_trace_keeps_its_invariants(
    loaded: Trace, mode: ReplayMode, check_replay: Callable[..., None]
) -> None:
    replayer = AgentReplayer(loaded, mode)
    log = run_replay(replayer, service_s)
    check_replay(loaded, mode, replayer, log)
    assert len(log.completed) == len(loaded.requests) > 50


def test_the_replayer_records_each_open_loop_admission_as_its_agent_starts(loaded: Trace) -> None:
    """`admissions()` (appendix D.3's admission figures) holds the (arrival, start) of every AgentStarted effect,
    waits included; closed loop records none."""
    replayer = AgentReplayer(loaded, ReplayMode.open_loop(max_active=1))
    log = run_replay(replayer, service_s)
    started = [(e.arrived, e.at) for e in log.effects if isinstance(e, AgentStarted)]
    admitted, waiting = replayer.admissions()
    assert admitted == started and len(started) == len(loaded.agents) and not waiting
    assert any(at > arrived for arrived, at in admitted)  # one at a time: later arrivals waited
    closed = AgentReplayer(loaded, ReplayMode.closed_loop(2))
    run_replay(closed, service_s)
    assert closed.admissions() == ([], [])


def _records(log: ReplayLog, cached: Callable[[RequestSpec], int]) -> list[RequestRecord]:
    out = []
    for e in log.effects:
        if not isinstance(e, IssueRequest):
            continue
        r = e.request
        finish = log.completed[r.id]
        out.append(
            RequestRecord(
                request_id=r.id, agent=r.agent, workload=r.workload, branch=r.branch, issued=e.at,
                prefill_node="p0", decode_node="d0", queued=e.at, prefill_start=e.at, first_token=e.at,
                finish=finish, prompt_tokens=r.prompt_tokens, cached_tokens=cached(r), fetched_tokens=0,
                output_tokens=r.output_tokens, since=e.since, pause_s=r.delay_s,
            )
        )
    return out


def test_metrics_of_a_replayed_trace_against_its_ideal_reuse(loaded: Trace) -> None:
    ideal = dict(zip((r.id for r in loaded.requests), (int(x) for x in ideal_hit_tokens(loaded))))
    log = run_replay(AgentReplayer(loaded, ReplayMode.closed_loop(2)), service_s)
    end = max(log.completed.values())
    window = ScoreWindow(end * 0.1, end)
    perfect = compute_run_metrics(_records(log, lambda r: ideal[r.id]), window, ideal=ideal)
    cold = compute_run_metrics(_records(log, lambda r: 0), window, ideal=ideal)
    assert perfect.overall.lost_kv_reuse == pytest.approx(0.0)
    assert cold.overall.lost_kv_reuse == pytest.approx(1.0)
    for label, group in perfect.by_workload.items():
        assert group.lost_kv_reuse == pytest.approx(0.0), label
    assert set(perfect.by_workload) == {a.workload for a in loaded.agents.values()}
    scored = sum(1 for e in log.effects if isinstance(e, IssueRequest) and window.start <= e.at < end)
    assert perfect.overall.requests == scored
    assert perfect.overall.mean_pause_s is not None and perfect.overall.mean_pause_s > 0
