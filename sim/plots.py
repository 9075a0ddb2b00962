"""PNG plots of a simulation run: the split over time, latency CDFs, and KV reuse lost over time.

Boundary: reads a finished run's records (and the trace's ideal hit tokens per request) and writes PNG files;
it computes nothing the metrics do not already define (hit rate h = cached / prompt tokens, lost reuse
1 - h/h* per one-minute bucket of issue times).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from evolving_infra.sim.records import RequestRecord, SplitRecord  # noqa: E402

BUCKET_S = 60.0


def plot_split(splits: Sequence[SplitRecord], start: float, end: float, path: Path, nodes: int) -> Path:
    """Prefill nodes over time as a step line (decode = nodes - prefill), warmup shaded."""
    ordered = sorted(splits, key=lambda s: s.at)
    fig, ax = plt.subplots(figsize=(8, 3.2))
    if ordered:
        times = [s.at / 60 for s in ordered] + [max(end, ordered[-1].at) / 60]
        prefill = [s.prefill for s in ordered] + [ordered[-1].prefill]
        ax.step(times, prefill, where="post", color="tab:red", label="prefill nodes")
        ax.step(times, [s.prefill + s.decode for s in ordered] + [ordered[-1].prefill + ordered[-1].decode],
                where="post", color="grey", linestyle=":", label="serving nodes")
    if start > 0:
        ax.axvspan(0, start / 60, color="0.9", label="warmup (not scored)")
    ax.set_ylim(0, nodes + 0.5)
    ax.set_yticks(range(0, nodes + 1))
    ax.set_xlabel("time (min)")
    ax.set_ylabel(f"prefill nodes of {nodes}")
    ax.set_title("PD split over time")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency_cdf(records: Sequence[RequestRecord], path: Path) -> Path:
    """Empirical CDFs of TTFT and end-to-end latency of the scored requests."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, values, color in (
        ("TTFT", [r.first_token - (r.since if r.since is not None else r.issued) for r in records], "tab:blue"),
        ("E2E", [r.finish - (r.since if r.since is not None else r.issued) for r in records], "tab:orange"),
    ):
        if values:
            xs = np.sort(np.asarray(values))
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label, color=color)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("latency CDF (scored requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_kv_lost(records: Sequence[RequestRecord], ideal: Mapping[str, int], path: Path) -> Path:
    """Per minute of issue time: KV hit rate h, ideal h*, and lost reuse 1 - h/h* (token weighted)."""
    cached: dict[int, int] = defaultdict(int)
    prompt: dict[int, int] = defaultdict(int)
    best: dict[int, int] = defaultdict(int)
    for r in records:
        b = int(r.issued // BUCKET_S)
        cached[b] += r.cached_tokens
        prompt[b] += r.prompt_tokens
        best[b] += ideal.get(r.request_id, 0)
    buckets = sorted(b for b in prompt if prompt[b] > 0)
    minutes = [b * BUCKET_S / 60 for b in buckets]
    h = [cached[b] / prompt[b] for b in buckets]
    h_star = [best[b] / prompt[b] for b in buckets]
    lost = [1 - hi / hs if hs > 0 else 0.0 for hi, hs in zip(h, h_star, strict=True)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.8), sharex=True)
    top.plot(minutes, h, label="KV hit rate h", color="tab:green")
    top.plot(minutes, h_star, label="ideal h* (unlimited shared cache)", color="black", linestyle="--")
    top.set_ylabel("hit rate")
    top.legend(fontsize=8)
    bottom.bar(minutes, [100 * x for x in lost], width=0.8, color="tab:red")
    bottom.set_ylabel("lost reuse (%)")
    bottom.set_xlabel("issue time (min)")
    top.set_title("KV reuse per minute")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(
    records: Sequence[RequestRecord],
    splits: Sequence[SplitRecord],
    ideal: Mapping[str, int],
    window: tuple[float, float],
    nodes: int,
    out_dir: str | Path,
) -> dict[str, Path]:
    """Write split_over_time.png, latency_cdf.png and kv_lost.png into `out_dir`; returns the paths."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    start, end = window
    scored = [r for r in records if start <= r.issued < end]
    return {
        "split plot": plot_split(splits, start, end, folder / "split_over_time.png", nodes),
        "latency plot": plot_latency_cdf(scored, folder / "latency_cdf.png"),
        "KV plot": plot_kv_lost(records, ideal, folder / "kv_lost.png"),
    }
