"""`evolving-infra node-agent serve` as a real process: it prints its addresses, and on SIGTERM it stops
accepting work (health NOT_SERVING, new requests UNAVAILABLE), lets the running decode finish, and
exits 0. Also: bad settings exit 2 naming the field. Every wait is bounded."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

SERVE = [sys.executable, "-P", "-m", "evolving_infra.cli.main", "node-agent", "serve"]


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The first stdout line, or an AssertionError with stderr if none comes in time."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"node agent printed no address within {timeout} s:\n{err[-3000:]}")
    return box[0]


def test_sigterm_drains_the_running_decode_and_exits_zero() -> None:
    argv = SERVE + ["--node", "p", "--mode", "decode", "--grpc-port", "0", "--metrics-port", "0", "--speed-up", "10", "--insecure"]
    argv += ["--l2-pages", "512", "--shutdown-grace-s", "20", "--state-interval-s", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(read_line(proc, 60))
        assert info["node"] == "p" and info["mode"] == "decode" and info["address"].startswith("127.0.0.1:")
        channel = grpc.insecure_channel(info["address"])
        agent = rpc.NodeAgentStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        request = pb.SubmitDecodeRequest(request_id="long", branch_id="b", prompt_tokens=10, output_tokens=600, t_acc=1.0)
        stream = agent.SubmitDecode(request, timeout=60)
        first = next(stream)
        assert first.WhichOneof("progress") == "accepted"
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while health.Check(health_pb2.HealthCheckRequest(), timeout=5).status != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "health never turned NOT_SERVING after SIGTERM"
            time.sleep(0.01)
        late = pb.SubmitDecodeRequest(request_id="late", branch_id="b", prompt_tokens=10, output_tokens=5, t_acc=1.0)
        with pytest.raises(grpc.RpcError) as refused:
            list(agent.SubmitDecode(late, timeout=10))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        rest = list(stream)  # the running decode finishes despite the signal
        assert rest[-1].WhichOneof("progress") == "finished" and rest[-1].finished.output_tokens == 600
        assert sum(m.tokens.new_tokens for m in rest if m.WhichOneof("progress") == "tokens") == 600
        channel.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_bad_settings_exit_2_naming_the_field() -> None:
    done = subprocess.run(SERVE + ["--host", "0.0.0.0", "--speed-up", "-1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "host" in done.stderr and "wildcard" in done.stderr and "speed_up" in done.stderr
