"""`evolving-infra gateway serve` as a process in front of a partition router process (the router's front
end on `FakeBackend`), both on 127.0.0.1: a stream goes through, and `fleet status --gateway` shows the view."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from evolving_infra.cli.main import main

ROUTER = """
import asyncio, sys
from evolving_infra.router.http import FakeBackend, RouterHttpSettings, start_server
async def main():
    server = await start_server(RouterHttpSettings(port=int(sys.argv[1]), tokenize_processes=0), FakeBackend())
    await asyncio.sleep(120)
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def process(*argv: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready within {timeout_s} s")


def test_gateway_process_forwards_a_stream_to_a_router_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    router_port, port, admin = free_port(), free_port(), free_port()
    doc = {
        "apiVersion": "serving.evolving-infra.io/v1alpha1",
        "kind": "AgentServingCluster",
        "metadata": {"name": "p0", "annotations": {"evolving-infra.io/router-url": f"http://127.0.0.1:{router_port}"}},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "p0"}},
            "nodeCount": 2,
            "gpusPerNode": 4,
            "engine": {"backend": "emulated", "profile": "glm-5.2-4xgb300-tp4"},
            "initialSplit": {"prefill": 1, "decode": 1},
        },
    }
    (tmp_path / "p0.yaml").write_text(yaml.safe_dump(doc))
    cli = [sys.executable, "-m", "evolving_infra.cli.main"]
    with process(sys.executable, "-c", ROUTER, str(router_port)) as router:
        wait_ready(f"http://127.0.0.1:{router_port}/readyz", router)
        gateway_argv = [*cli, "gateway", "serve", "--partitions", str(tmp_path), "--port", str(port), "--admin-port", str(admin)]
        with process(*gateway_argv) as gateway:
            wait_ready(f"http://127.0.0.1:{admin}/readyz", gateway)
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"content-type": "application/json", "x-evolving-branch-id": "agent-1"},
            )
            with urllib.request.urlopen(request, timeout=30) as r:
                assert r.headers["x-evolving-partition"] == "default/p0"
                assert r.headers["x-evolving-branch-id"] == "agent-1"
                events = r.read().decode().split("\n\n")
            assert events[-2] == "data: [DONE]" and len(events) >= 6
            assert main(["fleet", "status", "--gateway", f"http://127.0.0.1:{port}"]) == 0
            out = capsys.readouterr().out
            assert "default/p0" in out and "fleet: 1 partitions, 2 nodes, 8 GPUs" in out
