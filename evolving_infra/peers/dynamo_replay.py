"""Drive Dynamo's own trace replay (ai-dynamo, in its side virtual environment) as a subprocess, and read its
per-request results back as `PeerRequest`s.

The side environment is made by `scripts/peers/setup-dynamo.sh` (default `.peers/dynamo-venv` in the
repository); `EVOLVING_INFRA_DYNAMO_PYTHON` names another interpreter. Its pins differ from ours, so nothing of
Dynamo is ever imported here: `dynamo_driver.py` runs in that interpreter, reads a job file and writes JSON.

Boundary: files and one subprocess with a timeout; the figures are computed by `peers.metrics`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.peers.dynamo_timing import TimingFit
from evolving_infra.peers.metrics import PeerRequest

ENV_PYTHON = "EVOLVING_INFRA_DYNAMO_PYTHON"
SIDE_VENV = Path(".peers") / "dynamo-venv"
DRIVER = Path(__file__).with_name("dynamo_driver.py")
REPO = Path(__file__).resolve().parents[2]


class DynamoUnavailable(RuntimeError):
    """The side environment with ai-dynamo is missing or broken (the message says how to make it)."""


class DynamoReplayError(RuntimeError):
    """Dynamo's replay ran but failed or returned something unreadable."""


def find_dynamo_python() -> Path:
    """The interpreter of the side environment; DynamoUnavailable (with the fix) when there is none."""
    named = os.environ.get(ENV_PYTHON)
    candidates = [Path(named)] if named else [REPO / SIDE_VENV / "bin" / "python", SIDE_VENV / "bin" / "python"]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    where = named or f"{REPO / SIDE_VENV}"
    raise DynamoUnavailable(
        f"no ai-dynamo side environment at {where}; create it with scripts/peers/setup-dynamo.sh "
        f"(or set {ENV_PYTHON} to an interpreter that has ai-dynamo 1.6.1)"
    )


def dynamo_ready(python: Path | None = None) -> str | None:
    """None when `import dynamo.replay` works in the side environment, else the reason it does not."""
    try:
        exe = python or find_dynamo_python()
    except DynamoUnavailable as exc:
        return str(exc)
    try:
        done = subprocess.run(
            [str(exe), "-I", "-c", "import numpy, dynamo.replay"], capture_output=True, text=True, timeout=120,
            check=False, cwd=tempfile.gettempdir(),
        )  # -I and cwd: the repository's operator/ folder must not shadow the standard library
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{exe} cannot import dynamo.replay: {exc}"
    if done.returncode != 0:
        return f"{exe} cannot import dynamo.replay: {done.stderr.strip().splitlines()[-1:] or done.returncode}"
    return None


@dataclass(frozen=True)
class DynamoSetup:
    """How Dynamo's replay is configured to stand for one of our clusters."""

    prefill_workers: int
    decode_workers: int
    block_tokens: int = 64
    router_mode: str = "kv_router"
    replay_concurrency: int | None = None
    engine: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_profile(cls, profile: HardwareProfile, prefill: int, decode: int, *, host_offload: bool = True,
                    block_tokens: int = 64) -> DynamoSetup:
        """Workers with the profile's GPU KV capacity, page size, chunk budget and P->D transfer bandwidth; with
        `host_offload`, also its host-memory capacity as the mocker's host (G2) tier."""
        engine: dict[str, Any] = {
            "backend": "vllm",
            "block_size": profile.page_tokens,
            "num_gpu_blocks": profile.l1_pages,
            "max_num_batched_tokens": profile.chunk_tokens,
            "max_num_seqs": 1024,
            "enable_prefix_caching": True,
            "enable_chunked_prefill": True,
            "kv_transfer_bandwidth": profile.transfer_bandwidth / 1e9,
            "kv_transfer_bytes_per_token": profile.kv_bytes_per_token,
        }
        if host_offload:
            engine["native_host_offload"] = {
                "num_host_blocks": profile.l2_pages,
                "h2d_bandwidth_gbps": profile.load_bandwidth / 1e9,
                "d2h_bandwidth_gbps": profile.load_bandwidth / 1e9,
            }
            engine["kv_cache_bytes_per_token"] = profile.kv_bytes_per_token
        return cls(prefill, decode, block_tokens, engine=engine)


@dataclass(frozen=True)
class DynamoRun:
    requests: list[PeerRequest]
    summary: dict[str, Any]
    wall_s: float
    dynamo_version: str
    failed: int


def run_dynamo_replay(
    mooncake_path: Path, setup: DynamoSetup, timing: TimingFit, *, python: Path | None = None,
    timeout_s: float = 600.0, log_path: Path | None = None,
) -> DynamoRun:
    """Replay the Mooncake file at `mooncake_path` in Dynamo with `setup` and `timing`."""
    exe = python or find_dynamo_python()
    job = {
        "trace": str(Path(mooncake_path).resolve()), "block_tokens": setup.block_tokens,
        "timing": timing.tables, "engine": setup.engine, "prefill_workers": setup.prefill_workers,
        "decode_workers": setup.decode_workers, "router_mode": setup.router_mode,
        "replay_concurrency": setup.replay_concurrency,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="evolving-infra-peers-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        driver = Path(tmp) / DRIVER.name  # run from a folder holding nothing else: no module of ours shadows one
        shutil.copyfile(DRIVER, driver)
        log = log_path.open("wb") if log_path else subprocess.DEVNULL
        try:
            done = subprocess.run(
                [str(exe), "-I", str(driver), str(job_path), str(out_path)], stdout=log, stderr=log, cwd=tmp,
                timeout=timeout_s, check=False, env={**os.environ, "DYN_LOG": os.environ.get("DYN_LOG", "warn")},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise DynamoReplayError(f"Dynamo's replay did not finish within {timeout_s:.0f} s") from None
        finally:
            if log_path and not isinstance(log, int):
                log.close()
        if done.returncode != 0 or not out_path.exists():
            hint = f"; its log is {log_path}" if log_path else ""
            raise DynamoReplayError(f"Dynamo's replay exited with status {done.returncode}{hint}")
        data = json.loads(out_path.read_text())
    return parse_dynamo_output(data)


def parse_dynamo_output(data: dict[str, Any]) -> DynamoRun:
    """`DynamoRun` from the driver's JSON; requests are keyed `<session_id>#<turn_index>` (branch, position)."""
    requests: list[PeerRequest] = []
    failed = 0
    for r in data.get("requests", []):
        if r.get("terminal_status") not in (None, "completed") or r.get("ttft_ms") is None:
            failed += 1
            continue
        key = f"{r.get('session_id')}#{r.get('turn_index')}" if r.get("session_id") else str(r.get("uuid"))
        requests.append(
            PeerRequest(
                request_id=key, arrival_s=float(r["arrival_time_ms"]) / 1000, ttft_s=float(r["ttft_ms"]) / 1000,
                e2e_s=float(r["e2e_latency_ms"]) / 1000, prompt_tokens=int(r["input_length"]),
                reused_tokens=min(int(r.get("reused_input_tokens") or 0), int(r["input_length"])),
                output_tokens=int(r.get("output_length") or 0),
            )  # fmt: skip
        )
    return DynamoRun(requests, dict(data.get("summary", {})), float(data.get("wall_s", 0.0)),
                     str(data.get("dynamo_version", "unknown")), failed)  # fmt: skip
