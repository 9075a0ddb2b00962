"""The fleet's figures (appendix D.2) from partition results: tables, a JSON-ready summary and a PNG.

Definitions, over the scored window `[warmup, warmup + duration)` cut into the results' buckets (only buckets
wholly inside the window count):

- **PD demand ratio** of a bucket: uncached prompt tokens of the prefills that started in it over the output
  tokens of the requests that finished in it. Its **variation** over the window is `(max - min) / mean` of the
  bucket values; the fleet's aggregate ratio sums the tokens of every partition first. The fleet's is also given
  over buckets `COARSE` times as wide (consecutive buckets summed, a partial group at the end left out): a ratio of
  token counts is noisy over short buckets, and appendix D.2's 7 % is over a day-long trace.
- **Total work** of a bucket: requests issued (the closed loop's demand); its variation is defined the same way.
- **Queueing**: prefill queueing time (`prefill_start - queued`). A partition's figure relative to the fleet's
  is its mean over the window divided by the fleet's pooled mean (sums and counts carried, never averaged
  averages); the peak is the largest ratio over buckets, bucket by bucket.
- **Throughput**: each partition's scored throughput (`sim.metrics`), summed for the fleet. Adaptive over static
  compares two runs of the same fleet and workload that differ only in the planner.
- **Split over time**: prefill and decode nodes at each bucket's end.
- **Mix**: the share of requests issued by one workload (the first label in sorted order, `cc` in D.2's fleet) in
  the first and the last third of the window, to see whether a partition's local shift was replayed.
- **Cost**: the sum of the partitions' own wall times (each measured by the run that simulated it, so a run
  resumed from stored partitions still shows what the whole fleet took); `wall_s` is this invocation's.

Boundary: pure functions of `PartitionResult`s, plus `write_figure` (matplotlib, a file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evolving_infra.fleet.sim import FleetResult, PartitionResult


def _window(result: FleetResult) -> tuple[float, float]:
    """The fleet's scored window (every partition shares it: the first one's)."""
    return _run_window(result.partitions[0])


def _run_window(p: PartitionResult) -> tuple[float, float]:
    window = p.metrics.get("window") or {}
    return float(window.get("start", 0.0)), float(window.get("end") or p.sim_end_s)


def _in_window(rows: Sequence[Mapping[str, Any]], start: float, end: float) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["t0"] >= start - 1e-9 and r["t1"] <= end + 1e-9]


def variation(values: Sequence[float]) -> float | None:
    """`(max - min) / mean`, or None for an empty or zero-mean series."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    mean = sum(vals) / len(vals)
    return None if mean <= 0 else (max(vals) - min(vals)) / mean


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def short_name(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def partition_rows(result: FleetResult) -> list[dict[str, Any]]:
    """Per partition: throughput, queueing relative to the fleet, PD and work variation, splits seen."""
    start, end = _window(result)
    windows = [_in_window(p.series, start, end) for p in result.partitions]
    n = min((len(w) for w in windows), default=0)
    fleet_q = sum(r["queue_s_sum"] for w in windows for r in w)
    fleet_n = sum(r["prefills"] for w in windows for r in w)
    fleet_mean = _ratio(fleet_q, fleet_n)
    bucket_fleet = [_ratio(sum(w[i]["queue_s_sum"] for w in windows), sum(w[i]["prefills"] for w in windows))
                    for i in range(n)]
    rows: list[dict[str, Any]] = []
    for p, w in zip(result.partitions, windows, strict=True):
        q = sum(r["queue_s_sum"] for r in w)
        k = sum(r["prefills"] for r in w)
        mean = _ratio(q, k)
        peaks = [_ratio(_ratio(w[i]["queue_s_sum"], w[i]["prefills"]) or 0.0, f) for i, f in enumerate(bucket_fleet)
                 if f and f > 0 and w[i]["prefills"] > 0]
        pd = [_ratio(r["uncached_tokens"], r["output_tokens"]) for r in w]
        splits: list[str] = []
        for r in w:
            label = f"{r['prefill_nodes']}P{r['decode_nodes']}D" if r["prefill_nodes"] is not None else "-"
            if not splits or splits[-1] != label:
                splits.append(label)
        rows.append({
            "partition": short_name(p.key), "nodes": p.nodes, "agents": p.concurrency, "users": p.users,
            "throughput_rps": p.metrics["overall"].get("throughput_rps"),
            "queue_mean_s": mean,
            "queue_vs_fleet": None if mean is None or not fleet_mean else mean / fleet_mean,
            "queue_peak_vs_fleet": max((x for x in peaks if x is not None), default=None),
            "pd_ratio_variation": variation([x for x in pd if x is not None]),
            "work_variation": variation([float(r["issued"]) for r in w]),
            "splits": splits,
            "switches": (p.metrics.get("switches") or {}).get("count"),
            **planner_holds(p.metrics),
            "mix": mix(w),
        })
    return rows


def planner_holds(metrics: Mapping[str, Any]) -> dict[str, int]:
    """`planner_holds`: decisions of our planner that weighed the candidates and stayed; `kv_refused_moves`: candidate
    moves the KV check refused over all its decisions (holds and switches), from the run's decision records."""
    holds = list(metrics.get("planner_hold_decisions") or [])
    decisions = holds + list(metrics.get("planner_switch_decisions") or [])
    refused = sum(1 for d in decisions for c in d.get("candidates") or [] if c.get("verdict") == "prefill_kv_short")
    return {"planner_holds": len(holds), "kv_refused_moves": refused}


def mix(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """`{"workload", "first", "last"}`: the share of requests issued by the first workload label (sorted) in the
    first and last third of `rows` (buckets), None without per-workload counts or requests."""
    labels = sorted({w for r in rows for w in r.get("issued_by_workload") or {}})
    third = len(rows) // 3
    if not labels or third == 0:
        return None
    label = labels[0]

    def share(part: Sequence[Mapping[str, Any]]) -> float | None:
        counts = [r.get("issued_by_workload") or {} for r in part]
        return _ratio(sum(c.get(label, 0) for c in counts), sum(sum(c.values()) for c in counts))

    return {"workload": label, "first": share(rows[:third]), "last": share(rows[-third:])}


def _mix_text(m: Mapping[str, Any] | None) -> str:
    if m is None:
        return "-"
    return f"{m['workload']} {_f(_pct(m['first']), 0, ' %')} → {_f(_pct(m['last']), 0, ' %')}"


COARSE = 4
"""The fleet's aggregate PD ratio variation is also reported over buckets this many times as wide."""


def _pd_series(windows: Sequence[Sequence[Mapping[str, Any]]], n: int, group: int = 1) -> list[float | None]:
    """The aggregate PD ratio over groups of `group` consecutive buckets (whole groups only)."""
    return [_ratio(sum(w[i]["uncached_tokens"] for w in windows for i in range(g, g + group)),
                   sum(w[i]["output_tokens"] for w in windows for i in range(g, g + group)))
            for g in range(0, n - group + 1, group)]


def _windows(result: FleetResult) -> tuple[list[list[Mapping[str, Any]]], int]:
    """Each partition's buckets inside the fleet's scored window, and how many every partition has."""
    start, end = _window(result)
    windows = [_in_window(p.series, start, end) for p in result.partitions]
    return windows, min((len(w) for w in windows), default=0)


def fleet_summary(result: FleetResult) -> dict[str, Any]:
    """The fleet's aggregate PD ratio per bucket and its variation, total throughput and queueing."""
    start, end = _window(result)
    windows, n = _windows(result)
    pd = _pd_series(windows, n)
    coarse = _pd_series(windows, n, COARSE)
    width = windows[0][0]["t1"] - windows[0][0]["t0"] if n else None
    work = [float(sum(w[i]["issued"] for w in windows)) for i in range(n)]
    q = sum(r["queue_s_sum"] for w in windows for r in w)
    k = sum(r["prefills"] for w in windows for r in w)
    return {
        "window": [start, end],
        "partitions": len(result.partitions),
        "gpus_nodes": sum(p.nodes for p in result.partitions),
        "throughput_rps": sum(p.metrics["overall"].get("throughput_rps") or 0.0 for p in result.partitions),
        "requests": sum(p.requests for p in result.partitions),
        "queue_mean_s": _ratio(q, k),
        "pd_ratio_series": pd,
        "pd_ratio_variation": variation([x for x in pd if x is not None]),
        "pd_ratio_variation_coarse": {
            "bucket_s": None if width is None else width * COARSE,
            "variation": variation([x for x in coarse if x is not None]) if len(coarse) >= 2 else None,
        },
        "work_variation": variation(work),
        "wall_s": result.wall_s,
        "partition_wall_s_sum": sum(p.wall_s for p in result.partitions),
    }


def shifting(result: FleetResult) -> list[str]:
    """The partitions whose PD ratio varies more than twice as much as the fleet's, over buckets `COARSE` times as
    wide (over the results' own buckets where the window holds fewer than two wide ones): the local shifts the
    figure marks. Wide buckets keep a steady partition's noise (a few large prompts in one bucket) from marking it."""
    windows, n = _windows(result)
    group = COARSE if n >= 2 * COARSE else 1

    def spread(ws: Sequence[Sequence[Mapping[str, Any]]]) -> float:
        return variation([x for x in _pd_series(ws, n, group) if x is not None]) or 0.0

    fleet = spread(windows)
    return [short_name(p.key) for p, w in zip(result.partitions, windows, strict=True) if spread([w]) > 2 * fleet]


def compare(adaptive: FleetResult, static: FleetResult) -> dict[str, Any]:
    """Throughput of adaptive over static per partition and for the fleet (same partitions, same order)."""
    rows = []
    for a, s in zip(adaptive.partitions, static.partitions, strict=True):
        xa, xs = a.metrics["overall"].get("throughput_rps"), s.metrics["overall"].get("throughput_rps")
        rows.append({"partition": short_name(a.key), "adaptive_rps": xa, "static_rps": xs,
                     "ratio": None if not xa or not xs else xa / xs})
    fa, fs = fleet_summary(adaptive)["throughput_rps"], fleet_summary(static)["throughput_rps"]
    return {"partitions": rows, "fleet": {"adaptive_rps": fa, "static_rps": fs, "ratio": _ratio(fa, fs)}}


def _f(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def render_markdown(adaptive: FleetResult, static: FleetResult | None = None) -> str:
    """The tables of docs/evaluation.md's fleet section."""
    lines: list[str] = []
    fa = fleet_summary(adaptive)
    lines += ["| run | requests | fleet req/s | aggregate PD ratio variation (over buckets x" + str(COARSE) + ") | "
              "aggregate work variation | mean prefill queue s | partitions' wall s (sum) |",
              "|---|---|---|---|---|---|---|"]
    runs = [("adaptive", adaptive, fa)] + ([("static", static, fleet_summary(static))] if static else [])
    for name, _res, f in runs:
        coarse = _f(_pct(f["pd_ratio_variation_coarse"]["variation"]), 1, " %")
        lines.append(f"| {name} | {f['requests']:,} | {_f(f['throughput_rps'])} | "
                     f"{_f(_pct(f['pd_ratio_variation']), 1, ' %')} ({coarse}) "
                     f"| {_f(_pct(f['work_variation']), 1, ' %')} | {_f(f['queue_mean_s'])} | {f['partition_wall_s_sum']:,.0f} |")
    lines.append("")
    header = ("| partition | agents | users | mix (adaptive) | PD ratio variation | work variation | queue vs fleet (static) | "
              "peak (static) | queue vs fleet (adaptive) | peak (adaptive) | splits (adaptive) | holds (KV-refused moves) | "
              "req/s static | req/s adaptive | adaptive / static |")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    ra = partition_rows(adaptive)
    rs = partition_rows(static) if static else [None] * len(ra)
    cmp_rows = compare(adaptive, static)["partitions"] if static else [None] * len(ra)
    for a, s, c in zip(ra, rs, cmp_rows, strict=True):
        base = s or a
        lines.append(
            f"| {a['partition']} | {a['agents']} | {a['users']} | {_mix_text(a['mix'])} | "
            f"{_f(_pct(base['pd_ratio_variation']), 1, ' %')} | "
            f"{_f(_pct(base['work_variation']), 1, ' %')} | {_f(_get(s, 'queue_vs_fleet'))} | "
            f"{_f(_get(s, 'queue_peak_vs_fleet'))} | {_f(a['queue_vs_fleet'])} | {_f(a['queue_peak_vs_fleet'])} | "
            f"{' → '.join(a['splits'])} | {a['planner_holds']} ({a['kv_refused_moves']}) | "
            f"{_f(_get(c, 'static_rps'))} | {_f(a['throughput_rps'])} | "
            f"{_f(_get(c, 'ratio'))} |")
    if static:
        fleet = compare(adaptive, static)["fleet"]
        lines.append(f"| **fleet** | | | | | | 1.00 | | 1.00 | | | | {_f(fleet['static_rps'])} | {_f(fleet['adaptive_rps'])} "
                     f"| **{_f(fleet['ratio'])}** |")
    return "\n".join(lines)


def stored_rows(runs: Sequence[tuple[str, Sequence[PartitionResult | None]]]) -> list[dict[str, Any]]:
    """Per partition, what a partly done fleet run has stored: each run's (`(name, results)`, results in partition
    order, None where not stored) throughput, requests, switches and splits, and adaptive / static where the first
    two runs both have it. The fleet's figures need every partition; these do not."""
    if not runs:
        return []
    out: list[dict[str, Any]] = []
    for i in range(len(runs[0][1])):
        row: dict[str, Any] = {"partition": None}
        for name, results in runs:
            r = results[i]
            if r is not None:
                row["partition"] = short_name(r.key)
            row[name] = None if r is None else {
                "throughput_rps": r.metrics["overall"].get("throughput_rps"), "requests": r.requests,
                "sim_end_s": r.sim_end_s, "wall_s": r.wall_s,
                "switches": (r.metrics.get("switches") or {}).get("count"),
                "splits": _bucket_splits(r),
                "mix": mix(_scored(r)),
                "skipped_agents": (r.metrics.get("simulation") or {}).get("skipped_agents"),
                **planner_holds(r.metrics),
            }
        if len(runs) > 1:
            a, b = row[runs[0][0]], row[runs[1][0]]
            row["ratio"] = None if a is None or b is None else _ratio(a["throughput_rps"] or 0.0, b["throughput_rps"] or 0.0)
        out.append(row)
    return out


def _scored(r: PartitionResult) -> list[Mapping[str, Any]]:
    """The buckets of `r`'s series wholly inside its scored window."""
    return _in_window(r.series, *_run_window(r))


def _bucket_splits(r: PartitionResult) -> list[str]:
    """The split at each bucket's end over the whole run, repeats merged (`+nC`: nodes still collocated)."""
    out: list[str] = []
    for row in r.series:
        if row["prefill_nodes"] is None:
            continue
        label = f"{row['prefill_nodes']}P{row['decode_nodes']}D"
        if row.get("collocated_nodes"):
            label += f"+{row['collocated_nodes']}C"
        if not out or out[-1] != label:
            out.append(label)
    return out


def render_stored(runs: Sequence[tuple[str, Sequence[PartitionResult | None]]], keys: Sequence[str]) -> str:
    """`stored_rows` as a markdown table, then how many partition runs are stored and which are missing."""
    rows = stored_rows(runs)
    names = [name for name, _ in runs]
    header = "| partition | " + " | ".join(f"{n}: req/s | {n}: requests | {n}: mix | {n}: splits" for n in names)
    header += " | adaptive / static |" if len(names) > 1 else " |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    missing: list[str] = []
    for key, row in zip(keys, rows, strict=True):
        cells = [short_name(key)]
        for n in names:
            r = row[n]
            if r is None:
                missing.append(f"{short_name(key)} ({n})")
                cells += ["-", "-", "-", "not stored"]
            else:
                holds = f" (holds {r['planner_holds']}, KV-refused moves {r['kv_refused_moves']})" if r["planner_holds"] else ""
                cells += [_f(r["throughput_rps"]), f"{r['requests']:,}", _mix_text(r["mix"]), " → ".join(r["splits"]) + holds]
        if len(names) > 1:
            cells.append(_f(row["ratio"]))
        lines.append("| " + " | ".join(cells) + " |")
    total = len(rows) * len(names)
    lines += ["", f"{total - len(missing)} of {total} partition runs stored"
              + (f"; not yet: {', '.join(missing)}" if missing else " (the whole fleet: run without --stored-only "
                                                                     "for its figures)")]
    return "\n".join(lines)


def _get(row: Mapping[str, Any] | None, key: str) -> float | None:
    return None if row is None else row.get(key)


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def write_figure(adaptive: FleetResult, static: FleetResult | None, path: str | Path,
                 highlight: Sequence[str] = ()) -> Path:
    """A PNG like figure D.2: split over time, PD demand ratio, queueing relative to the fleet, throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, end = _window(adaptive)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    names = [short_name(p.key) for p in adaptive.partitions]
    ticks = [n.rsplit("-", 1)[-1] for n in names]  # axis labels: the last part of the name (p0, p1, ...)
    marked = set(highlight)

    def color(name: str) -> str:
        return "tab:red" if name in marked else "0.6"

    ax = axes[0][0]
    for p, name in zip(adaptive.partitions, names, strict=True):
        w = _in_window(p.series, 0.0, float("inf"))
        xs = [r["t1"] / 60 for r in w if r["prefill_nodes"] is not None]
        ys = [r["prefill_nodes"] / max(1, r["prefill_nodes"] + r["decode_nodes"] + (r["collocated_nodes"] or 0))
              for r in w if r["prefill_nodes"] is not None]
        ax.step(xs, ys, where="post", color=color(name), lw=2 if name in marked else 1,
                label=name.rsplit("-", 1)[-1])
    ax.axvspan(0, start / 60, color="0.92")
    ax.set(title="(a) prefill share of each partition's nodes (adaptive)", xlabel="minute", ylabel="prefill nodes / nodes")
    ax.legend(fontsize=7, ncol=4)

    ax = axes[0][1]
    fleet = fleet_summary(adaptive)
    for p, name in zip(adaptive.partitions, names, strict=True):
        w = _in_window(p.series, start, end)
        ratios = [_ratio(r["uncached_tokens"], r["output_tokens"]) for r in w]
        vals = [x for x in ratios if x is not None]
        mean = sum(vals) / len(vals) if vals else 1.0
        ax.plot([r["t1"] / 60 for r in w], [None if x is None else x / mean for x in ratios], color=color(name),
                lw=2 if name in marked else 1)
    agg = fleet["pd_ratio_series"]
    vals = [x for x in agg if x is not None]
    mean = sum(vals) / len(vals) if vals else 1.0
    w0 = _in_window(adaptive.partitions[0].series, start, end)
    ax.plot([r["t1"] / 60 for r in w0][: len(agg)], [None if x is None else x / mean for x in agg], color="k", lw=3,
            label="fleet aggregate")
    ax.set(title="(b) PD demand ratio (uncached / output tokens), relative to its mean", xlabel="minute")
    ax.legend(fontsize=8)

    ax = axes[1][0]
    ra = partition_rows(adaptive)
    xs = list(range(len(names)))
    if static is not None:
        rs = partition_rows(static)
        ax.bar([x - 0.2 for x in xs], [r["queue_vs_fleet"] or 0 for r in rs], width=0.4, label="static", color="0.5")
    ax.bar([x + 0.2 for x in xs], [r["queue_vs_fleet"] or 0 for r in ra], width=0.4, label="adaptive", color="tab:blue")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(xs, ticks)
    ax.set(title="(c) mean prefill queueing / fleet average", ylabel="ratio")
    ax.legend(fontsize=8)

    ax = axes[1][1]
    if static is not None:
        c = compare(adaptive, static)
        vals = [r["ratio"] or 0 for r in c["partitions"]] + [c["fleet"]["ratio"] or 0]
        ax.bar(list(range(len(vals))), vals, color=[color(n) for n in names] + ["k"])
        ax.set_xticks(list(range(len(vals))), [*ticks, "fleet"])
        ax.axhline(1.0, color="k", lw=0.8)
    ax.set(title="(d) throughput, adaptive planners / static split", ylabel="ratio")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
