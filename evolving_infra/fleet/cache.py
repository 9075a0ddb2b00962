"""Finished partition runs kept on disk, so a long fleet run resumes where it stopped.

A partition's result is a pure function of its `PartitionTask` and of the simulator's code, so it is stored as
one JSON file named by a digest of both (`task_digest`): the task's config, its trace (records, or the generator's
parameters, slots and seed), its bucket width and user count, and a digest of the source of every package a run
executes, the workload generators included (`code_digest`). A run with the same inputs on the same code reads
the file instead of simulating again; any change of inputs or code gives another name, so a stored result never
passes for a run of other code. Each result is written as soon as its partition finishes (to a temporary file,
then renamed), so a run that is stopped, or whose worker dies, keeps every partition already done: the D.2
fleet's many core-hours can be spent in several sittings or on machines that come and go.

Results that keep every request record (`keep_records`, tests) are never stored.

Boundary: naming, writing and reading stored results; running them is `fleet.runs`'s.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib
import json
import os
import re
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolving_infra.fleet.sim import PartitionResult, PartitionTask

FORMAT = 1
"""Version of the stored layout (part of every name: a new layout never reads an old file)."""

CODE_PACKAGES = ("core", "fleet", "node_agent", "operator", "peers", "router", "sim", "traces", "workloads")
"""The `evolving_infra` packages whose source a partition run executes (the CLI, the gateway's server, the
evaluation runner and the local cluster are left out: they cannot change a simulated result)."""
NOT_CODE = frozenset({"fleet/cache.py", "fleet/executors.py", "fleet/progress.py", "fleet/runs.py",
                      "fleet/sim_cli.py", "fleet/sim_report.py", "fleet/source.py", "fleet/status.py"})
"""Modules of `CODE_PACKAGES` that never run inside a partition's simulation (storing, scheduling, reporting and
the gateway's reading): changing them keeps stored results valid."""


class CacheError(ValueError):
    """A stored result that cannot be read (names the file)."""


@functools.cache
def code_digest() -> str:
    """16 hex digits of a hash over the source (`*.py`, by relative path) of `CODE_PACKAGES`, less `NOT_CODE`."""
    digest = hashlib.sha256()
    for name in CODE_PACKAGES:
        module = importlib.import_module(f"evolving_infra.{name}")
        root = Path(module.__file__ or "").parent
        for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
            relative = f"{name}/{path.relative_to(root).as_posix()}"
            if relative not in NOT_CODE:
                digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def task_digest(task: PartitionTask) -> str:
    """24 hex digits naming the task's result: its inputs and the code that computes it."""
    generator = None
    if task.generator is not None:
        params, slots, seed = task.generator
        generator = {"params": asdict(params), "slots": [asdict(s) for s in slots], "seed": seed}
    described = {
        "format": FORMAT, "key": task.key, "config": task.config.model_dump(mode="json"),
        "prefixes": task.prefixes, "records": task.records, "generator": generator, "bucket_s": task.bucket_s,
        "users": task.users, "code": code_digest(),
    }
    return hashlib.sha256(_canonical(described).encode()).hexdigest()[:24]


def result_path(folder: Path, task: PartitionTask) -> Path:
    """`folder/<namespace>_<name>-<planner>-<digest>.json` (the key's characters other than letters, digits, `.`, `-`
    and `_` become `_`; the digest alone tells tasks apart)."""
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", f"{task.key}-{task.config.planner}")
    return folder / f"{readable}-{task_digest(task)}.json"


def others(folder: Path, task: PartitionTask) -> dict[Path, str]:
    """Files in `folder` for the same partition and planner as `task` but stored under another digest (other
    inputs, or other code): each with the code digest it records ("?" where it cannot be read)."""
    mine = result_path(folder, task)
    prefix = mine.name[: -len(task_digest(task)) - len(".json")]
    out: dict[Path, str] = {}
    for path in sorted(folder.glob(f"{glob.escape(prefix)}*.json")):
        if path == mine or not re.fullmatch(r"[0-9a-f]{24}\.json", path.name[len(prefix):]):
            continue
        try:
            code = json.loads(path.read_text()).get("code")
        except (OSError, ValueError, AttributeError):
            code = None
        out[path] = code if isinstance(code, str) else "?"
    return out


def load(folder: Path, task: PartitionTask) -> PartitionResult | None:
    """The stored result of `task`, or None when there is none (or the task keeps its records)."""
    from evolving_infra.fleet.sim import PartitionResult

    if task.keep_records:
        return None
    path = result_path(folder, task)
    try:
        stored = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CacheError(f"{path}: cannot read a stored partition result ({exc}); delete the file to run it again") from None
    try:
        if stored["format"] != FORMAT or stored["digest"] != task_digest(task):
            raise KeyError("format or digest")
        values = {f.name: stored["result"][f.name] for f in fields(PartitionResult) if f.name != "records"}
    except (KeyError, TypeError) as exc:
        raise CacheError(f"{path}: not a stored partition result of this task (missing {exc}); delete the file "
                         "to run it again") from None
    values["splits"] = [tuple(s) for s in values["splits"]]
    return PartitionResult(**values)


def store(folder: Path, task: PartitionTask, result: PartitionResult) -> Path | None:
    """Write `result` for `task` (atomically: a temporary file renamed); None where results are not stored."""
    if task.keep_records:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = result_path(folder, task)
    body = {"format": FORMAT, "digest": task_digest(task), "code": code_digest(),
            "result": {k: v for k, v in asdict(result).items() if k != "records"}}
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(body, indent=1))
    temporary.replace(path)
    return path
