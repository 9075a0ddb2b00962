"""The paper's evaluation protocol as run matrices, and its tables with seeds (mean and 95 % interval).

Matrices (`protocol_matrix(name, ...)`; every run `warmup_s` + `duration_s`, the paper's 1800 + 3600 s by default,
for each seed):
- `stationary`: CC 90/108/126, Putnam 224, OSWorld 128 (tables C.1-C.3, D.1): `evolving`, `dynamo` and `arrow`
  from 6P3D (the paper's start split for the planners), `cache-aware` with and without the shared pool at the
  paper's best static split (table D.1), and the best static split searched (`search`).
- `search`: `best-static` at every split 1P8D..8P1D on each stationary workload; the tables show the split with
  the highest mean scored throughput beside table D.1's.
- `shift`: section 6.3's composition (Kimi K2.6; Putnam 288, then 144 Putnam + 72 OSWorld, then 144 OSWorld, one
  period each of `duration_s` after the warmup, replayed open loop from the periods' arrival times): `evolving`
  and `dynamo` from 6P3D, `best-static` at every split (the searched best static and the per-window oracle).
- `open-loop`: appendix D.3, CC agents arriving at 0.5..1.5 per minute (at most 258 active): `evolving` from
  4P5D, `best-static` at 4P5D, `dynamo` from 6P3D; the highest rate each sustains.
- `ablations`: section 6.4 on CC 126 at 4P5D: `evolving` with each component off in turn (shared pool, TTFT
  routing, count-aware eviction, online adaptation, async fetch) next to `best-static` at 4P5D.
- `ablations-fixed`: the same at a fixed 4P5D split: `evolving` without online adaptation, and without it and each
  other component in turn (the planner's switches, which differ from run to run, no longer mix into a
  component's effect); not part of `protocol` (the paper ran its ablations with the planner on).
- `thunderagent`: appendix D.5 on CC 126 at 4P5D: `cache-aware` (SGLang engines), `thunderagent`, `evolving`
  without online adaptation.
- `protocol`: all of the above.

Boundary: run specifications and pure rendering of cached records; `evolving_infra.cli.evaluate` runs them.
"""

from __future__ import annotations

import re

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from evolving_infra.evaluation.search import all_splits, best_split, sustained_rate, sustains, window_oracle
from evolving_infra.evaluation.stats import mean_interval
from evolving_infra.evaluation.tables import paper_figure
from evolving_infra.router.planner.split import parse_split

NODES = 9
PLANNER_START = "6P3D"
"""The paper starts Dynamo, Arrow and ours from 6P3D (sections 3 and 6.1)."""
STATIONARY = (("cc", 90), ("cc", 108), ("cc", 126), ("putnam", 224), ("osworld", 128))
PAPER_OPEN_LOOP_RATES = (0.5, 0.75, 1.0, 1.25, 1.5)
"""Appendix D.3's arrival rates (agents per minute)."""
OPEN_LOOP_RATES = (*PAPER_OPEN_LOOP_RATES, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0)
"""D.3's rates and beyond: the generated CC agents are shorter-lived than the paper's traced ones (at 1 agent/min
about 45 are active against the paper's cap of 258, and the cluster serves about 40 % of what it serves closed
loop at 126 agents; docs/evaluation.md), so at the paper's rates no system reaches its limit; the sweep goes on
until the cap binds (about 4.5/min)."""
OPEN_LOOP_CAP = 258
ABLATIONS: dict[str, tuple[tuple[str, Any], ...]] = {
    "evolving": (),
    "evolving -pool": (("shared_pool", False),),
    "evolving -ttft routing": (("prefill_routing", "cache-aware"),),
    "evolving -count eviction": (("eviction", "lru"),),
    "evolving -adaptation": (("planner", "static"),),
    "evolving -async fetch": (("data_plane", "hicache-loadback"),),
}
"""Section 6.4: each component of ours off in turn (SimConfig overrides of the `evolving` preset); the `ablations`
matrix also starts ours from 3P6D, 5P4D and 6P3D (figure 8a: sensitivity to the initial split)."""
FIXED = ("planner", "static")
ABLATIONS_FIXED: dict[str, tuple[tuple[str, Any], ...]] = {
    "evolving -adaptation" if label == "evolving" else f"evolving -adaptation {label.removeprefix('evolving ')}": (FIXED, *sim)
    for label, sim in ABLATIONS.items()
    if sim != (FIXED,)
}
"""Section 6.4 at a fixed split: ours without online adaptation, and with each other component off in turn as
well. With the planner on, which switches it makes (and when) differs between runs more than a component's effect
(docs/evaluation.md, "Section 6.4, seeds 1 and 2"); at the fixed split only the component differs."""
PROTOCOL_MATRICES = ("stationary", "search", "shift", "open-loop", "ablations", "ablations-fixed", "thunderagent",
                     "protocol")  # fmt: skip


