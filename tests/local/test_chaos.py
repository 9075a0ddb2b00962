"""Faults under streaming load on a real local cluster (four node agent processes, 2P2D, and the router
process, all on 127.0.0.1): kill -9 a prefill node, kill -9 a decode node, SIGSTOP a decode node, kill -9 the
router and start it again. For each, every request is classified (completed, failed with a clear error,
cut, hung) and the requests the fault touched are told apart by the serving-node headers:

- a prefill node's death loses nothing (unfinished prefills are routed again before any token was sent;
  streams decoding elsewhere go on);
- a decode node's death or stop fails only the streams it was serving, each with an in-stream error, and a
  stopped node is detected while it is still stopped (so before the node could answer again);
- a router restart cuts only the streams it carried (the nodes cancel those of their decodes still
  running, counted in the report), and the new router serves.

Bounded: 16 clients sending one streaming request after another for 12 s (at most 40 each), a 60 s limit
per request, a fresh cluster per fault.
`chaos_report` gathers the counts; `python -P tests/local/test_chaos.py` prints them as a table.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from evolving_infra.local.cluster import ClusterSpec, LocalCluster
from evolving_infra.local.processes import Child, python_command

CLIENTS = 16
MAX_PER_CLIENT = 40
LOAD_S = 12.0
"""Clients keep sending for this long (the fault comes at FAULT_AT_S, so load runs across it)."""
REQUEST_LIMIT_S = 60.0
FAULT_AT_S = 2.0
STOP_FOR_S = 10.0
PROMPT = " ".join(f"tok{i}" for i in range(600))

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the local cluster needs Linux process control")


@dataclass
class Outcome:
    kind: str
    """completed, error (a clear OpenAI-shaped error, as a status or in the stream), cut, hung."""
    prefill: str | None = None
    decode: str | None = None
    ended_at: float = 0.0
    detail: str = ""


@dataclass
class Load:
    url: str
    outcomes: list[Outcome] = field(default_factory=list)
    started: float = 0.0
    in_flight: int = 0
    in_flight_at_fault: int = 0

    async def one(self, session: aiohttp.ClientSession, client: int, turn: int) -> Outcome:
        body = {
            "messages": [{"role": "user", "content": f"client {client} turn {turn} " + PROMPT}],
            "max_tokens": 160, "stream": True,
        }  # fmt: skip
        headers = {"x-evolving-branch-id": f"chaos-{client}"}
        out = Outcome("cut")
        self.in_flight += 1
        try:
            async with asyncio.timeout(REQUEST_LIMIT_S):
                async with session.post(f"{self.url}/v1/chat/completions", json=body, headers=headers) as resp:
                    out.prefill = resp.headers.get("x-evolving-prefill-node")
                    out.decode = resp.headers.get("x-evolving-decode-node")
                    if resp.status != 200:
                        error = (await resp.json()).get("error", {})
                        out.kind = "error" if error.get("message") else "cut"
                        out.detail = f"{resp.status}: {error.get('message', '')}"[:300]
                    else:
                        finished = errored = False
                        async for line in resp.content:
                            text = line.decode().strip()
                            if not text.startswith("data: ") or text == "data: [DONE]":
                                continue
                            data = json.loads(text[6:])
                            if "error" in data:
                                errored = True
                                out.detail = f"in-stream: {data['error'].get('message', '')}"[:300]
                            elif any(c.get("finish_reason") for c in data.get("choices", [])):
                                finished = True
                        out.kind = "error" if errored else "completed" if finished else "cut"
        except TimeoutError:
            out.kind = "hung"
        except (aiohttp.ClientError, ConnectionError, json.JSONDecodeError) as error:
            out.kind, out.detail = "cut", f"{type(error).__name__}: {error}"[:200]
        finally:
            self.in_flight -= 1
        out.ended_at = time.monotonic() - self.started
        return out

    async def client(self, session: aiohttp.ClientSession, client: int, url_of: Callable[[], str]) -> None:
        """Requests one after another until LOAD_S after the start (at most MAX_PER_CLIENT)."""
        for turn in range(MAX_PER_CLIENT):
            if time.monotonic() - self.started > LOAD_S:
                return
            self.url = url_of()
            outcome = await self.one(session, client, turn)
            self.outcomes.append(outcome)
            if outcome.kind == "cut":  # e.g. the router is restarting: do not spin
                await asyncio.sleep(0.25)

    async def run(self, url_of: Callable[[], str], fault: Callable[[], Any]) -> None:
        self.started = time.monotonic()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            clients = [asyncio.ensure_future(self.client(session, i, url_of)) for i in range(CLIENTS)]
            await asyncio.sleep(FAULT_AT_S)
            self.in_flight_at_fault = self.in_flight
            fault()  # on this thread: a child started from a worker thread dies with it (PR_SET_PDEATHSIG)
            await asyncio.gather(*clients)


def spec() -> ClusterSpec:
    return ClusterSpec(
        nodes=4, prefill=2, speed_up=20.0, l2_pages=2048, page_bytes=256, planner="static", request_timeout_s=60.0,
        start_timeout_s=90.0, stop_grace_s=5.0,
    )  # fmt: skip


def node_metric(cluster: LocalCluster, node: str, series: str) -> float:
    with urllib.request.urlopen(cluster.node_metrics[node], timeout=5) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))


def restart_router(cluster: LocalCluster) -> None:
    """kill -9 the router, then start a new one from the same settings file."""
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


def run_fault(name: str, workdir: Path) -> dict[str, Any]:
    cluster = LocalCluster(spec(), workdir)
    cluster.start()
    stopped: list[Child] = []
    try:
        nodes = cluster.nodes
        faults: dict[str, Callable[[], None]] = {
            "kill -9 prefill node n0": lambda: nodes["n0"].proc.kill(),  # type: ignore[union-attr]
            "kill -9 decode node n2": lambda: nodes["n2"].proc.kill(),  # type: ignore[union-attr]
            "SIGSTOP decode node n3 (10 s)": lambda: (nodes["n3"].signal(signal.SIGSTOP), stopped.append(nodes["n3"])),
            "kill -9 router, restart": lambda: restart_router(cluster),
        }
        load = Load(cluster.router_url)
        fault_node = {"kill -9 prefill node n0": "n0", "kill -9 decode node n2": "n2", "SIGSTOP decode node n3 (10 s)": "n3"}.get(name)

        async def main() -> None:
            runner = asyncio.ensure_future(load.run(lambda: cluster.router_url, faults[name]))
            if stopped or name.startswith("SIGSTOP"):
                await asyncio.sleep(FAULT_AT_S + STOP_FOR_S)
                for child in stopped:
                    child.signal(signal.SIGCONT)
            await runner

        asyncio.run(asyncio.wait_for(main(), 400))
        touched = [o for o in load.outcomes if fault_node is not None and fault_node in (o.prefill, o.decode)]
        untouched = [o for o in load.outcomes if o not in touched]
        report: dict[str, Any] = {
            "fault": name,
            "requests": len(load.outcomes),
            "in_flight_at_fault": load.in_flight_at_fault,
            "outcomes": dict(Counter(o.kind for o in load.outcomes)),
            "touched": dict(Counter(o.kind for o in touched)),
            "untouched_not_completed": [o.kind for o in untouched if o.kind != "completed"],
            "errors": sorted({o.detail for o in load.outcomes if o.kind == "error"})[:5],
        }
        if name.startswith("SIGSTOP"):
            report["touched_errors_ended_while_stopped"] = all(
                o.ended_at < FAULT_AT_S + STOP_FOR_S for o in touched if o.kind == "error"
            )
        if name.startswith("kill -9 router"):
            after = Load(cluster.router_url)

            async def more() -> list[Outcome]:
                after.started = time.monotonic()
                async with aiohttp.ClientSession() as session:
                    return list(await asyncio.gather(*(after.one(session, 100 + i, 0) for i in range(8))))

            report["after_restart"] = dict(Counter(o.kind + o.detail for o in asyncio.run(more())))
            time.sleep(3)
            report["cancelled_decodes_on_nodes"] = sum(
                node_metric(cluster, n, 'evolving_node_requests_total{outcome="cancelled",phase="decode"}') for n in ("n2", "n3")
            )
        return report
    finally:
        for child in stopped:
            child.signal(signal.SIGCONT)
        cluster.stop()


FAULTS = ["kill -9 prefill node n0", "kill -9 decode node n2", "SIGSTOP decode node n3 (10 s)", "kill -9 router, restart"]


@pytest.mark.parametrize("fault", FAULTS)
def test_no_request_is_lost_to_a_fault_that_did_not_touch_it(fault: str, tmp_path: Path) -> None:
    report = run_fault(fault, tmp_path)
    print(json.dumps(report))
    assert report["requests"] >= 2 * CLIENTS
    assert report["in_flight_at_fault"] >= CLIENTS // 2, report
    assert report["outcomes"].get("hung", 0) == 0, report
    if fault.startswith("kill -9 prefill"):
        assert report["outcomes"] == {"completed": report["requests"]}, report
    elif fault.startswith("kill -9 router"):
        assert set(report["outcomes"]) <= {"completed", "cut"}, report
        assert report["after_restart"] == {"completed": 8}, report
    else:
        assert report["untouched_not_completed"] == [], report
        assert set(report["touched"]) <= {"completed", "error"}, report
    if fault.startswith("SIGSTOP"):
        assert report["touched_errors_ended_while_stopped"], report


if __name__ == "__main__":  # a table of the four faults
    import tempfile

    rows = []
    for fault in FAULTS:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run_fault(fault, Path(tmp)))
    for row in rows:
        print(json.dumps(row))
    os._exit(0)
