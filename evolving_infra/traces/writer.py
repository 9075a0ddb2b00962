"""Write trace records as JSON Lines (gzip-compressed when the path ends in `.gz`), and turn a `Trace` back
into records.

Boundary: formatting and writing files; no validation (read the result back with `load_trace` to check it).
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from evolving_infra.traces.records import Trace


def dumps_record(record: Mapping[str, Any]) -> str:
    """One record as a compact JSON line (no trailing newline), keys in the given order."""
    return json.dumps(record, separators=(", ", ": "), ensure_ascii=False, allow_nan=False)


def write_records(records: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> int:
    """Write `records` to `path`, one per line; gzip when the name ends in `.gz`. Returns the record count."""
    target = Path(path)
    count = 0
    raw = gzip.GzipFile(target, "wb", mtime=0) if target.name.endswith(".gz") else target.open("wb")
    with raw, io.TextIOWrapper(raw, encoding="utf-8", newline="\n") as out:
        for record in records:
            out.write(dumps_record(record))
            out.write("\n")
            count += 1
    return count


def trace_to_records(trace: Trace) -> list[dict[str, Any]]:
    """Records that load back into an equal trace: header, prefixes, then agents, requests and branch ends
    in their original line order."""
    out: list[dict[str, Any]] = []
    if trace.header is not None:
        h = trace.header
        head: dict[str, Any] = {"kind": "header", "version": h.version}
        head.update({k: v for k, v in (("name", h.name), ("source", h.source), ("notes", h.notes)) if v is not None})
        out.append(head)
    lined: list[tuple[int, dict[str, Any]]] = []
    for p in trace.prefixes.values():
        lined.append((p.line, {"kind": "prefix", "name": p.name, "tokens": p.tokens}))
    for a in trace.agents.values():
        lined.append((a.line, {"kind": "agent", "agent": a.agent, "workload": a.workload, "start_s": a.start_s}))
    for r in trace.requests:
        spec: dict[str, Any] = {}
        if r.base is not None:
            spec["base"] = r.base
        if r.shared is not None:
            spec["shared"] = r.shared
        spec.update(keep=r.keep, new=r.new)
        record = {
            "kind": "request", "id": r.id, "agent": r.agent, "branch": r.branch, "after": list(r.after),
            "delay_s": r.delay_s, "input": spec, "output_tokens": r.output_tokens,
        }  # fmt: skip
        lined.append((r.line, record))
    for e in trace.branch_ends:
        lined.append((e.line, {"kind": "branch_end", "branch": e.branch, "after": e.after}))
    out.extend(record for _, record in sorted(lined, key=lambda item: item[0]))
    return out