def protocol_matrix(name: str, make: Callable[..., Any], best: Mapping[str, str], warmup_s: float,
                    duration_s: float, seeds: Sequence[int]) -> list[Any]:  # fmt: skip
    """The run specifications of matrix `name`; `make(**fields)` builds one (the runner's `RunSpec`), `best` is
    table D.1's split per workload."""
    out: list[Any] = []

    def add(workload: str, agents: int, system: str, split: str, **extra: Any) -> None:
        for seed in seeds:
            out.append(make(workload=workload, agents=agents, system=system, split=split, warmup_s=warmup_s,
                            duration_s=duration_s, seed=seed, **extra))  # fmt: skip

    if name in ("search", "stationary", "protocol"):
        for workload, agents in STATIONARY:
            for split in all_splits(NODES):
                add(workload, agents, "best-static", split)
    if name in ("stationary", "protocol"):
        for workload, agents in STATIONARY:
            for system in ("evolving", "dynamo", "arrow"):
                add(workload, agents, system, PLANNER_START)
            add(workload, agents, "cache-aware", best[workload])
            add(workload, agents, "cache-aware", best[workload], sim=(("shared_pool", False),),
                label="cache-aware -pool")  # fmt: skip
    if name in ("shift", "protocol"):
        for system in ("evolving", "dynamo"):
            add("shift", 0, system, PLANNER_START, period_s=duration_s)
        for split in all_splits(NODES):
            add("shift", 0, "best-static", split, period_s=duration_s)
    if name in ("open-loop", "protocol"):
        for rate in OPEN_LOOP_RATES:
            add("cc", OPEN_LOOP_CAP, "evolving", "4P5D", arrival_rate=rate)
            add("cc", OPEN_LOOP_CAP, "best-static", "4P5D", arrival_rate=rate)
            add("cc", OPEN_LOOP_CAP, "dynamo", PLANNER_START, arrival_rate=rate)
    if name in ("ablations", "protocol"):
        for label, sim in ABLATIONS.items():
            add("cc", 126, "evolving", "4P5D", sim=sim, label="" if label == "evolving" else label)
        add("cc", 126, "best-static", "4P5D")
        for split in ("3P6D", "5P4D", "6P3D"):  # figure 8a: ours from other initial splits
            add("cc", 126, "evolving", split)
    if name == "ablations-fixed":
        for label, sim in ABLATIONS_FIXED.items():
            add("cc", 126, "evolving", "4P5D", sim=sim, label=label)
        add("cc", 126, "best-static", "4P5D")
    if name in ("thunderagent", "protocol"):
        add("cc", 126, "cache-aware", "4P5D", sim=(("eviction", "lru"), ("data_plane", "hicache-loadback"),
                                                   ("shared_pool", False), ("decode_reservation", "at-routing")),
            label="cache-aware (SGLang engines)")  # fmt: skip
        add("cc", 126, "thunderagent", "4P5D")
        add("cc", 126, "evolving", "4P5D", sim=(("planner", "static"),), label="evolving -adaptation")
    if name not in PROTOCOL_MATRICES:
        raise ValueError(f"unknown protocol matrix {name!r}; known: {', '.join(PROTOCOL_MATRICES)}")
    seen: set[Any] = set()
    return [s for s in out if not (s in seen or seen.add(s))]  # type: ignore[func-returns-value]  # set.add is None


