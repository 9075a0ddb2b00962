"""The router's node client notices a hung node agent (SIGSTOP: its TCP connections stay open, nothing
answers) within its liveness bound and sees it rejoin after SIGCONT; a node agent with a cluster token
refuses a client without it and serves one with it. Real node agent processes on 127.0.0.1; every wait
bounded.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys

from pathlib import Path
from typing import Any

import grpc
import pytest

from evolving_infra.core.types import NodeId
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.router.service.client import (
    CredentialsError,
    NodeClient,
    NodeCredentials,
    NodeEndpoint,
    generation_in_range,
    load_node_credentials,
)

SERVE = [sys.executable, "-P", "-m", "evolving_infra", "node-agent", "serve", "--node", "h", "--mode", "decode",
         "--grpc-port", "0", "--metrics-port", "0", "--l2-pages", "256", "--log-level", "WARNING"]  # fmt: skip
TOKEN = "liveness-token-0123456789"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="needs SIGSTOP/SIGCONT")


def start_node(*extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(SERVE + list(extra), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError("the node agent did not start")
    return proc, json.loads(line)["address"]


async def watch(address: str, credentials: NodeCredentials | None, act: Any) -> list[tuple[str, float]]:
    seen: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    client = NodeClient(
        NodeEndpoint(NodeId("h"), address, credentials), rpc_timeout_s=5.0,
        on_event=lambda node, event: None,
        on_down=lambda node, reason: seen.append(("down:" + reason, loop.time())),
        on_up=lambda node: seen.append(("up", loop.time())),
    )  # fmt: skip
    client.start()
    try:
        await act(seen, loop)
    finally:
        await client.close()
    return seen


async def until(check: Any, limit: float) -> bool:
    end = asyncio.get_running_loop().time() + limit
    while not check():
        if asyncio.get_running_loop().time() > end:
            return False
        await asyncio.sleep(0.05)
    return True


def test_a_stopped_node_is_marked_down_within_the_bound_and_rejoins() -> None:
    proc, address = start_node("--insecure")
    marks: dict[str, Any] = {}
    try:

        async def act(seen: list[tuple[str, float]], loop: asyncio.AbstractEventLoop) -> None:
            assert await until(lambda: any(k == "up" for k, _ in seen), 20)
            proc.send_signal(signal.SIGSTOP)
            marks["stopped"] = loop.time()
            marks["down_while_stopped"] = await until(lambda: any(k.startswith("down") for k, _ in seen), 10)
            proc.send_signal(signal.SIGCONT)
            marks["rejoined"] = await until(lambda: [k for k, _ in seen].count("up") == 2, 20)

        seen = asyncio.run(asyncio.wait_for(watch(address, None, act), 60))
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(30)
    kinds = [k.split(":")[0] for k, _ in seen]
    assert kinds == ["up", "down", "up"], seen
    assert marks["down_while_stopped"] and marks["rejoined"]
    assert "state probe" in seen[1][0]


def test_a_node_with_a_token_refuses_a_client_without_it(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    proc, address = start_node("--cluster-token-file", str(token_file))
    try:

        async def act(seen: list[tuple[str, float]], loop: asyncio.AbstractEventLoop) -> None:
            await asyncio.sleep(2.0)

        without = asyncio.run(asyncio.wait_for(watch(address, None, act), 30))
        credentials = load_node_credentials(token_file, None, None, None, False)

        async def act_up(seen: list[tuple[str, float]], loop: asyncio.AbstractEventLoop) -> None:
            assert await until(lambda: any(k == "up" for k, _ in seen), 20)

        with_token = asyncio.run(asyncio.wait_for(watch(address, credentials, act_up), 30))
    finally:
        proc.terminate()
        proc.wait(30)
    assert without == []  # never up: every subscription is refused
    assert [k for k, _ in with_token][:1] == ["up"]


def test_router_credentials_and_generations() -> None:
    with pytest.raises(CredentialsError, match="--insecure"):
        load_node_credentials(None, None, None, None, False)
    assert load_node_credentials(None, None, None, None, True) is None
    assert generation_in_range(pb.NodeEvent(state=pb.NodeState(generation=2**53 - 1)))
    assert not generation_in_range(pb.NodeEvent(state=pb.NodeState(generation=2**64 - 1)))
    assert not generation_in_range(pb.NodeEvent(switch_completed=pb.SwitchCompleted(generation=2**53)))


def test_switch_phase_never_sends_an_out_of_range_generation() -> None:
    async def main() -> grpc.StatusCode:
        client = NodeClient(NodeEndpoint(NodeId("x"), "127.0.0.1:9"), rpc_timeout_s=1.0,
                            on_event=lambda *a: None, on_down=lambda *a: None, on_up=lambda *a: None)  # fmt: skip
        try:
            await client.switch_phase(object(), 2**64 - 1, 1.0)
        except grpc.aio.AioRpcError as error:
            return error.code()
        finally:
            await client.close()
        return grpc.StatusCode.OK

    assert asyncio.run(main()) is grpc.StatusCode.OUT_OF_RANGE



def test_router_serve_refuses_to_start_without_keys_or_credentials(tmp_path: Path) -> None:
    base = [sys.executable, "-P", "-m", "evolving_infra", "router", "serve", "--node", "a=127.0.0.1:9", "--port", "0",
            "--metrics-port", "0"]  # fmt: skip
    done = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--api-key-file" in done.stderr, done.stderr[-2000:]
    keys = tmp_path / "keys"
    keys.write_text("team:sk-0123456789abcdef0123\n")
    done = subprocess.run(base + ["--api-key-file", str(keys)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cluster_token_file" in done.stderr, done.stderr[-2000:]
    keys.write_text("short\n")
    done = subprocess.run(base + ["--api-key-file", str(keys), "--insecure"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{keys}:1" in done.stderr, done.stderr[-2000:]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make test certificates")
def test_the_router_reaches_a_node_over_mutual_tls_with_a_token(tmp_path: Path) -> None:
    from tests.node_agent.test_service_auth import make_ca_and_cert

    cert, key, ca = make_ca_and_cert(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    tls = ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-file", str(ca)]
    proc, address = start_node("--cluster-token-file", str(token_file), *tls)
    port = address.rsplit(":", 1)[1]
    try:
        both = load_node_credentials(token_file, cert, key, ca, False)
        tls_only = load_node_credentials(None, cert, key, ca, False)

        async def act_up(seen: list[tuple[str, float]], loop: asyncio.AbstractEventLoop) -> None:
            assert await until(lambda: any(k == "up" for k, _ in seen), 20)

        async def act_wait(seen: list[tuple[str, float]], loop: asyncio.AbstractEventLoop) -> None:
            await asyncio.sleep(2.0)

        with_both = asyncio.run(asyncio.wait_for(watch(f"localhost:{port}", both, act_up), 30))
        without_token = asyncio.run(asyncio.wait_for(watch(f"localhost:{port}", tls_only, act_wait), 30))
        plaintext = asyncio.run(asyncio.wait_for(watch(address, None, act_wait), 30))
    finally:
        proc.terminate()
        proc.wait(30)
    assert [k for k, _ in with_both][:1] == ["up"]
    assert without_token == [] and plaintext == []
