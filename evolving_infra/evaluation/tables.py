"""The evaluation runner's tables: the paper's reference figures (tables C.1, C.3 and D.1) and the markdown
rendering of cached run records beside them (`summarize`, `render_calibration`, `render_evaluation`).

Boundary: pure functions of the cached records (tested in tests/sim/test_evaluate_runner.py); running and caching
are `cli.evaluate`'s, the tables with seeds `evaluation.protocol`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

BEST_SPLIT = {"putnam": "2P7D", "cc": "4P5D", "osworld": "6P3D"}
"""SGLang's best static split per workload (table D.1); every system of the matrix starts from it."""

PAPER_CONCURRENCY = {"putnam": 224, "cc": 90, "osworld": 128}
"""The lowest concurrency of tables C.1-C.3 (the one table D.1 uses)."""

PAPER_D1: dict[str, dict[str, float]] = {
    # table D.1, SGLang rows: X req/s, TTFT mean / P95, E2E mean / P95 (s)
    "putnam": {"x": 9.00, "ttft": 1.0, "ttft_p95": 2.5, "e2e": 14.6, "e2e_p95": 74.0},
    "cc": {"x": 4.97, "ttft": 4.8, "ttft_p95": 19.5, "e2e": 9.2, "e2e_p95": 30.7},
    "osworld": {"x": 3.12, "ttft": 35.3, "ttft_p95": 50.8, "e2e": 35.8, "e2e_p95": 51.3},
}

PAPER_PAUSE = {"putnam": (9.9, 10.1), "cc": (12.9, 18.6), "osworld": (1.0, 1.4)}
"""Mean pause between requests, range over systems and concurrencies (table C.3)."""

PAPER_C: dict[tuple[str, int], dict[str, dict[str, float]]] = {
    # tables C.1 and C.3: X, mean E2E, switches, lost KV reuse (fraction); Arrow from figure 3 (CC 90 only:
    # 34 switches, 55.5 % lost reuse, 65 % less throughput than the best static split's 4.9 req/s).
    ("putnam", 224): {"dynamo": {"x": 7.72, "e2e": 19.1, "switches": 2, "lost": 0.0247},
                      "evolving": {"x": 8.81, "e2e": 15.5, "switches": 3, "lost": 0.0048}},
    ("putnam", 256): {"dynamo": {"x": 8.37, "e2e": 20.4, "switches": 2, "lost": 0.0248},
                      "evolving": {"x": 9.20, "e2e": 17.8, "switches": 2, "lost": 0.0017}},
    ("putnam", 288): {"dynamo": {"x": 9.12, "e2e": 21.7, "switches": 3, "lost": 0.0263},
                      "evolving": {"x": 10.15, "e2e": 18.6, "switches": 5, "lost": 0.0046}},
    ("cc", 90): {"dynamo": {"x": 2.48, "e2e": 32.2, "switches": 4, "lost": 0.0513},
                 "evolving": {"x": 5.40, "e2e": 7.9, "switches": 1, "lost": 0.0032},
                 "arrow": {"x": 4.9 * 0.35, "switches": 34, "lost": 0.555}},
    ("cc", 108): {"dynamo": {"x": 2.48, "e2e": 37.7, "switches": 4, "lost": 0.0489},
                  "evolving": {"x": 5.78, "e2e": 9.9, "switches": 2, "lost": 0.0048}},
    ("cc", 126): {"dynamo": {"x": 2.14, "e2e": 54.4, "switches": 4, "lost": 0.0778},
                  "evolving": {"x": 5.85, "e2e": 13.2, "switches": 2, "lost": 0.0101}},
    ("osworld", 128): {"dynamo": {"x": 1.93, "e2e": 57.4, "switches": 5, "lost": 0.0400},
                       "evolving": {"x": 4.30, "e2e": 24.5, "switches": 1, "lost": 0.0021}},
}