# ---- pure rendering ---------------------------------------------------------------------------------------
FIGURES = ("x", "e2e", "ttft", "ttft_p95", "lost")


def figures(record: Mapping[str, Any]) -> dict[str, float | None]:
    """The scored figures of one cached record."""
    o = record["metrics"]["overall"]
    return {"x": o.get("throughput_rps"), "e2e": o["e2e_s"].get("mean"), "ttft": o["ttft_s"].get("mean"),
            "ttft_p95": o["ttft_s"].get("p95"), "ttft_p50": o["ttft_s"].get("p50"), "e2e_p50": o["e2e_s"].get("p50"),
            "lost": o.get("lost_kv_reuse")}  # fmt: skip


def _group_key(spec: Mapping[str, Any]) -> tuple[Any, ...]:
    return (spec["workload"], spec["agents"], spec.get("arrival_rate"), spec.get("period_s"), spec["warmup_s"],
            spec["duration_s"])  # fmt: skip


def _variant(spec: Mapping[str, Any]) -> tuple[str, str]:
    return (spec.get("label") or spec["system"], spec["split"])


def seed_groups(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], dict[tuple[str, str], list[Mapping[str, Any]]]]:
    """Records by (workload, agents, rate, period, warmup, duration), then by (label, split): the seeds of one
    configuration together."""
    out: dict[tuple[Any, ...], dict[tuple[str, str], list[Mapping[str, Any]]]] = {}
    for r in records:
        spec = r["spec"]
        out.setdefault(_group_key(spec), {}).setdefault(_variant(spec), []).append(r)
    return out


def _cell(values: Sequence[float | None], scale: float = 1.0, digits: int = 2) -> str:
    have = [v * scale for v in values if v is not None]
    if not have:
        return "-"
    return mean_interval(have).text(digits)


