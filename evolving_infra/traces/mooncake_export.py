"""Export a trace (format version 1) as a Mooncake request trace, so that other simulators (Dynamo's replay)
can replay the same workload: one row per request, `hash_ids` one id per block of `block_tokens` prompt
tokens, `session_id` per branch, and open-loop `timestamp`s.

What the rows say (see `EXPORT_ASSUMPTIONS`):
- `hash_ids[j]` names the whole prompt prefix up to the end of block j: full blocks take the content model's
  page hash at page size `block_tokens` (so two rows share a leading run of ids exactly when their prompts
  share those tokens), and a row's last, partial block takes a hash of its own partial content. Ids are
  renumbered 0, 1, 2, ... in order of first appearance, as in Mooncake's public traces.
- `timestamp` (ms) is an open-loop arrival estimate: a request arrives `delay_s` after the last request it
  waits for (`after`) has arrived and been served for `service_s`; a request waiting for nothing arrives at
  its agent's `start_s` plus its `delay_s`. Rows are sorted by it (stable, so ties keep file order).
- `session_id` is the request's branch; `delay` (ms, on every row but a branch's first) is the pause after the
  branch's previous request completes, so a replay that honours sessions (Dynamo's) issues the turn closed
  loop. A request that also waits for other branches (a parent joining its sub-agents) cannot say so in this
  format: its `delay` is its estimated wait after the branch's previous request instead.
- `request_id` keeps the trace's request id (Dynamo uses it as the replay key).

What is lost: the KV of a request's output is not in any row's `hash_ids` until a later row's prompt contains
it (Mooncake rows describe prompts only), cross-branch waits become estimates, and `prefix`/`agent` records
and branch ends have no counterpart.

Boundary: `export_rows` is pure (a Trace in, rows out); `export_mooncake` reads and writes files.
"""

from __future__ import annotations

import enum
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xxhash

from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.loader import load_trace
from evolving_infra.traces.records import Trace

EXPORT_ASSUMPTIONS: tuple[str, ...] = (
    "One row per request; input_length = prompt tokens (keep + new), output_length = output_tokens.",
    "hash_ids: one id per block of --block-tokens prompt tokens; a full block's id is the content model's "
    "page hash at that page size (whole-prefix identity), a partial last block's id hashes its own partial "
    "content; ids are renumbered 0, 1, 2, ... in order of first appearance.",
    "timestamp (ms): open-loop arrival estimate, delay_s after the arrival of the last request in `after` plus "
    "--service-s, or the agent's start_s plus delay_s when `after` is empty; rows are sorted by it.",
    "session_id = branch id; delay (ms) on every row but a branch's first = the pause after the branch's "
    "previous request; a row that also waits for other branches gets its estimated wait instead.",
    "Lost in this format: output KV until a later prompt contains it, cross-branch waits (estimated), prefix "
    "and agent records, branch ends.",
)


class BlockTokens(enum.IntEnum):
    """Block sizes the exporter writes: Mooncake's public traces use 512; 64 matches engine KV pages."""

    MOONCAKE = 512
    PAGE = 64


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote."""

    rows: int
    sessions: int
    block_tokens: int
    distinct_blocks: int
    cross_branch_waits: int
    input_tokens: int
    output_tokens: int
    last_timestamp_ms: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SPAN = struct.Struct("<BIII")
_PARTIAL = b"partial"


def arrival_estimates(trace: Trace, service_s: float = 0.0) -> list[float]:
    """Open-loop arrival time (s) of every request, in `trace.requests` order (see the module docstring)."""
    if service_s < 0:
        raise ValueError(f"service_s must be >= 0, got {service_s}")
    index = {r.id: r.index for r in trace.requests}
    arrival: list[float] = []
    for r in trace.requests:
        if r.after:
            ready = max(arrival[index[a]] + service_s for a in r.after)
        else:
            ready = trace.agents[r.agent].start_s
        arrival.append(ready + r.delay_s)
    return arrival


def export_rows(
    trace: Trace, block_tokens: int = BlockTokens.MOONCAKE, *, service_s: float = 0.0
) -> tuple[list[dict[str, Any]], ExportReport]:
    """Mooncake rows for `trace` (sorted by timestamp) and a report; see `EXPORT_ASSUMPTIONS`."""
    if not isinstance(block_tokens, int) or isinstance(block_tokens, bool) or block_tokens < 1:
        raise ValueError(f"block_tokens must be a positive integer, got {block_tokens!r}")
    model = ContentModel(trace, block_tokens)
    arrival = arrival_estimates(trace, service_s)
    renumber: dict[int, int] = {}
    previous_in_branch: dict[str, int] = {}
    cross = 0
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for r in trace.requests:
        full = [int(h) for h in model.prompt_pages(r.id)]
        ids = full
        if r.prompt_tokens % block_tokens:
            parent = full[-1] if full else model.namespace
            start = len(full) * block_tokens
            spans = model.context_spans(r.id, start, r.prompt_tokens)
            content = _PARTIAL + b"".join(_SPAN.pack(int(kind), oid, lo, hi) for kind, oid, lo, hi in spans)
            ids = [*full, xxhash.xxh3_64_intdigest(struct.pack("<Q", parent) + content)]
        row: dict[str, Any] = {
            "timestamp": round(arrival[r.index] * 1000),
            "input_length": r.prompt_tokens,
            "output_length": r.output_tokens,
            "hash_ids": ids,
            "session_id": str(r.branch),
            "request_id": str(r.id),
        }
        prev = previous_in_branch.get(r.branch)
        if prev is not None:
            prev_id = trace.requests[prev].id
            if tuple(r.after) == (prev_id,):
                row["delay"] = round(r.delay_s * 1000)
            else:
                cross += 1
                ready = arrival[prev] + service_s
                row["delay"] = max(0, round((arrival[r.index] - ready) * 1000))
        previous_in_branch[r.branch] = r.index
        rows.append((arrival[r.index], r.index, row))
    rows.sort(key=lambda t: (t[0], t[1]))
    out = [row for _, _, row in rows]
    for row in out:  # numbered in the order the rows are written
        row["hash_ids"] = [renumber.setdefault(h, len(renumber)) for h in row["hash_ids"]]
    report = ExportReport(
        rows=len(out), sessions=len(previous_in_branch), block_tokens=block_tokens, distinct_blocks=len(renumber),
        cross_branch_waits=cross, input_tokens=sum(r["input_length"] for r in out),
        output_tokens=sum(r["output_length"] for r in out),
        last_timestamp_ms=max((r["timestamp"] for r in out), default=0),
    )  # fmt: skip
    return out, report


def write_rows(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> None:
    """Write Mooncake rows as JSON Lines (plain, as Mooncake's tools and Dynamo's replay read them)."""
    with Path(path).open("w", encoding="utf-8", newline="\n") as out:
        for row in rows:
            out.write(json.dumps(row, separators=(", ", ": ")))
            out.write("\n")


def export_mooncake(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    block_tokens: int = BlockTokens.MOONCAKE,
    service_s: float = 0.0,
) -> ExportReport:
    """Load the trace at `in_path` (validated) and write its Mooncake rows to `out_path`."""
    rows, report = export_rows(load_trace(in_path), block_tokens, service_s=service_s)
    write_rows(rows, out_path)
    return report