SYSTEMS = ("evolving", "dynamo", "best-static", "arrow")
"""The systems of the runner's matrices, in the tables' order."""


def paper_figure(spec: Mapping[str, Any], key: str) -> float | None:
    """The paper's figure `key` (`x`, `e2e`, `ttft_p95`, `lost`, ...) for the system and setting of a run's
    `spec`: tables C.1/C.3 for ours, Dynamo and Arrow (by workload and concurrency), table D.1 for the best static
    split at SGLang's split and the lowest concurrency. None for relabelled variants (ablations, other engines),
    open-loop and shift runs, and figures the tables lack."""
    if spec.get("label") or spec.get("arrival_rate") is not None or spec.get("period_s") is not None:
        return None
    workload, agents, system = spec["workload"], spec["agents"], spec["system"]
    if system == "best-static":
        if spec["split"] != BEST_SPLIT.get(workload) or agents != PAPER_CONCURRENCY.get(workload):
            return None
        return PAPER_D1.get(workload, {}).get(key)
    return PAPER_C.get((workload, agents), {}).get(system, {}).get(key)


def summarize(record: Mapping[str, Any]) -> dict[str, Any]:
    """The figures the tables show, from one cached record (`None` where the run has no value)."""
    m = record["metrics"]
    o = m["overall"]
    sw = m.get("switches") or {}
    window = m.get("window") or {}
    decided = [d for d in m.get("planner_switch_decisions") or []
               if d.get("outcome") == "switch" and window.get("start", 0.0) <= d["at"] < window.get("end", 0.0)]
    share = m.get("split_share") or {}
    fits = (m.get("simulation") or {}).get("fitted_models") or {}
    return {
        "x": o.get("throughput_rps"), "ttft": o["ttft_s"].get("mean"), "ttft_p95": o["ttft_s"].get("p95"),
        "e2e": o["e2e_s"].get("mean"), "e2e_p95": o["e2e_s"].get("p95"), "pause": o.get("mean_pause_s"),
        "lost": o.get("lost_kv_reuse"), "hit": o.get("kv_hit_rate"), "switches": sw.get("count"),
        "switch_s": sw.get("mean_time_s"), "decided": len(decided),
        "decided_total": sum(1 for d in m.get("planner_switch_decisions") or [] if d.get("outcome") == "switch"),
        "queue": (o.get("prefill_queue_s") or {}).get("mean"),
        "uncached": o.get("uncached_tokens_per_request"), "n_branch": o.get("little_n_branch"),
        "final_split": max(share, key=lambda k: share[k]) if share else None,
        "wall_s": record.get("wall_s"),
        "fit_prefill": fits.get("prefill_held_out_error_median"), "fit_decode": fits.get("decode_held_out_error_median"),
        "short": (record.get("sim_end_s") or 0.0) < record["spec"]["warmup_s"] + record["spec"]["duration_s"],
    }


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}"


def _ratio(measured: float | None, paper: float | None) -> str:
    if measured is None or paper in (None, 0):
        return "-"
    return f"{measured / paper:.2f}"


def _overrides(overrides: Iterable[Sequence[Any]] | None) -> str:
    items = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in (overrides or [])]
    return ", ".join(items) or "defaults"


