"""One definition of the figures compared between our simulator and a peer's (Dynamo's replay), computed from
per-request records of either side, and the side-by-side comparison that flags differences over a tolerance.

Definitions (identical for every side, so a difference is never a difference of definitions):
- TTFT = first token - arrival; E2E = last token - arrival (seconds; mean, median, P95).
- throughput = completed requests / (last completion - first arrival), in requests per second; output
  throughput likewise in tokens per second.
- prefix reuse = prompt tokens not recomputed (found in GPU or host memory, or fetched) / prompt tokens.

Boundary: pure arithmetic on plain values; no simulator, no subprocess.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_TOLERANCE = 0.10
"""Relative difference above which a figure is flagged (and must be explained in docs/evaluation.md)."""


class PeerMetricsError(ValueError):
    """Records cannot be summarized (empty, or a value out of range)."""


@dataclass(frozen=True, slots=True)
class PeerRequest:
    """What both simulators report for one request (times in seconds from the start of the replay)."""

    request_id: str
    arrival_s: float
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    reused_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        for name in ("arrival_s", "ttft_s", "e2e_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise PeerMetricsError(f"request {self.request_id!r}: {name} must be finite and >= 0, got {value}")
        if self.ttft_s > self.e2e_s + 1e-9:
            raise PeerMetricsError(f"request {self.request_id!r}: ttft {self.ttft_s} exceeds e2e {self.e2e_s}")
        if not 0 <= self.reused_tokens <= self.prompt_tokens:
            raise PeerMetricsError(
                f"request {self.request_id!r}: reused tokens {self.reused_tokens} outside 0..{self.prompt_tokens}"
            )


class Figure(enum.Enum):
    """The compared figures, in table order."""

    TTFT_MEAN = "ttft_mean_s"
    TTFT_P50 = "ttft_p50_s"
    TTFT_P95 = "ttft_p95_s"
    E2E_MEAN = "e2e_mean_s"
    E2E_P95 = "e2e_p95_s"
    THROUGHPUT = "throughput_rps"
    OUTPUT_THROUGHPUT = "output_tok_s"
    PREFIX_REUSE = "prefix_reuse"


@dataclass(frozen=True)
class PeerMetrics:
    requests: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    e2e_mean_s: float
    e2e_p95_s: float
    throughput_rps: float
    output_tok_s: float
    prefix_reuse: float
    makespan_s: float

    def value(self, figure: Figure) -> float:
        return float(getattr(self, figure.value))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: Iterable[PeerRequest]) -> PeerMetrics:
    """The figures of `records` (see the module docstring)."""
    rs = list(records)
    if not rs:
        raise PeerMetricsError("no completed requests to summarize")
    ttft = np.array([r.ttft_s for r in rs])
    e2e = np.array([r.e2e_s for r in rs])
    start = min(r.arrival_s for r in rs)
    end = max(r.arrival_s + r.e2e_s for r in rs)
    span = end - start
    prompt = sum(r.prompt_tokens for r in rs)
    return PeerMetrics(
        requests=len(rs),
        ttft_mean_s=float(ttft.mean()),
        ttft_p50_s=float(np.percentile(ttft, 50)),
        ttft_p95_s=float(np.percentile(ttft, 95)),
        e2e_mean_s=float(e2e.mean()),
        e2e_p95_s=float(np.percentile(e2e, 95)),
        throughput_rps=len(rs) / span if span > 0 else math.inf,
        output_tok_s=sum(r.output_tokens for r in rs) / span if span > 0 else math.inf,
        prefix_reuse=sum(r.reused_tokens for r in rs) / prompt if prompt else 0.0,
        makespan_s=span,
    )


def relative_difference(value: float, reference: float) -> float | None:
    """(value - reference) / |reference|; None when the reference is 0 (and the value is not)."""
    if reference == 0:
        return 0.0 if value == 0 else None
    return (value - reference) / abs(reference)


@dataclass(frozen=True)
class ComparisonRow:
    """One figure of every side, and each side's difference from the reference side."""

    figure: Figure
    values: Mapping[str, float]
    differences: Mapping[str, float | None]
    flagged: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "figure": self.figure.value,
            "values": dict(self.values),
            "differences": dict(self.differences),
            "flagged": list(self.flagged),
        }


def compare(
    sides: Mapping[str, PeerMetrics], reference: str, tolerance: float = DEFAULT_TOLERANCE
) -> list[ComparisonRow]:
    """Rows of every `Figure`: each side's value and relative difference from `reference`; a side is flagged
    when |difference| > `tolerance` (or the difference is undefined)."""
    if reference not in sides:
        raise KeyError(f"reference side {reference!r} is not among {sorted(sides)}")
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    rows: list[ComparisonRow] = []
    ref = sides[reference]
    for figure in Figure:
        values = {name: m.value(figure) for name, m in sides.items()}
        diffs = {
            name: relative_difference(v, ref.value(figure)) for name, v in values.items() if name != reference
        }
        flagged = tuple(n for n, d in diffs.items() if d is None or abs(d) > tolerance)
        rows.append(ComparisonRow(figure, values, diffs, flagged))
    return rows


def render_markdown(rows: Sequence[ComparisonRow], reference: str) -> str:
    """A markdown table: one row per figure, one column per side, differences in parentheses, flags bold."""
    if not rows:
        return ""
    sides = list(rows[0].values)
    head = "| figure | " + " | ".join(sides) + " |\n|---|" + "---:|" * len(sides)
    lines = [head]
    for row in rows:
        cells = []
        for side in sides:
            value = row.values[side]
            text = f"{value:.3f}" if row.figure is Figure.PREFIX_REUSE else f"{value:,.2f}"
            if side != reference:
                diff = row.differences[side]
                note = "n/a" if diff is None else f"{diff:+.0%}"
                text += f" (**{note}**)" if side in row.flagged else f" ({note})"
            cells.append(text)
        lines.append(f"| {row.figure.value} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
