"""Run one Dynamo trace replay and write what it measured as JSON. Executed by path with the Python of the
side virtual environment that holds `ai-dynamo` (scripts/peers/setup-dynamo.sh), never imported by the
project: it depends on nothing but the standard library, numpy and `dynamo`.

    <side-venv>/bin/python dynamo_driver.py JOB.json OUT.json

JOB.json: {"trace": path, "block_tokens": int, "timing": {npz arrays as lists}, "engine": {...},
"prefill_workers": int, "decode_workers": int, "router_mode": "kv_router" | "round_robin",
"replay_concurrency": int | null}. OUT.json: {"summary": {...}, "requests": [{...}], "wall_s": float,
"dynamo_version": str}.

Boundary: one replay in, one JSON file out; Dynamo's own logs go to stderr.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REQUEST_FIELDS = (
    "uuid", "session_id", "turn_index", "arrival_time_ms", "ttft_ms", "e2e_latency_ms", "input_length",
    "output_length", "reused_input_tokens", "prefill_worker_idx", "decode_worker_idx", "terminal_status",
)  # fmt: skip


def _engine(job: dict[str, Any], npz: Path, worker_type: str) -> dict[str, Any]:
    engine = dict(job.get("engine") or {})
    engine["worker_type"] = worker_type
    engine["timing_model"] = {"type": "external", "provider": "dynamo_profile", "config": {"path": str(npz)}}
    return {"engine": engine}


def run(job: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from dynamo.replay import run_trace_replay

    with tempfile.TemporaryDirectory(prefix="evolving-infra-dynamo-") as tmp:
        npz = Path(tmp) / "timing.npz"
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in job["timing"].items()}
        np.savez(npz, **arrays)  # type: ignore[arg-type]  # timing array names, none is `allow_pickle`
        kwargs: dict[str, Any] = {
            "replay_mode": "offline",
            "router_mode": job.get("router_mode", "kv_router"),
            "trace_block_size": int(job["block_tokens"]),
            "capture_per_request": True,
            "replay_concurrency": job.get("replay_concurrency"),
        }
        if job.get("decode_workers"):
            kwargs.update(
                prefill_engine_args=_engine(job, npz, "prefill"),
                decode_engine_args=_engine(job, npz, "decode"),
                num_prefill_workers=int(job["prefill_workers"]),
                num_decode_workers=int(job["decode_workers"]),
            )
        else:
            kwargs.update(extra_engine_args=_engine(job, npz, "aggregated"), num_workers=int(job["prefill_workers"]))
        start = time.perf_counter()
        report = run_trace_replay([job["trace"]], **kwargs)
        wall = time.perf_counter() - start
    requests = [{k: r.get(k) for k in REQUEST_FIELDS} for r in report.per_request or []]
    summary = {k: v for k, v in dict(report.summary).items() if isinstance(v, (int, float, str, type(None)))}
    try:
        from importlib.metadata import version

        dynamo_version = version("ai-dynamo")
    except Exception:  # the version is informational
        dynamo_version = "unknown"
    return {"summary": summary, "requests": requests, "wall_s": wall, "dynamo_version": dynamo_version}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: dynamo_driver.py JOB.json OUT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(run(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
