"""Run one simulation end to end: `simulate(cfg, trace)` -> `SimResult` (metrics, records, switches, splits).

The run goes until the trace's agents have all finished, or, with `duration_s`, until `warmup_s + duration_s`
and then at most `drain_s` longer while requests issued in the scored window are still in flight (so their
latencies are scored; throughput counts only what finished inside the window). Scoring: `ScoreWindow(warmup_s,
end)`, with the per-request ideal hit tokens of the trace for lost KV reuse.

`progress(Progress)` (optional) is the kernel's hook: it sees virtual time and event counts; the caller measures
wall time itself. A result is a pure function of the config and the trace.

Boundary: orchestration; the CLI prints and writes files (`evolving_infra.cli.simulate`, `sim.export`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.sim import quiet
from evolving_infra.sim.admission import admission_summary
from evolving_infra.sim.cluster import build_cluster, initial_commands
from evolving_infra.sim.config import SimConfig
from evolving_infra.sim.export import write_metrics_json, write_requests_jsonl
from evolving_infra.sim.gcspacing import spaced_collections
from evolving_infra.sim.kernel import Kernel, Progress, StopReason
from evolving_infra.sim.metrics import RunMetrics, compute_run_metrics
from evolving_infra.sim.records import NodeSpan, RequestRecord, ScoreWindow, SplitRecord, SwitchRecord
from evolving_infra.sim.replay import ReplayKind
from evolving_infra.sim.spans import close_span
from evolving_infra.sim.state import ClusterState
from evolving_infra.traces.content import PageLabels
from evolving_infra.traces.growing import GrowingTrace
from evolving_infra.traces.loader import trace_from_records
from evolving_infra.traces.records import Trace
from evolving_infra.traces.stats import ideal_hit_tokens
from evolving_infra.workloads import default_params, generate, with_overrides
from evolving_infra.workloads.generate import plan_agents, streamable


@dataclass
class SimResult:
    config: SimConfig
    metrics: RunMetrics
    records: list[RequestRecord]
    switches: list[SwitchRecord]
    splits: list[SplitRecord]
    spans: list[NodeSpan]
    stats: dict[str, Any]
    stop_reason: str
    end_time: float
    events: int
    state: ClusterState | None = field(default=None, repr=False)
    """The cluster after the run (for tests and inspection)."""

    def write(self, out_dir: str | Path) -> dict[str, Path]:
        """Write `metrics.json` and `requests.jsonl` into `out_dir` (created); returns the paths written."""
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"metrics": folder / "metrics.json", "requests": folder / "requests.jsonl"}
        write_metrics_json(self.metrics, paths["metrics"])
        write_requests_jsonl(self.records, paths["requests"])
        return paths


def workload_trace(kind: str, agents: int, seed: int) -> Trace:
    """A synthetic trace of `agents` agents of workload `kind` (see `evolving_infra.workloads`)."""
    return trace_from_records(generate(kind, agents, seed), source=f"workload:{kind}")


def workload_stream(kind: str, agents: int, seed: int) -> Trace | GrowingTrace:
    """`workload_trace`'s trace, generated agent by agent as a closed-loop run starts its agents
    (`GrowingTrace`); the `fleet` kind, whose generator is not per agent, comes whole."""
    if not streamable(kind):
        return workload_trace(kind, agents, seed)
    plan = plan_agents(kind, agents, seed, with_overrides(default_params(kind), {}))
    return GrowingTrace(plan.head, plan.agent, agents, source=f"workload:{kind}")


@spaced_collections()
def simulate(
    cfg: SimConfig,
    trace: Trace | GrowingTrace,
    *,
    progress: Callable[[Progress], None] | None = None,
    progress_every: int = 20_000,
    keep_state: bool = False,
    prepare: Callable[[ClusterState], None] | None = None,
    labels: PageLabels = PageLabels.DENSE,
) -> SimResult:
    """Run `cfg` on `trace`; `prepare` may adjust the built cluster before it starts (experiments that vary
    what the config does not name, e.g. the control core's settings); `labels`: how pages are named
    (`traces.content.PageLabels`; the dense labels by default, content hashes to check them against)."""
    state = build_cluster(cfg, trace, labels=labels)
    if prepare is not None:
        prepare(state)
    kernel = Kernel(progress=progress, progress_every=progress_every)
    if state.inline_steps:
        state.kernel = kernel
    kernel.apply(initial_commands(state))
    end = cfg.scored_end
    if end is None:
        result = kernel.run()
    else:
        result = kernel.run(until=end)
        deadline = end + cfg.drain_s
        while (
            result.reason is not StopReason.STOPPED
            and kernel.peek() is not None
            and kernel.now < deadline
            and any(r.issued < end for r in state.requests.values())
        ):
            result = kernel.run(until=min(kernel.now + 10.0, deadline))
    now = kernel.now
    for node in state.nodes.values():
        quiet.settle(state, node, now, last=True)
        close_span(state, node, now)
    ideal = ideal_by_request(trace, state.profile.page_tokens)
    window = _window(cfg, state.records, end)
    stats = _stats(state, now, kernel.processed, result.reason.value)
    metrics = compute_run_metrics(
        state.records, window, ideal=ideal, switches=state.switches, splits=state.splits, spans=state.spans,
        extra={"system": cfg.system.value if cfg.system else None, "config": cfg.describe(), "simulation": stats,
               "planner_switch_decisions": state.decisions, "planner_hold_decisions": state.holds},
    )
    return SimResult(cfg, metrics, state.records, state.switches, state.splits, state.spans, stats,
                     result.reason.value, now, kernel.processed, state if keep_state else None)


def rescore(result: SimResult, trace: Trace | GrowingTrace, records: list[RequestRecord],
            note: dict[str, Any]) -> SimResult:
    """`result` with `records` in place of its own (the same requests with times changed after the run, e.g. a
    per-request cost added), scored again over the same window with the same ideal reuse; `note` goes into the
    metrics' extra data."""
    if {r.request_id for r in records} != {r.request_id for r in result.records}:
        raise ValueError("rescore takes the run's own requests, with times changed")
    window = ScoreWindow(result.metrics.window_start, result.metrics.window_end)
    ideal = ideal_by_request(trace, load_profile(result.config.profile).page_tokens)
    metrics = compute_run_metrics(records, window, ideal=ideal, switches=result.switches, splits=result.splits,
                                  spans=result.spans, extra={**result.metrics.extra, **note})  # fmt: skip
    return replace(result, metrics=metrics, records=list(records))


def ideal_by_request(trace: Trace | GrowingTrace, page_tokens: int) -> dict[str, int]:
    """Each request's ideal cached tokens (h*), by request id (of a growing trace: its loaded agents, a prefix
    of the file order, so each request's figure is the whole trace's)."""
    whole = trace.snapshot() if isinstance(trace, GrowingTrace) else trace
    ideal_arr = ideal_hit_tokens(whole, page_tokens)
    return {r.id: int(ideal_arr[r.index]) for r in whole.requests}


def _window(cfg: SimConfig, records: list[RequestRecord], end: float | None) -> ScoreWindow:
    if end is not None:
        return ScoreWindow(cfg.warmup_s, end)
    last = max((r.finish for r in records), default=0.0)
    start = cfg.warmup_s if last > cfg.warmup_s else 0.0
    return ScoreWindow(start, None if last > start else start + 1.0)


def _stats(state: ClusterState, now: float, events: int, reason: str) -> dict[str, Any]:
    s = state.stats
    return {
        "end_time_s": now,
        "events": events,
        "stop_reason": reason,
        "issued": s.issued,
        "finished": s.finished,
        "in_flight_at_end": len(state.requests),
        "trace_exhausted": state.replayer.exhausted,
        "rerouted": s.rerouted,
        "rebound": s.rebound,
        "aborted_by_relaunch": s.aborted_by_relaunch,
        "fetches": s.fetches,
        "fetched_tokens": s.fetched_tokens,
        "failed_fetches": s.failed_fetches,
        "failed_fetch_tokens": s.failed_fetch_tokens,
        "peak_transfers": s.peak_transfers,
        "planner_ticks": s.planner_ticks,
        "planner_switches": s.planner_switches,
        "pauses": s.pauses,
        "resumes": s.resumes,
        "bind_waits": s.bind_waits,
        "reservation_waits": s.reservation_waits,
        "fit_messages": list(s.fit_messages),
        "fitted_models": fitted_model_quality(state),
        "disaggregated_at": state.disaggregated_at,
        **_admission(state, now),
        **_skipped(state),
    }


def _skipped(state: ClusterState) -> dict[str, Any]:
    """Closed loop that follows the trace's schedule only (other metrics stay as they were): agents skipped."""
    if state.replayer.mode.skip_late_s is None:
        return {}
    return {"skipped_agents": state.replayer.skipped_agents}


def _admission(state: ClusterState, now: float) -> dict[str, Any]:
    """Open loop only (closed-loop metrics stay as they were): D.3's admission figures over the scored window."""
    if state.replayer.mode.kind is not ReplayKind.OPEN_LOOP:
        return {}
    end = now if state.cfg.scored_end is None else min(now, state.cfg.scored_end)
    start = min(state.cfg.warmup_s, end)
    admitted, waiting = state.replayer.admissions()
    return {"admission": admission_summary(admitted, waiting, start, end)}


def fitted_model_quality(state: ClusterState) -> dict[str, Any]:
    """The frozen warmup fits' held-out errors (mean relative error on the warmup iterations each fit held out):
    per node and phase, and the median and largest over the nodes that fitted the phase themselves (a borrowed
    phase has none). Empty when the models came from the profile."""
    fitted = state.control.models.fitted if state.control is not None else {}
    nodes: dict[str, dict[str, float | int | None]] = {}
    for node, model in sorted(fitted.items()):
        row: dict[str, float | int | None] = {}
        for phase, quality in (("prefill", model.prefill_quality), ("decode", model.decode_quality)):
            if quality is not None:
                row[f"{phase}_held_out_error"] = quality.held_out_error
                row[f"{phase}_samples"] = quality.train_samples
        nodes[str(node)] = row
    out: dict[str, Any] = {"nodes": nodes}
    for phase in ("prefill", "decode"):
        errors = sorted(e for row in nodes.values() if (e := row.get(f"{phase}_held_out_error")) is not None)
        if errors:
            out[f"{phase}_held_out_error_median"] = float(statistics.median(errors))
            out[f"{phase}_held_out_error_max"] = float(errors[-1])
    return out
