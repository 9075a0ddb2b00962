"""Import Mooncake request traces (rows of `timestamp` ms, `input_length`, `output_length`, `hash_ids` of
512-token blocks, no session ids) into trace format version 1, rebuilding conversations from prefix chains.

Invariant of the conversion: a row's `keep` never exceeds the tokens its `hash_ids` prove it shares with its
base (except with `extend_to_context`, see `ASSUMPTIONS`), never exceeds the base's context, and never
exceeds the row's own input; so the converted trace never claims more KV reuse than the blocks support.

Boundary: `convert_mooncake` is pure (rows in, records and a report out); `read_mooncake` and
`import_mooncake` read and write files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evolving_infra.traces.writer import write_records

BLOCK_TOKENS = 512

ASSUMPTIONS: tuple[str, ...] = (
    "Blocks are 512 tokens; a row's last block is partial unless input_length is a multiple of 512.",
    "A row's base is the earlier row sharing the longest leading run of hash_ids, counting only that earlier "
    "row's full blocks; among equals, the latest row whose full blocks end exactly there, else the latest row.",
    "keep = shared run x 512 tokens, capped at the base's context (input + output) and at the row's input; "
    "new = input_length - keep. With --extend-to-context, a row that shares all of its base's full blocks and "
    "is at least as long as the base's context keeps the whole context (an append).",
    "The leading blocks that every row shares (full in every row) become one prefix record; a row sharing "
    "no more than them starts a new agent from that prefix (or from nothing when there is none).",
    "Rows linked by base form one agent (workload label from --workload). A row continues its base's branch "
    "when the base is that branch's latest request; otherwise it forks a new branch.",
    "after = [base]; delay_s = (row timestamp - base timestamp) / 1000, i.e. measured from the base's arrival, "
    "so replay issues a turn later than recorded by the base's service time. An agent's start_s is its first "
    "row's timestamp / 1000.",
    "output_length 0 is raised to 1 (the format needs >= 1 output token); the report counts such rows.",
    "Each request keeps its source line and timestamp in the extra keys mooncake_line and mooncake_timestamp_ms.",
)


class MooncakeError(ValueError):
    """A Mooncake row is malformed (`line` is 1-based)."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}")


@dataclass(frozen=True, slots=True)
class MooncakeRow:
    line: int
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class ImportReport:
    """What an import did; `block_seen_share` recomputes the Mooncake README's 'share of blocks already seen
    earlier in the trace' (all blocks, partial ones included, any earlier row)."""

    rows: int
    agents: int
    branches: int
    forks: int
    linked_rows: int
    prefix_blocks: int
    prefix_tokens: int
    input_tokens: int
    keep_tokens: int
    extended_rows: int
    clamped_outputs: int
    block_seen_share: float
    source_sha256: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_mooncake(path: str | os.PathLike[str]) -> list[MooncakeRow]:
    """Read and check Mooncake rows (sorted timestamps, len(hash_ids) == ceil(input_length / 512))."""
    rows: list[MooncakeRow] = []
    with Path(path).open("rb") as src:
        for line, data in enumerate(src, start=1):
            if not data.strip():
                continue
            try:
                obj = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise MooncakeError(line, f"not valid JSON: {exc}") from None
            rows.append(_row(line, obj, rows[-1] if rows else None))
    return rows