def _mean(values: Sequence[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return sum(have) / len(have) if have else None


def searched(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> tuple[str, float] | None:
    """The best static split of one group: the `best-static` split with the highest mean throughput over seeds."""
    xs = {split: _mean([figures(r)["x"] for r in rs]) for (label, split), rs in variants.items()
          if label == "best-static"}  # fmt: skip
    return best_split(xs) if xs and any(v is not None for v in xs.values()) else None


def reference_split(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> str | None:
    """The initial split of the `evolving` runs the ratio column compares with: the paper's start (6P3D) where a
    group has it, else the one with the most runs (a group may hold ours from several splits, figure 8a)."""
    runs = {split: len(rs) for (label, split), rs in variants.items() if label == "evolving"}
    if not runs:
        return None
    return PLANNER_START if PLANNER_START in runs else max(sorted(runs), key=lambda split: runs[split])


def _paper(spec: Mapping[str, Any]) -> str:
    """The paper's X and mean E2E for a run's setting (`tables.paper_figure`), or "-" where it gives neither."""
    x, e2e = paper_figure(spec, "x"), paper_figure(spec, "e2e")
    if x is None and e2e is None:
        return "-"
    return f"{'-' if x is None else f'{x:.2f}'} / {'-' if e2e is None else f'{e2e:.1f}'}"


def render_protocol(records: Iterable[Mapping[str, Any]], paper_split: Mapping[str, str]) -> str:
    """One table per group: every variant's figures (mean ± 95 % interval over seeds), the best static split
    searched among the `best-static` runs (its split and table D.1's), ratios of ours to each row."""
    out: list[str] = []
    for key, variants in sorted(seed_groups(records).items(), key=lambda kv: tuple(str(k) for k in kv[0])):
        workload, agents, rate, period, warmup, duration = key
        best = searched(variants)
        what = f"{agents} agents" if rate is None else f"open loop {rate:g} agents/min (at most {agents} active)"
        if workload == "shift":
            what = f"three periods of {period:g} s"
        seeds = sorted({r["spec"]["seed"] for rs in variants.values() for r in rs})
        out.append(f"#### {workload}, {what} ({warmup:g} s warmup + {duration:g} s scored; seeds "
                   f"{', '.join(map(str, seeds))})")  # fmt: skip
        out.append("")
        ref = reference_split(variants)
        out.append("| system | split | seeds | X req/s | mean E2E s | mean TTFT s | P95 TTFT s | lost KV reuse % "
                   f"| paper X / E2E | ours{f' (from {ref})' if ref else ''} / this (X) |")  # fmt: skip
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        ours = _mean([figures(r)["x"] for r in variants.get(("evolving", ref or ""), ())])
        rows: list[tuple[str, str, list[Mapping[str, Any]]]] = []
        papers: list[str] = []
        for (label, split), rs in sorted(variants.items()):
            if label == "best-static":
                continue
            rows.append((label, split, list(rs)))
            papers.append(_paper(rs[0]["spec"]))
        if best is not None:
            split = best[0]
            paper = paper_split.get(workload)
            note = f"{split} (searched over {sum(1 for l, _ in variants if l == 'best-static')}; D.1: {paper or '-'})"
            rows.append(("best-static (searched)", note, list(variants[("best-static", split)])))
            spec = variants[("best-static", split)][0]["spec"]
            papers.append(_paper({**spec, "split": paper}) if paper else "-")  # D.1 gives SGLang's split's figures
        for (label, split, rs), paper_cell in zip(rows, papers, strict=True):
            f = [figures(r) for r in rs]
            x = _mean([v["x"] for v in f])
            ratio = f"{ours / x:.2f}" if ours is not None and x else "-"
            out.append(f"| {label} | {split} | {len(rs)} | {_cell([v['x'] for v in f])} "
                       f"| {_cell([v['e2e'] for v in f], digits=1)} | {_cell([v['ttft'] for v in f], digits=1)} "
                       f"| {_cell([v['ttft_p95'] for v in f], digits=1)} | {_cell([v['lost'] for v in f], 100.0)} "
                       f"| {paper_cell} | {ratio} |")  # fmt: skip
        if best is not None and len([1 for l, _ in variants if l == "best-static"]) > 1:
            xs = {s: _mean([figures(r)["x"] for r in rs]) for (l, s), rs in variants.items() if l == "best-static"}
            out.append("")
            out.append("Best static search (mean X req/s per split): " + ", ".join(
                f"{s} {v:.2f}" if v is not None else f"{s} -" for s, v in sorted(xs.items())))
        if workload == "shift":
            out += _period_table(variants, rows)
        oracle = _oracle(variants) if workload == "shift" else None
        if oracle is not None:
            static = max((sum(w.finished for w in window_oracle({k: v}, *_span(variants)).windows)
                          for k, v in _series(variants).items()), default=0) / (_span(variants)[2] - _span(variants)[1])
            out.append("")
            out.append(f"Per-window oracle (best static split per 600 s window; requests finished per second in the "
                       f"scored span): {oracle.throughput:.2f} req/s against {static:.2f} for the best single split "
                       f"by the same measure; windows {' '.join(oracle.splits())}")  # fmt: skip
        out.append("")
    sweep = render_sweep(records)
    if sweep:
        out += ["#### Open loop: the highest rate each system sustains (appendix D.3 targets)", "", sweep, ""]
    return "\n".join(out).rstrip() + "\n"


SHIFT_PERIODS = ("Putnam", "mixed", "OSWorld")
"""Section 6.3's scored periods in order (`cli.evaluate.shift_periods`)."""


def period_rates(record: Mapping[str, Any]) -> list[float] | None:
    """Requests finished per second in each scored period of a shift run (from its completion series), None
    without a series."""
    series = record.get("series")
    if not series:
        return None
    spec = record["spec"]
    bucket, start, length = float(series["bucket_s"]), float(spec["warmup_s"]), float(spec["duration_s"])
    done = series["finished"]
    out = []
    for k in range(len(SHIFT_PERIODS)):
        a, b = round((start + k * length) / bucket), round((start + (k + 1) * length) / bucket)
        out.append(sum(done[a:b]) / length)
    return out


_TARGET = re.compile(r"-> (\d+P\d+D)")
"""The target split in a switch decision's reason ("6P3D -> 5P4D")."""


def switch_path(record: Mapping[str, Any]) -> str:
    """The splits a run's planner switched to and when ("5P4D at 1500 s, ..."), from its recorded decisions."""
    decisions = record["metrics"].get("planner_switch_decisions") or []
    steps = []
    for d in decisions:
        target = _TARGET.search(d.get("reason", "")) if d.get("outcome") == "switch" else None
        if target is not None:
            steps.append(f"{target.group(1)} at {d['at']:g} s")
    return ", ".join(steps)


def _period_table(
    variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]], rows: Sequence[tuple[str, str, list[Mapping[str, Any]]]]
) -> list[str]:
    """Per row of a shift group: requests finished per second in each period (mean over seeds) and, for a planner
    that switched, the lowest seed's switches."""
    lines = ["", "Requests finished per second in each scored period (mean over seeds; switches: the lowest seed's):",
             "", "| system | split | " + " | ".join(SHIFT_PERIODS) + " | switches |",
             "|---|---|" + "---|" * len(SHIFT_PERIODS) + "---|"]  # fmt: skip
    statics = [(f"static {split}", split, list(rs)) for (label, split), rs in sorted(variants.items())
               if label == "best-static"]  # fmt: skip
    for label, split, rs in [*(r for r in rows if not r[0].startswith("best-static")), *statics]:
        rates = [p for p in (period_rates(r) for r in rs) if p is not None]
        if not rates:
            continue
        cells = " | ".join(f"{sum(p[k] for p in rates) / len(rates):.2f}" for k in range(len(SHIFT_PERIODS)))
        first = min(rs, key=lambda r: r["spec"]["seed"])
        lines.append(f"| {label} | {split} | {cells} | {switch_path(first)} |")
    return lines


def _best_static_runs(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> dict[str, Mapping[str, Any]]:
    """Per split, the `best-static` run with the lowest seed that kept its completion series."""
    out: dict[str, Mapping[str, Any]] = {}
    for (label, split), rs in variants.items():
        have = [r for r in rs if r.get("series")]
        if label == "best-static" and have:
            out[split] = min(have, key=lambda r: r["spec"]["seed"])
    return out


def _series(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> dict[str, list[int]]:
    return {split: list(r["series"]["finished"]) for split, r in _best_static_runs(variants).items()}


def _span(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> tuple[float, float, float]:
    """(bucket, start, end) of the scored span of a group's runs (the shift scores its three periods)."""
    r = next(iter(_best_static_runs(variants).values()))
    start = float(r["spec"]["warmup_s"])
    periods = 3 if r["spec"]["workload"] == "shift" else 1
    return float(r["series"]["bucket_s"]), start, start + float(r["spec"]["duration_s"]) * periods


def _oracle(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> Any:
    """The per-window oracle over the `best-static` runs of one group (the lowest seed's series)."""
    series = _series(variants)
    if len(series) < 2:
        return None
    return window_oracle(series, *_span(variants))


def admitted_fraction(record: Mapping[str, Any]) -> float | None:
    """The share of the window's arriving agents an open-loop run admitted (None: not recorded, i.e. cached
    before the simulator reported it, or no agent arrived)."""
    admission = record["metrics"].get("simulation", {}).get("admission")
    return None if admission is None else admission.get("admitted_fraction")


SWEEP_FIGURES = ("ttft_p50", "ttft_p95", "e2e_p50", "admitted", "prefill")
"""What the sweep shows per system and rate: D.3's three latency figures, the admitted share and the mean number
of prefill nodes."""


def sweep_runs(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[float, list[dict[str, float | None]]]]:
    """Open-loop runs by system (label) and arrival rate: each run's figures, admitted share and mean prefill
    nodes (closed-loop runs are left out)."""
    runs: dict[str, dict[float, list[dict[str, float | None]]]] = {}
    for r in records:
        spec = r["spec"]
        if spec.get("arrival_rate") is None:
            continue
        row = {**figures(r), "admitted": admitted_fraction(r), "prefill": mean_prefill_nodes(r)}
        runs.setdefault(spec.get("label") or spec["system"], {}).setdefault(spec["arrival_rate"], []).append(row)
    return runs


def sweep_groups(records: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], list[Mapping[str, Any]]]:
    """Open-loop runs by (workload, agents, warmup, duration): the runs of one sweep, every rate and seed
    together (closed-loop runs are left out)."""
    out: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in records:
        spec = r["spec"]
        if spec.get("arrival_rate") is not None:
            out.setdefault((spec["workload"], spec["agents"], spec["warmup_s"], spec["duration_s"]), []).append(r)
    return out


def sweep_means(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[float, dict[str, float | None]]]:
    """Per system and rate the seed means of `SWEEP_FIGURES` (None where no seed has the figure)."""
    return {system: {rate: {k: _mean([f[k] for f in fs]) for k in SWEEP_FIGURES} for rate, fs in sorted(by.items())}
            for system, by in sorted(sweep_runs(records).items())}  # fmt: skip


def render_sweep(records: Iterable[Mapping[str, Any]]) -> str:
    """Open-loop runs: per system and rate whether D.3's targets hold (seed means; TTFT P50 / P95 / E2E P50, and
    the admitted share where below 100 %), and the rate sustained (the highest with every lower rate of the
    table run and sustained: a rate not run, D.3's included, caps it)."""
    runs = sweep_runs(records)
    if not runs:
        return ""
    rates = sorted({*PAPER_OPEN_LOOP_RATES, *(rate for by_rate in runs.values() for rate in by_rate)})
    lines = ["| system | " + " | ".join(f"{rate:g}/min" for rate in rates) + " | sustained |",
             "|---|" + "---|" * (len(rates) + 1)]  # fmt: skip
    for system, by_rate in sorted(runs.items()):
        ok: dict[float, bool] = {}
        cells = []
        for rate in rates:
            fs = by_rate.get(rate)
            if not fs:
                ok[rate] = False  # not run: no rate above it counts as sustained
                cells.append("-")
                continue
            mean = {k: _mean([f[k] for f in fs]) for k in ("ttft_p50", "ttft_p95", "e2e_p50", "admitted")}
            ok[rate] = sustains(mean, admitted=mean["admitted"])
            admitted = "" if mean["admitted"] is None or mean["admitted"] >= 1.0 else f" ({mean['admitted']:.0%} in)"
            cells.append(("**" if ok[rate] else "") + f"{_f(mean['ttft_p50'])} / {_f(mean['ttft_p95'])} / "
                         f"{_f(mean['e2e_p50'])}{admitted}" + ("**" if ok[rate] else ""))  # fmt: skip
        held = sustained_rate(ok)
        lines.append(f"| {system} | " + " | ".join(cells) + f" | {'-' if held is None else f'{held:g}/min'} |")
    lines += ["", "Prefill nodes over the scored window (time-weighted mean; seed means):", "",
              "| system | " + " | ".join(f"{rate:g}/min" for rate in rates) + " |", "|---|" + "---|" * len(rates)]
    for system, by_rate in sorted(runs.items()):
        means = [_mean([f["prefill"] for f in by_rate.get(rate, ())]) for rate in rates]
        lines.append(f"| {system} | " + " | ".join(_f(v) for v in means) + " |")
    return "\n".join(lines)


def mean_prefill_nodes(record: Mapping[str, Any]) -> float | None:
    """The time-weighted mean number of prefill nodes over the scored window, from the run's split shares (the
    splits with every node disaggregated; None when the run has none)."""
    held = []
    for split, w in (record["metrics"].get("split_share") or {}).items():
        try:
            held.append((parse_split(split)[0], w))
        except ValueError:  # a split with collocated nodes (warmup): not counted
            continue
    total = sum(w for _, w in held)
    return sum(p * w for p, w in held) / total if total > 0 else None


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"
