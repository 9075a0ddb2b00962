"""Writes records as a JSON Lines trace, plain (`.jsonl`) or gzip-compressed (`.jsonl.gz`).

Invariant: the bytes depend only on the records: compact JSON with keys in record order, one record per line,
and for gzip a fixed header (no file name, modification time 0), so the same records give identical files.

Boundary: the only I/O of the workloads package.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO


def dumps(record: Mapping[str, object]) -> str:
    """One record as one line of compact JSON (no trailing newline)."""
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


def write_trace(records: Iterable[Mapping[str, object]], path: str | os.PathLike[str]) -> int:
    """Write `records` to `path` (gzip when the name ends in `.gz`); returns the number of records written."""
    target = Path(path)
    count = 0
    with target.open("wb") as raw:
        if target.name.endswith(".gz"):
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                count = _write(records, gz)
        else:
            count = _write(records, raw)
    return count


def _write(records: Iterable[Mapping[str, object]], stream: BinaryIO | gzip.GzipFile) -> int:
    count = 0
    buffer: list[str] = []
    for record in records:
        buffer.append(dumps(record))
        count += 1
        if len(buffer) >= 4096:
            stream.write(("\n".join(buffer) + "\n").encode("utf-8"))
            buffer.clear()
    if buffer:
        stream.write(("\n".join(buffer) + "\n").encode("utf-8"))
    return count
