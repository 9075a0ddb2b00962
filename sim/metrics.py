"""Run metrics from the records of one run (`evolving_infra.sim.records`): per run and per workload label.

Definitions (also in docs/simulator.md):
- Scored requests: records with `window.start <= issued < window.end` (warmup excluded by issue time).
- Throughput: scored requests that finished by `window.end`, divided by the window length (req/s).
- TTFT = first_token - since; E2E = finish - since; TPOT = (finish - first_token) / (output_tokens - 1) per
  request with >= 2 output tokens. Means are over requests; percentiles use numpy's linear interpolation
  (`numpy.percentile(..., method="linear")`, the position (n - 1) q / 100 between order statistics).
- KV hit rate h = sum(cached prompt tokens) / sum(prompt tokens); lost KV reuse = 1 - h / h*, with h* the
  ideal hit rate of the same requests (unlimited cache shared by all nodes, no switches). h* comes in
  either as per-request ideal hit tokens (exact for every group) or as one rate (the whole run only).
- Prefill queueing: prefill_start - queued. Load balance (most loaded / average): requests are grouped into
  buckets of `balance_bucket_s` by prefill start; in each bucket, each prefill node that started a prefill
  gets its mean queueing time; the ratio is the largest of these over their mean; buckets where every wait
  is 0 are skipped; the figure is the mean ratio over buckets.
- Little's law (closed loop): N_branch = X (mean E2E + mean pause), pause being each request's `pause_s`.
- Switches decided in the window: count and mean time per switch. Split over time: the split in effect at
  the window start and each change in it, and the share of the window spent at each split. GPU idle
  fraction per phase: 1 - busy time / time served in that phase, over node spans clipped to the window.

Counts are carried and rates derived from them, never averages of averages.

Boundary: pure computation over records; writing files lives in `evolving_infra.sim.export`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evolving_infra.core.types import Phase
from evolving_infra.sim.records import (
    NodeSpan,
    RecordError,
    RequestRecord,
    ScoreWindow,
    SplitRecord,
    SwitchRecord,
)

IdealReuse = float | Mapping[str, int] | None
"""h* as one rate for the run, or ideal hit tokens per request id (e.g. from `traces.stats.ideal_hit_tokens`)."""


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean and percentiles of a sample (None when the sample is empty)."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None

    @staticmethod
    def of(values: Sequence[float]) -> Summary:
        if not values:
            return Summary(0, None, None, None)
        arr = np.asarray(values, dtype=float)
        p50, p95 = np.percentile(arr, [50.0, 95.0], method="linear")
        return Summary(len(values), float(arr.mean()), float(p50), float(p95))


@dataclass(frozen=True)
class GroupMetrics:
    """Metrics of one group of scored requests (the whole run or one workload label)."""

    requests: int
    finished_in_window: int
    throughput_rps: float
    ttft_s: Summary
    e2e_s: Summary
    tpot_s: Summary
    prefill_queue_s: Summary
    prompt_tokens: int
    cached_tokens: int
    fetched_tokens: int
    ideal_hit_tokens: int | None
    ideal_hit_rate: float | None
    mean_pause_s: float | None

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def kv_hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def lost_kv_reuse(self) -> float | None:
        """1 - h / h*; None when h* is unknown or 0."""
        h = self.kv_hit_rate
        if h is None or not self.ideal_hit_rate:
            return None
        return 1.0 - h / self.ideal_hit_rate

    @property
    def uncached_tokens_per_request(self) -> float | None:
        return self.uncached_tokens / self.requests if self.requests else None

    @property
    def little_n_branch(self) -> float | None:
        """N_branch implied by Little's law: X (mean E2E + mean pause)."""
        if self.e2e_s.mean is None or self.mean_pause_s is None:
            return None
        return self.throughput_rps * (self.e2e_s.mean + self.mean_pause_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "finished_in_window": self.finished_in_window,
            "throughput_rps": self.throughput_rps,
            "ttft_s": _summary_dict(self.ttft_s),
            "e2e_s": _summary_dict(self.e2e_s),
            "tpot_s": _summary_dict(self.tpot_s),
            "prefill_queue_s": _summary_dict(self.prefill_queue_s),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "fetched_tokens": self.fetched_tokens,
            "uncached_tokens": self.uncached_tokens,
            "uncached_tokens_per_request": self.uncached_tokens_per_request,
            "kv_hit_rate": self.kv_hit_rate,
            "ideal_hit_tokens": self.ideal_hit_tokens,
            "ideal_hit_rate": self.ideal_hit_rate,
            "lost_kv_reuse": self.lost_kv_reuse,
            "mean_pause_s": self.mean_pause_s,
            "little_n_branch": self.little_n_branch,
        }