def render_calibration(records: Iterable[Mapping[str, Any]]) -> str:
    """Best-static runs next to table D.1's SGLang row and table C.3's pauses (measured / paper ratios)."""
    lines = [
        "| workload | agents | split | X req/s (paper) | ratio | E2E mean s (paper) | ratio | TTFT mean s (paper) "
        "| TTFT P95 s (paper) | E2E P95 s (paper) | pause s (paper C.3) | window s | wall s | generator |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: (r["spec"]["workload"], r["spec"]["agents"], r.get("key", ""))):
        spec = r["spec"]
        if spec["system"] != "best-static" or spec["workload"] not in PAPER_D1:
            continue
        if spec["agents"] != PAPER_CONCURRENCY[spec["workload"]]:
            continue  # table D.1 has the lowest concurrency only
        s, p = summarize(r), PAPER_D1[spec["workload"]]
        lo, hi = PAPER_PAUSE[spec["workload"]]
        lines.append(
            f"| {spec['workload']} | {spec['agents']} | {spec['split']} | {_f(s['x'])} ({p['x']:.2f}) "
            f"| {_ratio(s['x'], p['x'])} | {_f(s['e2e'], 1)} ({p['e2e']:.1f}) | {_ratio(s['e2e'], p['e2e'])} "
            f"| {_f(s['ttft'], 1)} ({p['ttft']:.1f}) | {_f(s['ttft_p95'], 1)} ({p['ttft_p95']:.1f}) "
            f"| {_f(s['e2e_p95'], 1)} ({p['e2e_p95']:.1f}) | {_f(s['pause'], 1)} ({lo:g}-{hi:g}) "
            f"| {spec['warmup_s']:g}+{spec['duration_s']:g}{' (trace ran out)' if s['short'] else ''} "
            f"| {_f(s['wall_s'], 0)} | {_overrides(spec.get('overrides'))} |")
    return "\n".join(lines)


def render_evaluation(records: Iterable[Mapping[str, Any]]) -> str:
    """One table per (workload, agents, initial split, window): every system's figures, with the paper's C.1/C.3
    figures beside (runs from the best static split first, then runs from other splits)."""
    groups: dict[tuple[str, int, bool, str, float, float], list[Mapping[str, Any]]] = {}
    for r in records:
        spec = r["spec"]
        other = spec["split"] != BEST_SPLIT.get(spec["workload"])
        key = (spec["workload"], spec["agents"], other, spec["split"], spec["warmup_s"], spec["duration_s"])
        groups.setdefault(key, []).append(r)
    out: list[str] = []
    order = {s: i for i, s in enumerate(SYSTEMS)}
    for (workload, agents, *_), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: (order.get(r["spec"]["system"], 99), r["spec"]["system"]))
        spec = rs[0]["spec"]
        out.append(f"### {workload}, {agents} agents, from {spec['split']} "
                   f"({spec['warmup_s']:g} s warmup + {spec['duration_s']:g} s scored, seed {spec['seed']})")
        out.append("")
        out.append("| system | X req/s | mean E2E s | P95 TTFT s | mean TTFT s | lost KV reuse % | KV hit % "
                   "| switches (s/switch); decided in window / in run | most time at "
                   "| paper X / E2E / switches / lost % | held-out model error P / D % | wall s |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        paper = PAPER_C.get((workload, agents), {})
        for r in rs:
            system = r["spec"]["system"]
            s = summarize(r)
            if system == "best-static" and workload in PAPER_D1 and agents == PAPER_CONCURRENCY[workload]:
                d1 = PAPER_D1[workload]
                ref = f"{d1['x']:.2f} / {d1['e2e']:.1f} / 0 / - (D.1)"
            elif system in paper:
                c = paper[system]
                ref = (f"{_f(c.get('x'))} / {_f(c.get('e2e'), 1)} / {c['switches']:g} / {_pct(c.get('lost'))}")
            else:
                ref = "-"
            switches = "-" if s["switches"] is None else f"{s['switches']} ({_f(s['switch_s'], 1)})"
            switches += f"; {s['decided']} / {s['decided_total']}"
            label = r["spec"].get("label") or system
            name = f"{label} (trace ran out)" if s["short"] else label
            out.append(f"| {name} | {_f(s['x'])} | {_f(s['e2e'], 1)} | {_f(s['ttft_p95'], 1)} | {_f(s['ttft'], 1)} "
                       f"| {_pct(s['lost'])} | {_pct(s['hit'])} | {switches} | {s['final_split'] or '-'} | {ref} "
                       f"| {_pct(s['fit_prefill'])} / {_pct(s['fit_decode'])} | {_f(s['wall_s'], 0)} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
