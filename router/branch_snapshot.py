"""Branch table snapshots: the router's branch table kept in a file, so a restarted router continues every
active branch (issue 17: "router restart keeps branches").

What is kept, per active branch: its version and path (algorithm E.1), the pages it is counted on per node
(E.2's C[β][n]), its target per phase and its unsettled phases; and the phase of every node. On restore the
counts R[b][n] are recomputed from the C sets (`BranchTable.restore`), so they add up by construction.

Why a snapshot, not a rebuild from the node agents: a node knows its pages' counts but not which branches
they add up from, nor a branch's version or path, so the table cannot be derived from node reports. The
nodes clear the counts of a router that went away when the new one subscribes; the new router then pushes
the restored counts (its `on_up`), and the nodes' KV snapshots rebuild the directory as on any start.

Durability: the file is rewritten whole, atomically (a temporary file in the same folder, fsync, rename),
at most every `interval` seconds while the table changes, and once more at a clean shutdown. A router
killed with kill -9 loses at most the last interval's changes: a branch created in it is unknown to the new
router (its finish answers `not_found`, its next request starts it afresh), and counts of a branch that
ended in it stay until its pages are evicted. Counts on pages a node evicted while no router ran stay
until the branch ends (they only protect pages the node no longer has).

Format (JSON, version 1): {"format": FORMAT, "phases": {node: phase}, "branches": [{"id", "version",
"path", "counted": {node: pages}, "targets": {phase: node}, "unsettled": [phase]}]}, page lists as base64
of little-endian unsigned 64-bit integers; a node's counted pages are null when they are the whole path. A file that is missing starts an empty table; one that is
unreadable or malformed raises `SnapshotError` naming the file (the router then starts empty and says so).

Boundary: encoding and file I/O; the table's bookkeeping is `router.branches.BranchTable`'s.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gc
import json
import logging
import os
import sys
import tempfile
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Phase
from evolving_infra.router.branches import BranchState, BranchTable

log = logging.getLogger(__name__)

FORMAT = "evolving-branch-snapshot/1"
MAX_SNAPSHOT_BYTES = 1 << 30
"""A snapshot file larger than this is refused (about 100 M counted pages)."""


class SnapshotError(ValueError):
    """A snapshot file cannot be read or is malformed (the message names the file and the fault)."""


@dataclass(frozen=True, slots=True)
class TableSnapshot:
    """The table's rows as read-only values (taken on the event loop; encoded and written elsewhere)."""

    phases: dict[NodeId, Phase]
    branches: tuple[tuple[BranchId, BranchState], ...]


def take(table: BranchTable) -> TableSnapshot:
    """The table as it is now (copies of its rows: safe to encode on another thread)."""
    return TableSnapshot(table.phases(), tuple((b, table.state(b)) for b in table.branches()))


def _pages_out(pages: Iterable[PageHash]) -> str:
    data = array("Q", pages)
    if sys.byteorder != "little":
        data.byteswap()
    return base64.b64encode(data.tobytes()).decode("ascii")


def _pages_in(text: object, where: str) -> tuple[PageHash, ...]:
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected a base64 string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as error:
        raise ValueError(f"{where}: not base64 ({error})") from None
    if len(raw) % 8:
        raise ValueError(f"{where}: {len(raw)} bytes is not a whole number of 64-bit page hashes")
    data = array("Q")
    data.frombytes(raw)
    if sys.byteorder != "little":
        data.byteswap()
    return cast(tuple[PageHash, ...], tuple(data))  # PageHash is a NewType of int: no per-page call


def _counted_out(state: BranchState, pages: frozenset[PageHash]) -> str | None:
    """A node's counted pages: None when they are the whole path (the usual case: written once, not again)."""
    if len(pages) == len(state.path) and pages.issuperset(state.path):
        return None
    return _pages_out(pages)


