"""The fleet status view: one row per partition (split, adapting, load, queueing imbalance) and its totals.

Sources, all optional but the partition itself:
- the AgentServingCluster's status (written by the operator and the router): current split, target
  split, adapting, ready nodes, the Ready condition;
- the partition router's Prometheus text (`evolving_router_inflight_requests` and
  `evolving_router_queued_requests`, summed over its nodes): `parse_router_metrics`;
- the gateway's own counts: users bound and requests in flight through it.

Queueing imbalance of a partition = (its queued requests per node) / (the fleet's queued requests per
node); 1.0 is the fleet average, 13.9 would be a partition queueing 13.9x the average. When the fleet has
no queued request at all every partition reads 1.0; a partition without a queue figure reads None.
Counts are summed and divided once (never averages of averages).

Boundary: pure building and rendering of the view; fetching CRs and metrics is the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from evolving_infra.fleet.partitions import FleetPartition

QUEUED_SERIES = "evolving_router_queued_requests"
INFLIGHT_SERIES = "evolving_router_inflight_requests"


@dataclass(frozen=True)
class RouterLoad:
    """What a partition's router reports, summed over its nodes."""

    inflight: float
    queued: float


@dataclass(frozen=True)
class PartitionRow:
    partition: str
    nodes: int
    gpus: int
    split: str
    target_split: str | None
    adapting: bool | None
    ready_nodes: int | None
    ready: str | None
    up: bool | None = None
    users: int | None = None
    gateway_inflight: int | None = None
    router_inflight: float | None = None
    queued: float | None = None
    queue_imbalance: float | None = None


@dataclass(frozen=True)
class FleetView:
    rows: tuple[PartitionRow, ...]
    nodes: int
    gpus: int
    prefill: int
    decode: int
    adapting: int
    queued: float | None
    max_queue_imbalance: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions": [asdict(row) for row in self.rows],
            "totals": {
                "partitions": len(self.rows),
                "nodes": self.nodes,
                "gpus": self.gpus,
                "prefill": self.prefill,
                "decode": self.decode,
                "pd_ratio": (self.prefill / self.decode) if self.decode else None,
                "adapting": self.adapting,
                "queued": self.queued,
                "max_queue_imbalance": self.max_queue_imbalance,
            },
        }


def parse_router_metrics(text: str) -> RouterLoad:
    """Sum the router's in-flight and queued gauges over nodes (missing series count as 0)."""
    sums = {QUEUED_SERIES: 0.0, INFLIGHT_SERIES: 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in sums:
            sums[family.name] += sum(s.value for s in family.samples if s.name == family.name and math.isfinite(s.value))
    return RouterLoad(inflight=sums[INFLIGHT_SERIES], queued=sums[QUEUED_SERIES])


def _split(prefill: int, decode: int) -> str:
    return f"{prefill}P{decode}D"


def _ready(status: Mapping[str, Any]) -> str | None:
    for condition in status.get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            reason = condition.get("reason")
            return f"{condition.get('status')}" + (f" ({reason})" if reason else "")
    return None


def partition_row(
    partition: FleetPartition,
    *,
    router: RouterLoad | None = None,
    up: bool | None = None,
    users: int | None = None,
    gateway_inflight: int | None = None,
) -> PartitionRow:
    """One row from the partition's CR (its status if any, else its initial split) and the optional figures."""
    status = partition.status
    prefill, decode = status.get("prefill"), status.get("decode")
    if isinstance(prefill, int) and isinstance(decode, int):
        split = _split(prefill, decode)
    elif isinstance(status.get("split"), str):
        split = str(status["split"])
    else:
        split = _split(partition.spec.initial_split.prefill, partition.spec.initial_split.decode) + " (initial)"
    target = status.get("targetSplit")
    target_split = str(target.get("split")) if isinstance(target, Mapping) and target.get("split") else None
    adapting = status.get("adapting") if isinstance(status.get("adapting"), bool) else None
    ready_nodes = status.get("readyNodes") if isinstance(status.get("readyNodes"), int) else None
    return PartitionRow(
        partition=partition.key,
        nodes=partition.node_count,
        gpus=partition.gpus,
        split=split,
        target_split=target_split,
        adapting=adapting,
        ready_nodes=ready_nodes,
        ready=_ready(status),
        up=up,
        users=users,
        gateway_inflight=gateway_inflight,
        router_inflight=router.inflight if router else None,
        queued=router.queued if router else None,
    )


def _phase_counts(row: PartitionRow) -> tuple[int, int]:
    head = row.split.split(" ")[0]
    try:
        p, d = head.rstrip("D").split("P")
        return int(p), int(d)
    except ValueError:
        return 0, 0


def fleet_view(rows: Sequence[PartitionRow]) -> FleetView:
    """The rows with their queueing imbalance, and the fleet's totals."""
    known = [r for r in rows if r.queued is not None]
    queued_total = sum(r.queued for r in known if r.queued is not None) if known else None
    nodes_known = sum(r.nodes for r in known)
    out: list[PartitionRow] = []
    for row in rows:
        imbalance: float | None = None
        if row.queued is not None and queued_total is not None:
            if queued_total <= 0:
                imbalance = 1.0
            else:
                imbalance = (row.queued / row.nodes) / (queued_total / nodes_known)
        out.append(replace(row, queue_imbalance=imbalance))
    counts = [_phase_counts(r) for r in rows]
    imbalances = [r.queue_imbalance for r in out if r.queue_imbalance is not None]
    return FleetView(
        rows=tuple(out),
        nodes=sum(r.nodes for r in rows),
        gpus=sum(r.gpus for r in rows),
        prefill=sum(p for p, _ in counts),
        decode=sum(d for _, d in counts),
        adapting=sum(1 for r in rows if r.adapting),
        queued=queued_total,
        max_queue_imbalance=max(imbalances) if imbalances else None,
    )


COLUMNS = (
    ("partition", "partition"),
    ("nodes", "nodes"),
    ("GPUs", "gpus"),
    ("split", "split"),
    ("target", "target_split"),
    ("adapting", "adapting"),
    ("ready", "ready"),
    ("up", "up"),
    ("users", "users"),
    ("in flight", "gateway_inflight"),
    ("router in flight", "router_inflight"),
    ("queued", "queued"),
    ("queue x avg", "queue_imbalance"),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}" if not value.is_integer() else f"{value:.0f}"
    return str(value)


def render_table(view: FleetView) -> str:
    """A plain-text table (columns with no value in any row are left out) and a totals line."""
    columns = [(title, attr) for title, attr in COLUMNS if any(getattr(r, attr) is not None for r in view.rows)]
    table = [[title for title, _ in columns]]
    table += [[_cell(getattr(row, attr)) for _, attr in columns] for row in view.rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    ratio = f"{view.prefill / view.decode:.2f}" if view.decode else "-"
    lines.append(
        f"fleet: {len(view.rows)} partitions, {view.nodes} nodes, {view.gpus} GPUs, split "
        f"{view.prefill}P{view.decode}D (P/D {ratio}), {view.adapting} adapting"
        + (f", {_cell(view.queued)} queued, worst queue {_cell(view.max_queue_imbalance)}x the average"
           if view.queued is not None else "")  # fmt: skip
    )
    return "\n".join(lines)
