"""PNG figures of a group of cached evaluation runs: throughput over time, the split over time, and scored
throughput, latency and lost KV reuse per system.

Boundary: reads cached run records (their `series`, `split_timeline` and scored figures) and writes PNG files;
computes nothing the records do not hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402

from evolving_infra.evaluation.protocol import figures  # noqa: E402


def _name(record: Mapping[str, Any]) -> str:
    spec = record["spec"]
    return f"{spec.get('label') or spec['system']} ({spec['split']})"


def plot_group(records: Sequence[Mapping[str, Any]], out: Path, stem: str, window_s: float = 600.0) -> list[Path]:
    """Three PNGs for one group of runs (same workload and window): `{stem}-throughput.png` (requests finished
    per `window_s`, per run), `{stem}-split.png` (prefill nodes over time) and `{stem}-figures.png` (X, mean E2E,
    P95 TTFT and lost KV reuse per run)."""
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    runs = sorted(records, key=_name)
    if not runs:
        return paths
    warmup = float(runs[0]["spec"]["warmup_s"])

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
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    paths.append(out / f"{stem}-throughput.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3.0))
    for r in runs:
        timeline = r["metrics"].get("split_timeline") or []
        pts = [(float(p["at"]), int(str(p["split"]).split("P")[0])) for p in timeline if "P" in str(p["split"])]
        if pts:
            ax.step([t for t, _ in pts], [n for _, n in pts], where="post", label=_name(r))
    ax.axvspan(0, warmup, color="0.9")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("prefill nodes")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    paths.append(out / f"{stem}-split.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    names = [_name(r) for r in runs]
    figs = [figures(r) for r in runs]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.4))
    for ax, (key, title, scale) in zip(axes, (("x", "X req/s", 1.0), ("e2e", "mean E2E s", 1.0),
                                             ("ttft_p95", "P95 TTFT s", 1.0), ("lost", "lost KV reuse %", 100.0)),
                                       strict=True):  # fmt: skip
        ax.barh(names, [(f[key] or 0.0) * scale for f in figs])
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="y", labelsize=6)
        if ax is not axes[0]:
            ax.set_yticklabels([])
    fig.tight_layout()
    paths.append(out / f"{stem}-figures.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
