"""A router killed mid-run (kill -9) and started again keeps the agents' branches (issue 17, item 8).

A real local cluster (one prefill and one decode node agent process, the router process; 127.0.0.1) whose
router keeps its branch table in a snapshot file (`branch_snapshot_file`, every 0.2 s). Four agents run
turns on their branches (each prompt extends the last); during a round of streaming turns the router is
killed with SIGKILL and started again from the same settings. The new router restores every branch (its
`evolving_router_branches_restored` gauge), the agents' next turns reuse their KV (cached prompt tokens
reported), and every branch's finish finds it (`finished`, not `not_found`).

Bounded: 4 agents x 4 turns, 60 s per request, a fresh cluster.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from evolving_infra.local.cluster import ClusterSpec, LocalCluster
from evolving_infra.local.processes import Child, python_command

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the local cluster needs Linux process control")

AGENTS = 4


class SnapshotCluster(LocalCluster):
    """The local cluster, its router keeping the branch table in the work folder."""

    def router_settings(self) -> dict[str, Any]:
        return {**super().router_settings(), "branch_snapshot_file": str(self.workdir / "branches.json"),
                "branch_snapshot_interval_s": 0.2}  # fmt: skip


def restart_router(cluster: LocalCluster) -> None:
    """kill -9 the router, then start a new one from the same settings file (its new URLs in `cluster`)."""
    assert cluster.router is not None
    cluster.router.proc.kill()  # type: ignore[union-attr]
    cluster.router.wait(10)
    cluster.router.forget()
    path = cluster.workdir / "router.yaml"
    child = Child("router-2", python_command("router", "serve", "--settings", str(path), "--log-level", "WARNING"), cluster.workdir)
    child.start()
    cluster.router = child
    info = child.wait_ready(time.monotonic() + 60)
    cluster.router_url = str(info["url"]).rstrip("/")
    cluster.router_metrics_url = str(info.get("metrics_url") or "")


def prompt(agent: int, turn: int) -> str:
    return " ".join(f"a{agent}w{i}" for i in range(400 + 300 * turn))


async def turn(session: aiohttp.ClientSession, url: str, agent: int, n: int, max_tokens: int = 8) -> dict[str, Any] | None:
    """One turn; its usage, or None when the stream was cut."""
    body = {"messages": [{"role": "user", "content": prompt(agent, n)}], "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"x-evolving-branch-id": f"agent-{agent}"}
    usage = None
    try:
        async with asyncio.timeout(60):
            async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
                if resp.status != 200:
                    return None
                async for line in resp.content:
                    text = line.decode().strip()
                    if text.startswith("data: {"):
                        event = json.loads(text[6:])
                        usage = event.get("usage") or usage
    except (aiohttp.ClientError, ConnectionError):
        return None
    return usage


def metric(url: str, series: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.split(" ", 1)[0] == series)


def test_a_router_killed_mid_run_keeps_the_agents_branches(tmp_path: Path) -> None:
    spec = ClusterSpec(nodes=2, prefill=1, speed_up=20.0, l2_pages=8192, page_bytes=256, planner="static",
                       request_timeout_s=60.0, start_timeout_s=90.0, stop_grace_s=5.0)  # fmt: skip
    with SnapshotCluster(spec, tmp_path) as cluster:

        async def before() -> list[Any]:
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(*(turn(session, cluster.router_url, a, 0) for a in range(AGENTS)))
                # a round of long streams, cut by the router's death
                streams = [asyncio.ensure_future(turn(session, cluster.router_url, a, 1, max_tokens=2000)) for a in range(AGENTS)]
                await asyncio.sleep(1.0)  # > the snapshot interval: the turns so far are in the file
                restart_router(cluster)  # on this thread: a child started from a worker thread dies with it
                return list(await asyncio.gather(*streams))

        cut = asyncio.run(asyncio.wait_for(before(), 180))
        assert metric(cluster.router_metrics_url, "evolving_router_branches_restored") == AGENTS

        async def after() -> tuple[list[Any], list[Any]]:
            async with aiohttp.ClientSession() as session:
                usages = []
                for n in (1, 2):
                    usages += await asyncio.gather(*(turn(session, cluster.router_url, a, n) for a in range(AGENTS)))
                finishes = []
                for a in range(AGENTS):
                    async with session.post(f"{cluster.router_url}/v1/branches/agent-{a}/finish") as resp:
                        finishes.append((resp.status, (await resp.json())["status"]))
                return usages, finishes

        usages, finishes = asyncio.run(asyncio.wait_for(after(), 180))
        cached = [u["prompt_tokens_details"]["cached_tokens"] if u else None for u in usages]
        print(f"streams cut by the restart: {sum(1 for c in cut if c is None)} of {AGENTS}; "
              f"cached prompt tokens of the turns after it: {cached}; finishes: {finishes}")
        assert all(u is not None for u in usages), usages
        assert all(c and c > 0 for c in cached), cached  # the turns after the restart reuse their branch's KV
        assert finishes == [(200, "finished")] * AGENTS
        assert metric(cluster.router_metrics_url, "evolving_router_branches") == 0
