"""PNG figures of a group of cached evaluation runs: throughput over time, the split over time (one seed, named
in the title), and scored throughput, latency and lost KV reuse per system (the mean over seeds with its 95 %
interval, beside the paper's figure where tables C.1, C.3 or D.1 give one); and the open-loop sweep (appendix
D.3): each system's latency figures, admitted share and prefill nodes against the arrival rate, with D.3's limits.

Boundary: reads cached run records (their `series`, `split_timeline` and scored figures) and writes PNG files;
computes nothing but means and intervals over seeds (`bars`, a pure function).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402

from evolving_infra.evaluation.protocol import figures, sweep_means  # noqa: E402
from evolving_infra.evaluation.search import D3_TARGETS  # noqa: E402
from evolving_infra.evaluation.stats import mean_interval  # noqa: E402
from evolving_infra.evaluation.tables import paper_figure  # noqa: E402

BAR_FIGURES = (("x", "X req/s", 1.0), ("e2e", "mean E2E s", 1.0), ("ttft_p95", "P95 TTFT s", 1.0),
               ("lost", "lost KV reuse %", 100.0))  # fmt: skip
"""The scored figures of the bar chart: (key of `protocol.figures`, title, scale)."""


@dataclass(frozen=True, slots=True)
class Bar:
    """One variant's bar for one figure: the mean over its seeds, the 95 % half-width (None below two seeds), the
    number of seeds, and the paper's figure for the same system and setting (None where the paper gives none)."""

    mean: float | None
    half: float | None
    seeds: int
    paper: float | None


def bars(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Bar]]:
    """Per variant name ("system (split)") and figure key: its `Bar` over the variant's seeds (runs without the
    figure are left out of its mean)."""
    out: dict[str, dict[str, Bar]] = {}
    for (label, split), runs in sorted(variants.items()):
        per: dict[str, Bar] = {}
        for key, _title, scale in BAR_FIGURES:
            have = [v * scale for v in (figures(r)[key] for r in runs) if v is not None]
            iv = mean_interval(have) if have else None
            paper = paper_figure(runs[0]["spec"], key)
            per[key] = Bar(iv.mean if iv else None, iv.half if iv else None, len(have),
                           paper * scale if paper is not None else None)  # fmt: skip
        out[_variant_name(label, split)] = per
    return out


def _variant_name(label: str, split: str) -> str:
    return f"{label} ({split})"


def _name(record: Mapping[str, Any]) -> str:
    spec = record["spec"]
    return _variant_name(spec.get("label") or spec["system"], spec["split"])


def _end(record: Mapping[str, Any]) -> float:
    """When the run's record ends: its completion series' span, else the warmup plus the scored window."""
    series = record.get("series")
    if series and series.get("finished"):
        return len(series["finished"]) * float(series["bucket_s"])
    spec = record["spec"]
    return float(spec["warmup_s"]) + float(spec["duration_s"])


