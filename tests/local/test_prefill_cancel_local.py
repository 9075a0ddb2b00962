"""Clients that go away while their prefills wait or run free the prefill node (issue 17, cancellation).

A real local cluster (one prefill and one decode node agent process and the router process, 127.0.0.1):
the node runs slowed down (speed_up 0.25) so a burst of long prompts queues for many seconds on the prefill
node; every client disconnects shortly after sending. The router cancels each abandoned prefill on its node
(`Cancel`): the node drops the queued and running ones (counted `requests_total{phase="prefill",
outcome="cancelled"}`), every accepted prefill is accounted for (finished + cancelled == accepted), its queue
is empty long before the burst's work would have been done, and the router counts what it cancelled. Then a
new request is served at once.

Bounded: 8 requests, a 40 s wait for the node to settle, a fresh cluster.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from evolving_infra.local.cluster import ClusterSpec, LocalCluster

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the local cluster needs Linux process control")

BURST = 8
PROMPT = " ".join(f"tok{i}" for i in range(6000))


def metric(url: str, series: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))


async def abandon(url: str) -> list[str]:
    """Send BURST streaming requests at once and drop every connection after 1.5 s; what each saw."""
    seen: list[str] = []

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"messages": [{"role": "user", "content": f"abandoned {i} " + PROMPT}], "max_tokens": 64, "stream": True}
        try:
            async with asyncio.timeout(1.5):
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    async for _ in resp.content:
                        pass
            seen.append("completed")
        except TimeoutError:
            seen.append("abandoned")

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, i) for i in range(BURST)))
    return seen


def test_disconnected_clients_cancel_their_queued_and_running_prefills(tmp_path: Path) -> None:
    spec = ClusterSpec(nodes=2, prefill=1, speed_up=0.25, l2_pages=8192, page_bytes=256, planner="static",
                       request_timeout_s=120.0, start_timeout_s=90.0, stop_grace_s=5.0)  # fmt: skip
    with LocalCluster(spec, tmp_path) as cluster:
        node = cluster.node_metrics["n0"]
        seen = asyncio.run(asyncio.wait_for(abandon(cluster.router_url), 60))
        assert seen.count("abandoned") >= BURST - 1, seen
        series = 'evolving_node_requests_total{outcome="%s",phase="prefill"}'
        end = time.monotonic() + 40
        while True:
            accepted = metric(node, series % "accepted")
            finished, cancelled = metric(node, series % "finished"), metric(node, series % "cancelled")
            queued = metric(node, 'evolving_node_queued_requests{phase="prefill"}')
            running = metric(node, 'evolving_node_running_requests{phase="prefill"}')
            if accepted and finished + cancelled == accepted and queued == running == 0:
                break
            assert time.monotonic() < end, (accepted, finished, cancelled, queued, running)
            time.sleep(0.2)
        print(f"prefill node: accepted {accepted:g}, finished {finished:g}, cancelled {cancelled:g}; "
              f"settled {time.monotonic() - end + 40:.1f} s after the disconnects")
        # most of the burst never ran: cancelled while queued (or mid-run), not computed for nobody
        assert accepted >= BURST - 1
        assert cancelled >= BURST // 2, (accepted, finished, cancelled)
        # the node counts a cancel before its answer reaches the router: wait (bounded) for the router's count
        end = time.monotonic() + 10
        cancels = 'evolving_router_prefill_cancels_total{outcome="cancelled"}'
        while (router_cancels := metric(cluster.router_metrics_url, cancels)) < cancelled and time.monotonic() < end:
            time.sleep(0.1)
        assert router_cancels == cancelled
        # the node serves a new request at once
        body = {"messages": [{"role": "user", "content": "after the burst"}], "max_tokens": 4}
        request = urllib.request.Request(f"{cluster.router_url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200
