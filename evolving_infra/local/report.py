"""The report of a local-cluster run: `report.json`, `report.md`, the request records and the plots.

Figures come from `compute_run_metrics` over the recorded requests, on the replay clock (emulated seconds; wall
seconds = emulated / speed-up, and both are given for the run's length and throughput). The KV hit rate is the
router's reported reuse (`cached_tokens` in each answer's usage) over prompt tokens; the ideal hit rate h* is
the trace's, for the same requests. Switches are the node agents' own measurements (node clock): total time,
drain, and the time after the drain (releasing GPU memory and starting the new phase).

Boundary: formatting and files; no measurements are taken here.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evolving_infra.local.against import comparison_markdown
from evolving_infra.local.run import LocalRunResult
from evolving_infra.sim.export import write_requests_jsonl
from evolving_infra.sim.metrics import RunMetrics, compute_run_metrics
from evolving_infra.sim.plots import write_plots
from evolving_infra.sim.records import ScoreWindow
from evolving_infra.traces.records import Trace
from evolving_infra.traces.stats import ideal_hit_tokens


def run_metrics(result: LocalRunResult, trace: Trace) -> tuple[RunMetrics, dict[str, int]]:
    ideal_all = ideal_hit_tokens(trace)
    ideal: dict[str, int] = {r.id: int(ideal_all[r.index]) for r in trace.requests}
    records = result.replay.records
    end = max([r.finish for r in records] + [result.replay.emulated_s, 1e-9])
    metrics = compute_run_metrics(
        records, ScoreWindow(0.0, end), ideal=ideal, switches=[s.record for s in result.switches], splits=result.splits,
    )  # fmt: skip
    return metrics, ideal


def build_report(result: LocalRunResult, trace: Trace, *, trace_label: str, command: str) -> dict[str, Any]:
    """Everything `report.json` holds."""
    metrics, _ = run_metrics(result, trace)
    speed = result.config.cluster.speed_up
    o = metrics.overall
    records = result.replay.records
    prog = result.replay.progress
    switches = [
        {"node": s.record.node, "from": s.record.from_phase.value, "to": s.record.to_phase.value,
         "completed_at_s": s.record.completed, "duration_s": s.duration_s, "drain_s": s.drain_s,
         "after_drain_s": s.after_drain_s, "after_drain_wall_s": s.after_drain_s / speed}
        for s in result.switches
    ]  # fmt: skip
    after = [s.after_drain_s / speed for s in result.switches]
    return {
        "command": command,
        "trace": trace_label,
        "outcome": result.stopped_by,
        "clock": f"emulated seconds (node clock) = wall seconds x {speed:g}",
        "config": {
            "cluster": {k: v for k, v in asdict(result.config.cluster).items() if k != "node_settings"},
            "split": result.config.cluster.split,
            "replay": result.config.mode.kind.value,
            "concurrency": result.config.mode.concurrency,
            "client": asdict(result.config.client),
            "duration_wall_s": result.config.duration_s,
        },
        "run": {
            "wall_s": result.replay.wall_s, "emulated_s": result.replay.emulated_s, "startup_wall_s": result.startup_s,
            "trace_requests": len(trace.requests), "issued": prog.issued, "finished": len(records),
            "failed": prog.failed, "agents_started": prog.agents_started, "agents_finished": prog.agents_finished,
            "branches_finished": prog.branches_finished, "router_retries": result.retries,
            "exit_codes": result.exit_codes,
        },  # fmt: skip
        "tokens": {"prompt": o.prompt_tokens, "cached": o.cached_tokens, "output": sum(r.output_tokens for r in records)},
        "throughput": {
            "requests_per_s": o.throughput_rps,
            "requests_per_wall_s": len(records) / result.replay.wall_s if result.replay.wall_s > 0 else None,
        },
        "latency_s": {"ttft": _summary(o.ttft_s), "e2e": _summary(o.e2e_s), "tpot": _summary(o.tpot_s)},
        "kv": {"hit_rate": o.kv_hit_rate, "ideal_hit_rate": o.ideal_hit_rate, "lost_reuse": o.lost_kv_reuse},
        "switches": switches,
        "switch_after_drain_wall_s": {"count": len(after), "mean": sum(after) / len(after) if after else None,
                                      "max": max(after) if after else None},  # fmt: skip
        "planner_decisions": result.decisions,
        "split_timeline": [{"at_s": t, "split": s} for t, s in metrics.split_timeline],
        "split_share": dict(metrics.split_share),
        "metrics": metrics.to_dict(),
    }


def _summary(s: Any) -> dict[str, Any]:
    return {"count": s.count, "mean": s.mean, "p50": s.p50, "p95": s.p95}


def _f(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(report: dict[str, Any]) -> str:
    run, tok, lat, kv = report["run"], report["tokens"], report["latency_s"], report["kv"]
    cfg = report["config"]["cluster"]
    lines = [
        "# Local cluster run",
        "",
        f"`{report['command']}`",
        "",
        f"Trace: {report['trace']}. Outcome: **{report['outcome']}**. Times are {report['clock']}.",
        "",
        "| | |",
        "|---|---|",
        f"| cluster | {cfg['nodes']} nodes, initial split {report['config']['split']}, planner {cfg['planner']}, "
        f"routing {cfg['routing']}, speed-up {cfg['speed_up']:g}x"
        + (" (SGLang's gateway smg in front, PD mode, cache_aware prefill)" if cfg.get("gateway") == "smg" else "") + " |",
        f"| planner window | {cfg['window_s']:g} s in {cfg['slices']} slices, cooldown {cfg['cooldown_s']:g} s (emulated) |",
        f"| run | {_f(run['wall_s'], 1)} s wall ({_f(run['emulated_s'], 1)} s emulated), startup {_f(run['startup_wall_s'], 1)} s |",
        f"| requests | {run['finished']} finished, {run['failed']} failed, {run['issued']} issued of {run['trace_requests']} in the trace |",
        f"| tokens | {tok['prompt']} prompt, {tok['cached']} cached, {tok['output']} output |",
        f"| throughput | {_f(report['throughput']['requests_per_s'])} req/s emulated, "
        f"{_f(report['throughput']['requests_per_wall_s'])} req/s wall |",
        f"| TTFT | mean {_f(lat['ttft']['mean'])} s, p95 {_f(lat['ttft']['p95'])} s |",
        f"| E2E | mean {_f(lat['e2e']['mean'])} s, p95 {_f(lat['e2e']['p95'])} s |",
        f"| KV hit rate | {_f(kv['hit_rate'])} (ideal {_f(kv['ideal_hit_rate'])}, lost reuse {_f(kv['lost_reuse'])}) |",
        "",
        "## Split over time",
        "",
        "| from (s) | split |",
        "|---|---|",
    ]  # fmt: skip
    lines += [f"| {_f(e['at_s'], 1)} | {e['split']} |" for e in report["split_timeline"]]
    lines += ["", "## Phase switches (node-measured)", ""]
    if report["switches"]:
        lines += ["| node | from -> to | done at (s) | total (s) | drain (s) | after drain (s) | after drain, wall (s) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        lines += [
            f"| {s['node']} | {s['from']} -> {s['to']} | {_f(s['completed_at_s'], 1)} | {_f(s['duration_s'])} | "
            f"{_f(s['drain_s'])} | {_f(s['after_drain_s'], 4)} | {_f(s['after_drain_wall_s'], 4)} |"
            for s in report["switches"]
        ]
    else:
        lines.append("No phase switch in this run.")
    decisions = ", ".join(f"{k}: {int(v)}" for k, v in sorted(report["planner_decisions"].items())) or "none"
    lines += ["", f"Planner decisions: {decisions}.", "",
              "Plots: `split_over_time.png`, `latency_cdf.png`, `kv_lost.png`; per request: `requests.jsonl`.", ""]  # fmt: skip
    if report.get("against"):
        lines += comparison_markdown(report["against"])
    lines += peers_markdown(report.get("peers") or [])
    return "\n".join(lines)


def collect_peer_reports(folder: Path) -> list[dict[str, Any]]:
    """The JSON reports of `evolving-infra evaluate peers --out` / `evaluate smg --json` saved in `folder`
    (runs/peers beside the run folders), newest first; unreadable files are skipped."""
    found: list[tuple[float, dict[str, Any]]] = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and ("comparison" in data or "agreement_rate" in data):
            found.append((path.stat().st_mtime, {**data, "file": path.name}))
    return [d for _, d in sorted(found, key=lambda t: -t[0])]


def peers_markdown(reports: list[dict[str, Any]]) -> list[str]:
    """"Ours vs the real peers": Dynamo's replay against our simulator, and the SGLang gateway's routing
    against our cache-aware policy (docs/peers.md), from saved judge reports."""
    if not reports:
        return []
    lines = ["## Ours vs the real peers", "",
             "From the judge reports in `runs/peers/` (docs/peers.md); differences from the peer in parentheses.", ""]
    for r in (r for r in reports if "comparison" in r):
        sides = list(r["comparison"][0]["values"])
        lines += [f"**{r['file']}**: {r['trace']['requests']:,} requests, split {r['split']}, reference {r['reference']}",
                  "", "| figure | " + " | ".join(sides) + " |", "|---|" + "---:|" * len(sides)]  # fmt: skip
        for row in r["comparison"]:
            cells = []
            for side in sides:
                diff = row["differences"].get(side)
                note = "" if side == r["reference"] else (" (n/a)" if diff is None else f" ({diff:+.0%})")
                cells.append(f"{row['values'][side]:,.3f}{note}")
            lines.append(f"| {row['figure']} | " + " | ".join(cells) + " |")
        lines.append("")
    smg = [r for r in reports if "agreement_rate" in r]
    if smg:
        lines += ["| gateway differential | requests | agreement | disagreements by cause |", "|---|---:|---:|---|"]
        for r in smg:
            causes = ", ".join(f"{k} {v}" for k, v in sorted(r.get("causes", {}).items())) or "none"
            lines.append(f"| {r['file']} | {r['requests']} | {r['agreement_rate']:.1%} | {causes} |")
        lines.append("")
    return lines


def write_report(result: LocalRunResult, trace: Trace, out: Path, *, trace_label: str, command: str) -> dict[str, Any]:
    """Write report.json, report.md, requests.jsonl and the plots into `out`; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(result, trace, trace_label=trace_label, command=command)
    report["peers"] = collect_peer_reports(out.parent / "peers")
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    write_requests_jsonl(result.replay.records, out / "requests.jsonl")
    metrics, ideal = run_metrics(result, trace)
    write_plots(result.replay.records, result.splits, ideal, (metrics.window_start, metrics.window_end),
                result.config.cluster.nodes, out)  # fmt: skip
    return report