def plot_group(variants: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]], out: Path, stem: str,
               window_s: float = 600.0) -> list[Path]:  # fmt: skip
    """Three PNGs for one group of runs (same workload and window; `variants` as `protocol.seed_groups` gives
    them): `{stem}-throughput.png` (requests finished per `window_s`) and `{stem}-split.png` (prefill nodes over
    time), each of every variant's lowest seed, and `{stem}-figures.png` (X, mean E2E, P95 TTFT and lost KV reuse
    per variant: mean over seeds, 95 % interval as error bars, the paper's figure as a black mark)."""
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    runs = sorted((min(rs, key=lambda r: r["spec"]["seed"]) for rs in variants.values() if rs), key=_name)
    if not runs:
        return paths
    warmup = float(runs[0]["spec"]["warmup_s"])
    seeds = sorted({int(r["spec"]["seed"]) for r in runs})
    one_seed = f"seed {seeds[0]}" if len(seeds) == 1 else "lowest seed per system"

    fig, ax = plt.subplots(figsize=(8, 3.4))
    for r in runs:
        s = r.get("series")
        if not s:
            continue
        per = max(1, round(window_s / float(s["bucket_s"])))
        counts = s["finished"]
        xs = [i * float(s["bucket_s"]) for i in range(0, len(counts), per)]
        ys = [sum(counts[i : i + per]) / window_s for i in range(0, len(counts), per)]
        ax.step(xs, ys, where="post", label=_name(r))
    ax.axvspan(0, warmup, color="0.9", label="warmup")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"finished req/s per {window_s:g} s")
    ax.set_title(f"{stem}: throughput over time ({one_seed})", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    paths.append(out / f"{stem}-throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.0))
    for i, r in enumerate(runs):
        nudge = 0.04 * (i - (len(runs) - 1) / 2)  # equal paths stay visible side by side
        timeline = r["metrics"].get("split_timeline") or []
        pts = [(float(p["at"]), int(str(p["split"]).split("P")[0])) for p in timeline if "P" in str(p["split"])]
        if pts:
            pts.append((max(pts[-1][0], _end(r)), pts[-1][1]))  # the last split holds to the end of the run
            ax.step([t for t, _ in pts], [n + nudge for _, n in pts], where="post", label=_name(r))
    ax.axvspan(0, warmup, color="0.9")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("prefill nodes")
    ax.set_title(f"{stem}: prefill nodes over time, systems that switch ({one_seed}; lines nudged apart)",
                 fontsize=9)  # fmt: skip
    if ax.get_legend_handles_labels()[0]:  # no run of the group switched: an empty plot, no legend
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    paths.append(out / f"{stem}-split.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    table = bars(variants)
    names = list(table)
    fig, axes = plt.subplots(1, len(BAR_FIGURES), figsize=(12, 3.6))
    for ax, (key, title, _scale) in zip(axes, BAR_FIGURES, strict=True):
        cells = [table[n][key] for n in names]
        ax.barh([f"{n}, {table[n]['x'].seeds} seed{'s' if table[n]['x'].seeds != 1 else ''}" for n in names],
                [c.mean or 0.0 for c in cells],
                xerr=[c.half or 0.0 for c in cells], error_kw={"elinewidth": 0.8, "capsize": 2})  # fmt: skip
        marks = [(c.paper, i) for i, c in enumerate(cells) if c.paper is not None]
        if marks:
            ax.plot([p for p, _ in marks], [i for _, i in marks], "kx", markersize=6, label="paper")
            ax.legend(fontsize=6, loc="lower right")
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="y", labelsize=6)
        if ax is not axes[0]:
            ax.set_yticklabels([])
    fig.suptitle(f"{stem}: mean over each system's seeds, 95 % interval (x: the paper's figure)", fontsize=9)
    fig.tight_layout()
    paths.append(out / f"{stem}-figures.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


SWEEP_PANELS = (("ttft_p50", "TTFT P50 s", D3_TARGETS["ttft_p50"]), ("ttft_p95", "TTFT P95 s", D3_TARGETS["ttft_p95"]),
                ("e2e_p50", "E2E P50 s", D3_TARGETS["e2e_p50"]), ("admitted", "agents admitted %", 90.0),
                ("prefill", "mean prefill nodes", None))  # fmt: skip
"""The sweep figure's panels: (key of `protocol.sweep_means`, title, D.3's limit drawn as a dashed line)."""


def plot_sweep(records: Sequence[Mapping[str, Any]], out: Path, stem: str) -> list[Path]:
    """`{stem}-sweep.png` for the open-loop runs among `records`: per system, each panel of `SWEEP_PANELS` against
    the arrival rate (seed means; the latency axes logarithmic). No file when no open-loop run is given."""
    means = sweep_means(records)
    if not means:
        return []
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(SWEEP_PANELS), figsize=(15, 3.4))
    for ax, (key, title, limit) in zip(axes, SWEEP_PANELS, strict=True):
        scale = 100.0 if key == "admitted" else 1.0
        for system, by_rate in means.items():
            pts = [(rate, value * scale) for rate, v in by_rate.items() if (value := v[key]) is not None]
            if pts:
                ax.plot([r for r, _ in pts], [v for _, v in pts], marker="o", markersize=3, label=system)
        if limit is not None:
            ax.axhline(limit, color="k", linestyle="--", linewidth=0.8)
        if key in ("ttft_p50", "ttft_p95", "e2e_p50"):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("agents / min", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{stem}: open-loop sweep (seed means; dashed: appendix D.3's limit)", fontsize=9)
    fig.tight_layout()
    path = out / f"{stem}-sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