def encode(snapshot: TableSnapshot) -> bytes:
    rows = [
        {
            "id": branch,
            "version": state.version,
            "path": _pages_out(state.path),
            "counted": {node: _counted_out(state, pages) for node, pages in sorted(state.counted.items())},
            "targets": {phase.value: node for phase, node in sorted(state.targets.items(), key=lambda kv: kv[0].value)},
            "unsettled": sorted(p.value for p in state.unsettled),
        }
        for branch, state in snapshot.branches
    ]
    body = {"format": FORMAT, "phases": {n: p.value for n, p in sorted(snapshot.phases.items())}, "branches": rows}
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes) -> TableSnapshot:
    """Raises ValueError naming the first fault."""
    body = json.loads(data)
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError(f"not a branch snapshot (format must be {FORMAT!r})")
    phases = _mapping(body.get("phases"), "phases")
    rows = body.get("branches")
    if not isinstance(rows, list):
        raise ValueError("branches: expected a list")
    out: list[tuple[BranchId, BranchState]] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        where = f"branches[{i}]"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object")
        branch, version = row.get("id"), row.get("version")
        if not isinstance(branch, str) or not branch or branch in seen:
            raise ValueError(f"{where}.id: expected a new non-empty string")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ValueError(f"{where}.version: expected an integer >= 1")
        seen.add(branch)
        path = _pages_in(row.get("path"), f"{where}.path")
        whole = frozenset(path)
        counted = {
            NodeId(n): whole if p is None else frozenset(_pages_in(p, f"{where}.counted.{n}"))
            for n, p in _mapping(row.get("counted"), f"{where}.counted").items()
        }
        targets = {Phase(p): NodeId(_str(n, f"{where}.targets.{p}")) for p, n in _mapping(row.get("targets"), f"{where}.targets").items()}
        unsettled = row.get("unsettled")
        if not isinstance(unsettled, list):
            raise ValueError(f"{where}.unsettled: expected a list")
        out.append((BranchId(branch), BranchState(version, path, counted, targets, frozenset(Phase(p) for p in unsettled))))
    return TableSnapshot({NodeId(n): Phase(_str(p, f"phases.{n}")) for n, p in phases.items()}, tuple(out))


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string")
    return value


def restore(table: BranchTable, snapshot: TableSnapshot, nodes: Iterable[NodeId] | None = None) -> int:
    """Put the snapshot's branches into `table` (which must not hold them), with the recorded phases of the
    nodes in `nodes` (every recorded node when None); copies on other nodes are dropped. Returns the
    number of branches restored."""
    keep = None if nodes is None else set(nodes)
    for node, phase in snapshot.phases.items():
        if keep is None or node in keep:
            table.set_phase(node, phase)
    paused = gc.isenabled()
    gc.disable()  # millions of long-lived page entries: generational collections would rescan them again and again
    try:
        for branch, state in snapshot.branches:
            table.restore(branch, state)
    finally:
        if paused:
            gc.enable()
    return len(snapshot.branches)


def write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (readers see the old file or the new one, never a part)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read(path: Path) -> TableSnapshot | None:
    """The snapshot in `path`; None when there is none. Raises `SnapshotError` naming the file."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SNAPSHOT_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise SnapshotError(f"branch snapshot {str(path)!r}: cannot read it ({error.strerror or error})") from error
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise SnapshotError(f"branch snapshot {str(path)!r}: larger than {MAX_SNAPSHOT_BYTES} bytes")
    try:
        return decode(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise SnapshotError(f"branch snapshot {str(path)!r}: {error}") from error


class BranchSnapshots:
    """Keeps `table` in `path` (module docstring): `load(nodes)` once at start, before any request; `start()`
    runs the writer (every `interval` seconds, when the table changed); `close()` stops it and writes once more."""

    def __init__(self, table: BranchTable, path: Path, interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"snapshot interval must be > 0 seconds, got {interval}")
        self.table, self.path, self.interval = table, path, interval
        self.writes = 0
        self.restored = 0
        self._task: asyncio.Task[None] | None = None
        self._written: object = None

    def load(self, nodes: Iterable[NodeId]) -> int:
        """Restore the file's branches into the (empty) table; 0 when there is no file or it is bad (logged)."""
        try:
            snapshot = read(self.path)
        except SnapshotError as error:
            log.error("%s; starting with an empty branch table", error)
            return 0
        if snapshot is None:
            log.info("no branch snapshot at %s yet; starting with an empty branch table", self.path)
            return 0
        self.restored = restore(self.table, snapshot, nodes)
        self._written = self._fingerprint()
        log.info("restored %d branches from %s", self.restored, self.path)
        return self.restored

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="branch-snapshots")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.write_now()

    async def write_now(self) -> bool:
        """Write the table if it changed since the last write; whether it wrote."""
        mark = self._fingerprint()
        if mark == self._written:
            return False
        snapshot = take(self.table)  # on the loop: the rows are copied here, encoded and written on a thread
        await asyncio.to_thread(lambda: write(self.path, encode(snapshot)))
        self._written = mark
        self.writes += 1
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.write_now()
            except OSError as error:
                log.error("cannot write the branch snapshot %s: %s", self.path, error)

    def _fingerprint(self) -> object:
        t = self.table
        return (dataclasses.astuple(t.stats), len(t), tuple(sorted(t.phases().items())), t.nodes_with_counts())


__all__ = [
    "FORMAT", "BranchSnapshots", "SnapshotError", "TableSnapshot", "decode", "encode", "read", "restore", "take", "write",
]
