"""`evolving-infra local --against smg`: one workload, live, through our system, through our re-implementation of
SGLang's PD baseline and through the real SGLang gateway (`smg`), compared side by side.

The three runs share the trace, the replay mode, the node count, the seed, the speed-up and the engines' noise:

- **ours**: the run as configured (planner, routing, warmup, initial split);
- **cache-aware (ours)**: our router with the `static` planner and `cache-aware` prefill routing at a static split
  and no warmup, the re-implementation of the paper's best-static baseline that the real gateway judges;
- **smg (real)**: SGLang's gateway in PD mode with its own `cache_aware` prefill policy in front of the same node
  agents (`local.cluster`, `Gateway.SMG`), at the same static split.

Both static sides run at `split` (default: the run's initial split). Differences are relative to the real
gateway. "ours vs the real peer" (ours against smg) thus sits beside "ours vs our baseline" (ours against the
re-implementation), and the re-implementation's own difference from smg says how far the baseline can be trusted.

Boundary: the configurations of the extra runs and the comparison of their reports; running is `local.run`, the
reports are `local.report`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from evolving_infra.local.cluster import Gateway
from evolving_infra.local.run import LocalRunConfig
from evolving_infra.node_agent.service.sglang_http import ServerIdentity

__all__ = ["FIGURES", "Peer", "Side", "SideKey", "compare", "comparison_markdown", "format_value", "peer_sides"]


class Peer(str, Enum):
    """The real peers a local run can be put against."""

    SMG = "smg"


class SideKey(str, Enum):
    OURS = "ours"
    BASELINE = "cache-aware (ours)"
    SMG = "smg (real)"


@dataclass(frozen=True)
class Side:
    key: SideKey
    config: LocalRunConfig
    description: str


def peer_sides(config: LocalRunConfig, peer: Peer, *, prefill: int | None = None) -> list[Side]:
    """The extra runs beside `config` (module docstring): our cache-aware baseline, then the real peer, both at the
    static split with `prefill` prefill nodes (default: the run's initial split). The baseline is left out when
    `config` already is it."""
    if peer is not Peer.SMG:  # pragma: no cover - one peer today
        raise ValueError(f"unknown peer {peer!r}")
    cluster = config.cluster
    prefill = cluster.prefill if prefill is None else prefill
    if not 1 <= prefill <= cluster.nodes - 1:
        raise ValueError(f"the static split needs 1..{cluster.nodes - 1} prefill nodes of {cluster.nodes}, got {prefill}")
    static = dataclasses.replace(cluster, prefill=prefill, planner="static", routing="cache-aware", warmup_s=0.0,
                                 record_dir=None, planner_settings={}, routing_settings={})  # fmt: skip
    split = static.split

    def workdir(name: str) -> Path | None:
        return None if config.workdir is None else config.workdir / f"against-{name}"

    sides: list[Side] = []
    if not (cluster.planner == "static" and cluster.routing == "cache-aware" and cluster.prefill == prefill
            and cluster.gateway is Gateway.OURS and cluster.warmup_s == 0):  # fmt: skip
        sides.append(Side(SideKey.BASELINE, dataclasses.replace(config, cluster=static, workdir=workdir("baseline")),
                          f"our router, static {split}, cache-aware prefill routing (our re-implementation)"))  # fmt: skip
    smg_client = dataclasses.replace(config.client, text_prompts=True, finish_branches=False, model=ServerIdentity().model)
    sides.append(Side(SideKey.SMG, dataclasses.replace(config, cluster=dataclasses.replace(static, gateway=Gateway.SMG),
                                                       client=smg_client, workdir=workdir("smg")),
                      f"SGLang's gateway smg, PD mode, static {split}, its cache_aware prefill policy"))  # fmt: skip
    return sides


def _get(*path: str) -> Callable[[Mapping[str, Any]], float | None]:
    def read(report: Mapping[str, Any]) -> float | None:
        value: Any = report
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    return read


FIGURES: tuple[tuple[str, Callable[[Mapping[str, Any]], float | None]], ...] = (
    ("requests finished", _get("run", "finished")),
    ("requests failed", _get("run", "failed")),
    ("throughput (req/s, emulated)", _get("throughput", "requests_per_s")),
    ("TTFT mean (s)", _get("latency_s", "ttft", "mean")),
    ("TTFT P50 (s)", _get("latency_s", "ttft", "p50")),
    ("TTFT P95 (s)", _get("latency_s", "ttft", "p95")),
    ("E2E mean (s)", _get("latency_s", "e2e", "mean")),
    ("E2E P95 (s)", _get("latency_s", "e2e", "p95")),
    ("KV hit rate", _get("kv", "hit_rate")),
)
"""The figures compared: each read from a local run's `report.json` (None where the run has none)."""


def compare(reports: Mapping[SideKey, Mapping[str, Any]], descriptions: Mapping[SideKey, str],
            reference: SideKey = SideKey.SMG, tolerance: float = 0.10) -> dict[str, Any]:  # fmt: skip
    """Figures of every side, with each one's relative difference from `reference` (None where either is missing or
    the reference is 0); `flagged` lists (figure, side) pairs whose difference exceeds `tolerance`."""
    if reference not in reports:
        raise ValueError(f"no {reference.value} report to compare with")
    rows: list[dict[str, Any]] = []
    flagged: list[list[str]] = []
    for name, read in FIGURES:
        values = {side.value: read(r) for side, r in reports.items()}
        ref = values[reference.value]
        diffs: dict[str, float | None] = {}
        for side, value in values.items():
            if side == reference.value:
                continue
            diffs[side] = None if value is None or ref is None or ref == 0 else (value - ref) / ref
            if diffs[side] is not None and abs(diffs[side]) > tolerance:  # type: ignore[arg-type]
                flagged.append([name, side])
        rows.append({"figure": name, "values": values, "differences": diffs})
    return {
        "reference": reference.value, "tolerance": tolerance, "sides": [s.value for s in reports],
        "descriptions": {s.value: descriptions[s] for s in reports}, "rows": rows, "flagged": flagged,
    }  # fmt: skip


def format_value(row: Mapping[str, Any], side: str) -> str:
    """One side's figure of a comparison row as shown: counts whole, the rest to three decimals, "-" if missing."""
    value = row["values"][side]
    if value is None:
        return "-"
    return f"{value:,.0f}" if row["figure"].startswith("requests") else f"{value:,.3f}"


def comparison_markdown(comparison: Mapping[str, Any]) -> list[str]:
    """The report section: one column per side, differences from the reference in parentheses (bold above the
    tolerance)."""
    sides: list[str] = comparison["sides"]
    ref, tol = comparison["reference"], comparison["tolerance"]
    lines = ["## Ours vs the real peer, live (`--against`)", "",
             f"The same workload through each side, one after the other on this machine; differences from {ref} in "
             f"parentheses, bold above {tol:.0%}. One run per side: on a shared machine repeat before reading small "
             "differences.", ""]  # fmt: skip
    lines += [f"- **{s}**: {comparison['descriptions'][s]}" for s in sides]
    lines += ["", "| figure | " + " | ".join(sides) + " |", "|---|" + "---:|" * len(sides)]
    for row in comparison["rows"]:
        cells = []
        for side in sides:
            text = format_value(row, side)
            diff = row["differences"].get(side)
            if side != ref and diff is not None:
                note = f"{diff:+.0%}"
                text += f" ({'**' + note + '**' if abs(diff) > tol else note})"
            cells.append(text)
        lines.append(f"| {row['figure']} | " + " | ".join(cells) + " |")
    return lines + [""]
