"""What the cluster reports while it runs: the split (router metrics) and each phase switch (node metrics).

`ClusterMonitor.poll(now)` reads the router's `/metrics` (`evolving_router_split_nodes{phase}`, switch and planner
decision counters) and every node's `/metrics` (`evolving_node_phase_switches_total{source,target}` and the
`phase_switch_duration_seconds` / `phase_switch_drain_seconds` histograms, node clock). A node's switch count
going up by one yields a `SwitchRecord` with the node-reported duration; its after-drain time is duration - drain.
A node that switched more than once between two polls yields one record with the summed times.

`now` is the replay clock (emulated seconds); switch completion times are therefore known to within one poll.

Boundary: HTTP reads and Prometheus text parsing; no decisions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from evolving_infra.core.types import Phase
from evolving_infra.sim.records import SplitRecord, SwitchRecord


@dataclass(frozen=True)
class SwitchTiming:
    """One switch as the node measured it (node-clock seconds)."""

    record: SwitchRecord
    duration_s: float
    drain_s: float

    @property
    def after_drain_s(self) -> float:
        """From the last old-phase request finishing to serving the new phase."""
        return max(0.0, self.duration_s - self.drain_s)


@dataclass
class _NodeCounts:
    count: float = 0.0
    total: float = 0.0
    drain: float = 0.0
    pairs: dict[tuple[str, str], float] = field(default_factory=dict)


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text -> sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def _one(samples: Mapping[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(v for _, v in samples.get(name, ()))


class ClusterMonitor:
    """Polls the router and node metrics (see the module docstring)."""

    def __init__(self, router_metrics: str, node_metrics: Mapping[str, str], initial: tuple[int, ...]) -> None:
        self.router_metrics = router_metrics
        self.node_metrics = dict(node_metrics)
        self.splits: list[SplitRecord] = [SplitRecord(0.0, *initial)]
        self.switches: list[SwitchTiming] = []
        self.router_switches: dict[str, float] = {}
        self.decisions: dict[str, float] = {}
        self.retries = 0.0
        self._nodes: dict[str, _NodeCounts] = {n: _NodeCounts() for n in self.node_metrics}
        self.errors = 0

    @property
    def split(self) -> str:
        return self.splits[-1].label

    async def poll(self, session: aiohttp.ClientSession, now: float) -> None:
        reads = [self._read(session, self.router_metrics)] + [self._read(session, u) for u in self.node_metrics.values()]
        texts = await asyncio.gather(*reads)
        if texts[0] is not None:
            self._router(parse_metrics(texts[0]), now)
        for node, text in zip(self.node_metrics, texts[1:]):
            if text is not None:
                self._node(node, parse_metrics(text), now)

    async def _read(self, session: aiohttp.ClientSession, url: str) -> str | None:
        if not url:
            return None
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as answer:
                if answer.status == 200:
                    return await answer.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            pass
        self.errors += 1
        return None

    def _router(self, samples: Mapping[str, list[tuple[dict[str, str], float]]], now: float) -> None:
        split = {labels.get("phase"): int(v) for labels, v in samples.get("evolving_router_split_nodes", ())}
        p, d, c = split.get("prefill"), split.get("decode"), split.get("collocated", 0)
        last = self.splits[-1]
        if p is not None and d is not None and (p, d, c) != (last.prefill, last.decode, last.collocated) and p + d + c > 0:
            self.splits.append(SplitRecord(max(now, last.at), p, d, c))
        self.router_switches = {
            f"{labels.get('to_phase')}:{labels.get('outcome')}": v
            for labels, v in samples.get("evolving_router_phase_switches_total", ())
        }
        self.decisions = {labels.get("outcome", ""): v for labels, v in samples.get("evolving_router_planner_decisions_total", ())}
        self.retries = _one(samples, "evolving_router_retries_total")

    def _node(self, node: str, samples: Mapping[str, list[tuple[dict[str, str], float]]], now: float) -> None:
        seen = self._nodes[node]
        count = _one(samples, "evolving_node_phase_switch_duration_seconds_count")
        total = _one(samples, "evolving_node_phase_switch_duration_seconds_sum")
        drain = _one(samples, "evolving_node_phase_switch_drain_seconds_sum")
        pairs = {
            (labels.get("source", ""), labels.get("target", "")): v
            for labels, v in samples.get("evolving_node_phase_switches_total", ())
        }
        if count > seen.count:
            moved = [pair for pair, v in pairs.items() if v > seen.pairs.get(pair, 0.0)]
            source, target = moved[-1] if moved else ("", "")
            duration, drained = total - seen.total, drain - seen.drain
            if source in ("prefill", "decode") and target in ("prefill", "decode") and source != target:
                record = SwitchRecord(node, Phase(source), Phase(target), max(0.0, now - duration), now)
                self.switches.append(SwitchTiming(record, duration, drained))
        seen.count, seen.total, seen.drain, seen.pairs = count, total, drain, pairs
