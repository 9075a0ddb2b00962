"""Make a small trace a load: `scale` (copies of every agent with fresh content, named prefixes still
shared), `merge` (several traces in one, workload labels kept or set), `slice` (a time or agent range).

Invariants: `scale` renames every agent, branch and request of copy c with the suffix `~c` and keeps every
prefix name, so two copies share exactly the prefixes' KV (fresh tokens and outputs are per request in the
content model, hence distinct per copy); `merge` keeps each input's records in their order (so every reference
stays on an earlier line) and gives each input its own id namespace; `slice` keeps only agents in range and
turns a kept request whose base was dropped into a fresh prompt of the same length (counted).

Boundary: pure functions from validated traces to record lists (write them with `write_records`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from evolving_infra.traces.records import FORMAT_VERSION, Trace
from evolving_infra.traces.writer import trace_to_records


def _rename(record: dict[str, Any], rename: Any) -> dict[str, Any]:
    """A copy of `record` with every id passed through `rename` (prefix names untouched)."""
    out = dict(record)
    kind = record["kind"]
    if kind == "agent":
        out["agent"] = rename(record["agent"])
    elif kind == "request":
        for key in ("id", "agent", "branch"):
            out[key] = rename(record[key])
        out["after"] = [rename(a) for a in record["after"]]
        spec = dict(record["input"])
        if "base" in spec:
            spec["base"] = rename(spec["base"])
        out["input"] = spec
    elif kind == "branch_end":
        out["branch"] = rename(record["branch"])
        out["after"] = rename(record["after"])
    return out


def _header(name: str, source: str) -> dict[str, Any]:
    return {"kind": "header", "version": FORMAT_VERSION, "name": name, "source": source}


def scale(trace: Trace, copies: int, stagger_s: float = 0.0, *, name: str | None = None) -> list[dict[str, Any]]:
    """`copies` copies of every agent; copy c starts `c * stagger_s` later. Copy 0 keeps the original ids."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    if stagger_s < 0:
        raise ValueError(f"stagger_s must be >= 0, got {stagger_s}")
    records = trace_to_records(trace)
    prefixes = [r for r in records if r["kind"] == "prefix"]
    body = [r for r in records if r["kind"] not in ("header", "prefix")]
    out = [_header(name or f"{trace.name or 'trace'}x{copies}", f"trace scale --copies {copies} --stagger {stagger_s}")]
    out.extend(prefixes)
    for c in range(copies):
        def rename(rid: str, c: int = c) -> str:
            return rid if c == 0 else f"{rid}~{c}"

        for record in body:
            copied = _rename(record, rename)
            if copied["kind"] == "agent":
                copied["start_s"] = record["start_s"] + c * stagger_s
            out.append(copied)
    return out


@dataclass(frozen=True)
class MergeInput:
    """One trace to merge: `label` namespaces its ids (`label/id`) and prefix names; `workload` relabels all
    of its agents when given."""

    trace: Trace
    label: str
    workload: str | None = None
    offset_s: float = 0.0


def merge(inputs: Sequence[MergeInput], *, name: str = "merged") -> list[dict[str, Any]]:
    """One trace holding every input, agents interleaved by start time (each input's order kept)."""
    labels = [i.label for i in inputs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"merge labels must be distinct, got {labels}")
    out = [_header(name, "trace merge of " + ", ".join(f"{i.label} ({i.trace.name or 'unnamed'})" for i in inputs))]
    streams: list[Iterator[tuple[float, int, int, dict[str, Any]]]] = []
    for n, item in enumerate(inputs):
        def rename(rid: str, label: str = item.label) -> str:
            return f"{label}/{rid}"

        records = trace_to_records(item.trace)
        body: list[tuple[float, int, int, dict[str, Any]]] = []
        start = 0.0
        for k, record in enumerate(records):
            if record["kind"] == "header":
                continue
            if record["kind"] == "prefix":
                out.append({**record, "name": rename(record["name"])})
                continue
            copied = _rename(record, rename)
            if copied["kind"] == "request" and "shared" in copied["input"]:
                copied["input"] = {**copied["input"], "shared": rename(copied["input"]["shared"])}
            if copied["kind"] == "agent":
                start = record["start_s"] + item.offset_s
                copied["start_s"] = start
                if item.workload is not None:
                    copied["workload"] = item.workload
            body.append((start, n, k, copied))
        streams.append(iter(body))
    out.extend(record for _, _, _, record in heapq.merge(*streams, key=lambda t: t[0]))
    return out


@dataclass(frozen=True)
class SliceReport:
    agents: int
    requests: int
    detached: int  # kept requests whose base was dropped: now fresh prompts of the same length


def slice_trace(
    trace: Trace, *, from_s: float = 0.0, to_s: float = float("inf"), agents: tuple[int, int] | None = None,
    rebase_time: bool = True,
) -> tuple[list[dict[str, Any]], SliceReport]:
    """The agents that start in [from_s, to_s) and whose position (file order) is in `agents` = [lo, hi)."""
    keep_agents = {
        a for k, (a, rec) in enumerate(trace.agents.items())
        if from_s <= rec.start_s < to_s and (agents is None or agents[0] <= k < agents[1])
    }  # fmt: skip
    kept_requests = {r.id for r in trace.requests if r.agent in keep_agents}
    detached = 0
    out = [_header(f"{trace.name or 'trace'}-slice", f"trace slice from {from_s} to {to_s} agents {agents}")]
    used_prefixes = {r.shared for r in trace.requests if r.agent in keep_agents and r.shared is not None}
    starts = [trace.agents[a].start_s for a in keep_agents]
    shift = min(starts) if rebase_time and starts else 0.0
    for record in trace_to_records(trace):
        kind = record["kind"]
        if kind == "prefix":
            if record["name"] in used_prefixes:
                out.append(record)
        elif kind == "agent":
            if record["agent"] in keep_agents:
                out.append({**record, "start_s": record["start_s"] - shift})
        elif kind == "request":
            if record["agent"] not in keep_agents:
                continue
            spec = record["input"]
            if spec.get("base") is not None and spec["base"] not in kept_requests:
                record = {**record, "input": {"new": spec["keep"] + spec["new"]}}
                detached += 1
            out.append(record)
        elif kind == "branch_end" and record["after"] in kept_requests:
            out.append(record)
    return out, SliceReport(len(keep_agents), len(kept_requests), detached)