@dataclass(frozen=True)
class RunMetrics:
    window_start: float
    window_end: float
    overall: GroupMetrics
    by_workload: Mapping[str, GroupMetrics]
    queue_balance_ratio: float | None
    """Most loaded / average prefill queueing time, per bucket, averaged over buckets."""
    queue_balance_buckets: int
    switches: int
    mean_switch_s: float | None
    split_timeline: tuple[tuple[float, str], ...]
    split_share: Mapping[str, float]
    idle_fraction: Mapping[Phase, float | None]
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _json_safe(
            {
                "window": {"start": self.window_start, "end": self.window_end},
                "overall": self.overall.to_dict(),
                "by_workload": {k: v.to_dict() for k, v in self.by_workload.items()},
                "prefill_queue_balance": {
                    "most_loaded_over_average": self.queue_balance_ratio,
                    "buckets": self.queue_balance_buckets,
                },
                "switches": {"count": self.switches, "mean_time_s": self.mean_switch_s},
                "split_timeline": [{"at": t, "split": s} for t, s in self.split_timeline],
                "split_share": dict(self.split_share),
                "gpu_idle_fraction": {p.value: v for p, v in self.idle_fraction.items()},
                **dict(self.extra),
            }
        )


def compute_run_metrics(
    records: Iterable[RequestRecord],
    window: ScoreWindow = ScoreWindow(),
    *,
    ideal: IdealReuse = None,
    switches: Iterable[SwitchRecord] = (),
    splits: Iterable[SplitRecord] = (),
    spans: Iterable[NodeSpan] = (),
    balance_bucket_s: float = 60.0,
    extra: Mapping[str, Any] | None = None,
) -> RunMetrics:
    """Score one run. `records` are finished requests; `extra` is copied into `to_dict` as is."""
    if not balance_bucket_s > 0:
        raise ValueError(f"balance_bucket_s must be > 0, got {balance_bucket_s!r}")
    if ideal is not None and not isinstance(ideal, Mapping) and not 0.0 <= float(ideal) <= 1.0:
        raise ValueError(f"ideal hit rate must lie in [0, 1], got {ideal!r}")
    all_records = list(records)
    start = window.start
    end = window.end
    if end is None:
        end = max((r.finish for r in all_records), default=start)
        end = max(end, start)
    scored = [r for r in all_records if start <= r.issued < end]
    duration = end - start
    overall = _group(scored, end, duration, ideal)
    by_label: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in scored:
        by_label[r.workload].append(r)
    per_ideal = ideal if isinstance(ideal, Mapping) else None
    by_workload = {w: _group(rs, end, duration, per_ideal) for w, rs in sorted(by_label.items())}
    ratio, buckets = queue_balance(scored, start, balance_bucket_s)
    in_window = [s for s in switches if start <= s.decided < end]
    timeline, share = split_over_time(list(splits), start, end)
    return RunMetrics(
        window_start=start,
        window_end=end,
        overall=overall,
        by_workload=by_workload,
        queue_balance_ratio=ratio,
        queue_balance_buckets=buckets,
        switches=len(in_window),
        mean_switch_s=(sum(s.duration_s for s in in_window) / len(in_window)) if in_window else None,
        split_timeline=timeline,
        split_share=share,
        idle_fraction=idle_fractions(spans, start, end),
        extra=dict(extra or {}),
    )