def _row(line: int, obj: object, previous: MooncakeRow | None) -> MooncakeRow:
    if not isinstance(obj, dict):
        raise MooncakeError(line, "each row must be a JSON object")
    values: dict[str, int] = {}
    for key in ("timestamp", "input_length", "output_length"):
        value = obj.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise MooncakeError(line, f"{key!r} must be a non-negative integer, got {value!r}")
        values[key] = value
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise MooncakeError(line, f"'hash_ids' must be a list of integers, got {ids!r}")
    if values["input_length"] < 1:
        raise MooncakeError(line, "input_length must be >= 1")
    blocks = -(-values["input_length"] // BLOCK_TOKENS)
    if len(ids) != blocks:
        raise MooncakeError(line, f"{len(ids)} hash_ids for input_length {values['input_length']}; expected {blocks}")
    if previous is not None and values["timestamp"] < previous.timestamp_ms:
        message = f"timestamp {values['timestamp']} is earlier than line {previous.line}'s; rows must be sorted"
        raise MooncakeError(line, message)
    return MooncakeRow(line, values["timestamp"], values["input_length"], values["output_length"], tuple(ids))


def shared_leading_blocks(rows: Sequence[MooncakeRow]) -> int:
    """Number of leading blocks that every row has, with the same id, as a full block (0 for < 2 rows)."""
    if len(rows) < 2:
        return 0
    count = 0
    first = rows[0].hash_ids
    while count < len(first) and all(
        r.input_length >= (count + 1) * BLOCK_TOKENS and r.hash_ids[count] == first[count] for r in rows
    ):
        count += 1
    return count


def block_seen_share(rows: Sequence[MooncakeRow]) -> float:
    """Share of all blocks whose id appeared in an earlier row (the Mooncake README's offline figure)."""
    seen: set[int] = set()
    hits = total = 0
    for r in rows:
        hits += sum(1 for h in r.hash_ids if h in seen)
        total += len(r.hash_ids)
        seen.update(r.hash_ids)
    return hits / total if total else 0.0


def convert_mooncake(
    rows: Sequence[MooncakeRow],
    *,
    name: str,
    source: str,
    workload: str = "mooncake",
    prefix_name: str = "mooncake:shared",
    extend_to_context: bool = False,
) -> tuple[list[dict[str, Any]], ImportReport]:
    """Records of trace format version 1 for `rows`, and a report (see `ASSUMPTIONS`)."""
    g = shared_leading_blocks(rows)
    records: list[dict[str, Any]] = [
        {"kind": "header", "version": 1, "name": name, "source": source, "notes": " ".join(ASSUMPTIONS)}
    ]
    if g:
        records.append({"kind": "prefix", "name": prefix_name, "tokens": g * BLOCK_TOKENS})
    latest: dict[int, int] = {}  # block id -> latest row holding it as a full block
    ends_at: dict[int, int] = {}  # block id -> latest row whose full blocks end with it
    agent_of: list[str] = []
    branch_of: list[str] = []
    tail: dict[str, int] = {}  # branch -> its latest row
    branches_of_agent: dict[str, int] = {}
    forks = linked = keep_total = extended = clamped = 0
    for i, row in enumerate(rows):
        ids = row.hash_ids
        run = _shared_run(ids, latest)
        output = max(row.output_length, 1)
        clamped += row.output_length < 1
        spec: dict[str, Any]
        if run > g:
            j = ends_at.get(ids[run - 1], latest[ids[run - 1]])
            base = rows[j]
            context = base.input_length + max(base.output_length, 1)
            keep = min(run * BLOCK_TOKENS, context, row.input_length)
            if extend_to_context and base.input_length // BLOCK_TOKENS == run and row.input_length >= context:
                extended += keep != context
                keep = context
            agent = agent_of[j]
            branch = branch_of[j]
            if tail[branch] != j:
                branch = f"{agent}.b{branches_of_agent[agent]}"
                branches_of_agent[agent] += 1
                forks += 1
            spec = {"base": f"r{base.line}", "keep": keep, "new": row.input_length - keep}
            after, delay = [f"r{base.line}"], (row.timestamp_ms - base.timestamp_ms) / 1000
            linked += 1
        else:
            agent = f"m{len(branches_of_agent)}"
            branch = f"{agent}.b0"
            branches_of_agent[agent] = 1
            records.append({"kind": "agent", "agent": agent, "workload": workload, "start_s": row.timestamp_ms / 1000})
            keep = min(g * BLOCK_TOKENS, row.input_length)
            spec = {"new": row.input_length}
            if g:
                spec = {"shared": prefix_name, "keep": keep, "new": row.input_length - keep}
            after, delay = [], 0.0
        keep_total += keep
        agent_of.append(agent)
        branch_of.append(branch)
        tail[branch] = i
        records.append({
            "kind": "request", "id": f"r{row.line}", "agent": agent, "branch": branch, "after": after,
            "delay_s": delay, "input": spec, "output_tokens": output,
            "mooncake_line": row.line, "mooncake_timestamp_ms": row.timestamp_ms,
        })  # fmt: skip
        full = row.input_length // BLOCK_TOKENS
        for h in ids[:full]:
            latest[h] = i
        if full:
            ends_at[ids[full - 1]] = i
    report = ImportReport(
        rows=len(rows), agents=len(branches_of_agent), branches=sum(branches_of_agent.values()), forks=forks,
        linked_rows=linked, prefix_blocks=g, prefix_tokens=g * BLOCK_TOKENS,
        input_tokens=sum(r.input_length for r in rows), keep_tokens=keep_total, extended_rows=extended,
        clamped_outputs=clamped, block_seen_share=block_seen_share(rows),
    )  # fmt: skip
    return records, report


def _shared_run(ids: Sequence[int], latest: dict[int, int]) -> int:
    """Length of the longest leading run of `ids` seen as full blocks of earlier rows.

    Ids name whole prefixes, so if block p was seen so were blocks 0..p-1: membership is monotone and a
    binary search finds the run.
    """
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ids[mid - 1] in latest:
            lo = mid
        else:
            hi = mid - 1
    return lo


def import_mooncake(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    workload: str = "mooncake",
    prefix_name: str = "mooncake:shared",
    extend_to_context: bool = False,
    name: str | None = None,
) -> ImportReport:
    """Convert the Mooncake trace at `in_path` and write it to `out_path` (gzip when it ends in `.gz`)."""
    src = Path(in_path)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    rows = read_mooncake(src)
    records, report = convert_mooncake(
        rows,
        name=name or f"mooncake-{src.stem}",
        source=f"Mooncake trace {src.name} (sha256 {digest}), converted by evolving-infra trace import mooncake",
        workload=workload,
        prefix_name=prefix_name,
        extend_to_context=extend_to_context,
    )
    write_records(records, out_path)
    return ImportReport(**{**report.to_dict(), "source_sha256": digest})
