"""`evolving-infra gateway bench`: what binding and forwarding cost, as figures.

- binding: `users` users bound over `partitions` equal partitions (the D.2 fleet: 30,720 users over 8);
  binds per second, the largest load over the weighted share (the bound is `load_factor`), and the
  fraction of users that move when one more partition joins (ideal: 1 / (partitions + 1));
- forwarding: `requests` chat completions (`concurrency` at a time) to one partition router on the fake
  backend, directly and through the gateway, on 127.0.0.1; requests per second and latency percentiles
  of each, so the gateway's added latency reads off the difference.

Boundary: measuring; the figures go to stdout (docs/benchmarks.md records them with the command).
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from aiohttp.test_utils import TestServer

from evolving_infra.fleet.binding import Binder, Partition
from evolving_infra.fleet.source import FileSource
from evolving_infra.gateway.server import start_gateway
from evolving_infra.gateway.settings import GatewaySettings
from evolving_infra.router.http import FakeBackend, RouterHttpSettings, create_app

CHAT = {"messages": [{"role": "user", "content": "list the files"}], "max_tokens": 8}


def bench_binding(users: int, partitions: int, load_factor: float) -> dict[str, Any]:
    parts = [Partition(f"p{i}", weight=384.0) for i in range(partitions)]
    binder = Binder(parts, load_factor=load_factor)
    keys = [f"user-{i}" for i in range(users)]
    start = time.perf_counter()
    for key in keys:
        binder.bind(key)
    seconds = time.perf_counter() - start
    share = users / partitions
    loads = binder.loads()
    moves = binder.add_partition(Partition(f"p{partitions}", weight=384.0))
    return {
        "users": users,
        "partitions": partitions,
        "load_factor": load_factor,
        "binds_per_s": round(users / seconds),
        "max_load_over_share": round(max(loads.values()) / share, 4),
        "bound": math.ceil(load_factor * users / partitions) / share,
        "moved_on_join": round(len(moves) / users, 4),
        "ideal_moved_on_join": round(1 / (partitions + 1), 4),
    }


def _summary(latencies: list[float], seconds: float) -> dict[str, float]:
    ms = np.array(latencies) * 1000
    return {
        "requests_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
    }


async def _load(session: aiohttp.ClientSession, url: str, requests: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    queue = iter(range(requests))

    async def worker(w: int) -> None:
        for i in queue:
            start = time.perf_counter()
            headers = {"x-evolving-user": f"user-{i % 64}", "x-evolving-branch-id": f"b-{i % 64}"}
            async with session.post(url, json=CHAT, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"answer {response.status} from {url}")
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return _summary(latencies, time.perf_counter() - start)


async def bench_forwarding(requests: int, concurrency: int) -> dict[str, Any]:
    backend = FakeBackend()
    router = TestServer(create_app(RouterHttpSettings(tokenize_processes=0), backend), host="127.0.0.1")
    await router.start_server()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p0.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "serving.evolving-infra.io/v1alpha1",
                    "kind": "AgentServingCluster",
                    "metadata": {"name": "p0", "annotations": {"evolving-infra.io/router-url": str(router.make_url("")).rstrip("/")}},
                    "spec": {
                        "nodeSelector": {"matchLabels": {"pool": "p0"}},
                        "nodeCount": 2,
                        "engine": {"backend": "emulated", "profile": "glm-5.2-4xgb300-tp4"},
                        "initialSplit": {"prefill": 1, "decode": 1},
                    },
                }
            )
        )
        gateway = await start_gateway(GatewaySettings(port=0, partition_files=(path,), health_interval_s=60.0), FileSource((path,)))
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
                await _load(session, gateway.url + "/v1/chat/completions", min(requests, 20), concurrency)  # warm
                direct = await _load(session, str(router.make_url("/v1/chat/completions")), requests, concurrency)
                via = await _load(session, gateway.url + "/v1/chat/completions", requests, concurrency)
        finally:
            await gateway.stop()
            await router.close()
    return {"requests": requests, "concurrency": concurrency, "direct": direct, "via_gateway": via}


def run_bench(users: int, partitions: int, load_factor: float, requests: int, concurrency: int) -> dict[str, Any]:
    return {
        "binding": bench_binding(users, partitions, load_factor),
        "forwarding": asyncio.run(bench_forwarding(requests, concurrency)),
    }