def _group(records: Sequence[RequestRecord], end: float, duration: float, ideal: IdealReuse) -> GroupMetrics:
    finished = sum(1 for r in records if r.finish <= end)
    prompt = sum(r.prompt_tokens for r in records)
    ideal_tokens: int | None = None
    ideal_rate: float | None = None
    if isinstance(ideal, Mapping):
        missing = [r.request_id for r in records if r.request_id not in ideal]
        if missing:
            raise RecordError(
                f"ideal hit tokens are missing for {len(missing)} scored request(s), e.g. {missing[0]!r}; "
                "give one count per request id"
            )
        ideal_tokens = sum(int(ideal[r.request_id]) for r in records)
        ideal_rate = ideal_tokens / prompt if prompt else None
    elif ideal is not None:
        ideal_rate = float(ideal)
    tpots = [t for t in (r.tpot_s for r in records) if t is not None]
    return GroupMetrics(
        requests=len(records),
        finished_in_window=finished,
        throughput_rps=finished / duration if duration > 0 else 0.0,
        ttft_s=Summary.of([r.ttft_s for r in records]),
        e2e_s=Summary.of([r.e2e_s for r in records]),
        tpot_s=Summary.of(tpots),
        prefill_queue_s=Summary.of([r.queue_s for r in records]),
        prompt_tokens=prompt,
        cached_tokens=sum(r.cached_tokens for r in records),
        fetched_tokens=sum(r.fetched_tokens for r in records),
        ideal_hit_tokens=ideal_tokens,
        ideal_hit_rate=ideal_rate,
        mean_pause_s=(sum(r.pause_s for r in records) / len(records)) if records else None,
    )


def queue_balance(
    records: Iterable[RequestRecord], start: float, bucket_s: float = 60.0
) -> tuple[float | None, int]:
    """(mean over buckets of max-node / mean-node queueing time, number of buckets that had a ratio)."""
    sums: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for r in records:
        bucket = math.floor((r.prefill_start - start) / bucket_s)
        acc = sums[bucket][r.prefill_node]
        acc[0] += r.queue_s
        acc[1] += 1
    ratios = []
    for bucket in sorted(sums):
        means = [total / n for total, n in sums[bucket].values()]
        average = sum(means) / len(means)
        if average > 0:
            ratios.append(max(means) / average)
    return (sum(ratios) / len(ratios) if ratios else None), len(ratios)


def split_over_time(
    splits: Sequence[SplitRecord], start: float, end: float
) -> tuple[tuple[tuple[float, str], ...], dict[str, float]]:
    """The split in effect from `start` and each later change before `end`, and each split's share of the
    time covered (time before the first known split is not covered)."""
    ordered = sorted(splits, key=lambda s: s.at)
    timeline: list[tuple[float, str]] = []
    for s in ordered:
        if s.at <= start:
            timeline = [(start, s.label)]
        elif s.at < end:
            if timeline and timeline[-1][1] == s.label:
                continue
            timeline.append((s.at, s.label))
    share: dict[str, float] = defaultdict(float)
    covered = 0.0
    for i, (t, label) in enumerate(timeline):
        t_next = timeline[i + 1][0] if i + 1 < len(timeline) else end
        share[label] += t_next - t
        covered += t_next - t
    fractions = {label: d / covered for label, d in share.items()} if covered > 0 else {}
    return tuple(timeline), fractions


def idle_fractions(spans: Iterable[NodeSpan], start: float, end: float) -> dict[Phase, float | None]:
    """Per phase: 1 - busy / served time over spans clipped to [start, end) (busy time pro rata)."""
    served = {p: 0.0 for p in Phase}
    busy = {p: 0.0 for p in Phase}
    for s in spans:
        overlap = min(s.end, end) - max(s.start, start)
        if overlap <= 0:
            continue
        length = s.end - s.start
        served[s.phase] += overlap
        busy[s.phase] += s.busy_s * (overlap / length) if length > 0 else 0.0
    return {p: (1.0 - busy[p] / served[p]) if served[p] > 0 else None for p in Phase}


def _summary_dict(s: Summary) -> dict[str, Any]:
    return {"count": s.count, "mean": s.mean, "p50": s.p50, "p95": s.p95}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
