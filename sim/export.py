"""Writing run results: per-request rows as CSV or JSON Lines, and run metrics as JSON.

Each row holds the record's fields followed by the derived `uncached_tokens`, `ttft_s`, `e2e_s`, `tpot_s`
(empty / null for single-token outputs) and `queue_s`. Column order is fixed (`REQUEST_COLUMNS`).

Boundary: formatting and file writes only; the numbers come from `records` and `metrics`.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from evolving_infra.sim.metrics import RunMetrics
from evolving_infra.sim.records import RequestRecord

_FIELDS = tuple(f.name for f in fields(RequestRecord))
_DERIVED = ("uncached_tokens", "ttft_s", "e2e_s", "tpot_s", "queue_s")
REQUEST_COLUMNS: tuple[str, ...] = _FIELDS + _DERIVED


def request_row(record: RequestRecord) -> dict[str, Any]:
    """One record as a flat mapping in `REQUEST_COLUMNS` order (`since` filled in with the origin)."""
    row: dict[str, Any] = {name: getattr(record, name) for name in _FIELDS}
    row["since"] = record.origin
    for name in _DERIVED:
        row[name] = getattr(record, name)
    return row


def write_requests_csv(records: Iterable[RequestRecord], path: str | os.PathLike[str]) -> int:
    """Write one CSV row per record (with a header); returns the number of rows."""
    count = 0
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=REQUEST_COLUMNS)
        writer.writeheader()
        for record in records:
            row = request_row(record)
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
            count += 1
    return count


def write_requests_jsonl(records: Iterable[RequestRecord], path: str | os.PathLike[str]) -> int:
    """Write one JSON object per line per record; returns the number of lines."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(request_row(record), separators=(",", ":")) + "\n")
            count += 1
    return count


def write_metrics_json(metrics: RunMetrics, path: str | os.PathLike[str]) -> None:
    """Write `metrics.to_dict()` as indented JSON."""
    Path(path).write_text(json.dumps(metrics.to_dict(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
