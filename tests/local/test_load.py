"""1,000 concurrent streaming requests through the router of a local cluster (four node agent processes,
2P2D, and the router process, on 127.0.0.1), twice: every request completes, and the router's resident
memory after the second wave is within a bound of the first (it holds nothing per finished request).

Bounded: two waves of 1,000 requests with 16 output tokens, a 120 s limit per wave.
`python -P tests/local/test_load.py` prints the figures (docs/benchmarks.md records them).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from evolving_infra.local.cluster import ClusterSpec, LocalCluster

STREAMS = 1000
OUTPUT_TOKENS = 16
WAVE_LIMIT_S = 120.0

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads the router's memory from /proc")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def one(session: aiohttp.ClientSession, url: str, i: int) -> str:
    body = {"messages": [{"role": "user", "content": f"stream {i}: list the files"}], "max_tokens": OUTPUT_TOKENS,
            "stream": True}  # fmt: skip
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                return f"status {resp.status}"
            finished = False
            async for line in resp.content:
                text = line.decode().strip()
                if text.startswith("data: {"):
                    data = json.loads(text[6:])
                    if "error" in data:
                        return "in-stream error"
                    finished = finished or any(c.get("finish_reason") for c in data.get("choices", []))
            return "completed" if finished else "cut"
    except (aiohttp.ClientError, ConnectionError) as error:
        return type(error).__name__


async def wave(url: str, start: int) -> tuple[Counter[str], float]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=WAVE_LIMIT_S)) as session:
        began = time.perf_counter()
        results = await asyncio.gather(*(one(session, url, start + i) for i in range(STREAMS)))
        return Counter(results), time.perf_counter() - began


def run_load(workdir: Path) -> dict[str, Any]:
    spec = ClusterSpec(
        nodes=4, prefill=2, speed_up=20.0, l2_pages=8192, page_bytes=256, planner="static", request_timeout_s=100.0,
        start_timeout_s=90.0, stop_grace_s=5.0,
    )  # fmt: skip
    with LocalCluster(spec, workdir) as cluster:
        assert cluster.router is not None and cluster.router.pid is not None
        pid = cluster.router.pid
        before = rss_mb(pid)
        first, first_s = asyncio.run(wave(cluster.router_url, 0))
        after_first = rss_mb(pid)
        second, second_s = asyncio.run(wave(cluster.router_url, STREAMS))
        after_second = rss_mb(pid)
    return {
        "streams_per_wave": STREAMS,
        "first": dict(first), "second": dict(second),
        "wave_seconds": [round(first_s, 1), round(second_s, 1)],
        "router_rss_mb": {"idle": round(before, 1), "after_first": round(after_first, 1), "after_second": round(after_second, 1)},
    }  # fmt: skip


def test_a_thousand_concurrent_streams_complete_and_router_memory_stays_flat(tmp_path: Path) -> None:
    report = run_load(tmp_path)
    print(json.dumps(report))
    assert report["first"] == {"completed": STREAMS}, report
    assert report["second"] == {"completed": STREAMS}, report
    rss = report["router_rss_mb"]
    assert rss["after_second"] <= rss["after_first"] * 1.15 + 16, report


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run_load(Path(tmp))))
