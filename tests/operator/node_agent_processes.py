"""Real node agent processes on 127.0.0.1 for operator tests: `evolving-infra node-agent serve`.

`start_agents(phases)` starts one process per node (all at once), in the given phase, with a small
emulated memory and a speed-up, and returns `AgentProcess` handles with the same `node`, `host`, `port`
and `stop()` as the fake's (`fake_node_agent.AgentHandle`). Each address comes from the JSON line the
process prints once serving. `stop()` sends SIGTERM and waits (bounded), killing a process that does not
exit. `get_state()` asks the process over gRPC what it serves now.

Processes run `sys.executable -P -m evolving_infra.cli.main`: `-P` keeps the repository root off
`sys.path`, so its `operator/` folder never shadows the standard library's `operator`.

Boundary: process lifetime and one gRPC read; what the operator does with the agents is the tests'.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc

from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.node_agent.api.convert import mode_from_proto
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

PROFILE = "glm-5.2-4xgb300-tp4"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
SMALL_MEMORY = ("--l2-pages", "256", "--l1-pages", "64", "--page-bytes", "256", "--workers", "2")
"""A few hundred emulated pages of 256 bytes: a few hundred kilobytes of arena per agent."""


def cli_command(*args: str) -> list[str]:
    """The `evolving-infra` command line run by this interpreter (with -P, see the module docstring)."""
    return [sys.executable, "-P", "-m", "evolving_infra.cli.main", *args]


@dataclass
class AgentProcess:
    node: str
    host: str
    port: int
    info: dict[str, Any]
    process: subprocess.Popen[str] | None
    log: IO[str] = field(repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def get_state(self, timeout: float = 5.0) -> pb.NodeState:
        """The process's own `GetState` answer."""
        with grpc.insecure_channel(self.address) as channel:
            return rpc.NodeAgentStub(channel).GetState(pb.GetStateRequest(), timeout=timeout)

    def serving(self) -> tuple[NodeMode, int]:
        """(mode, switch generation) the process reports."""
        state = self.get_state()
        return mode_from_proto(state.mode), int(state.generation)

    def stderr(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int | None:
        """SIGTERM, wait up to STOP_TIMEOUT_S, then SIGKILL; the exit status (None if already stopped)."""
        proc, self.process = self.process, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()
        self.log.close()
        os.unlink(self.log.name)
        return proc.returncode


def _read_ready_line(proc: subprocess.Popen[str], deadline: float) -> dict[str, Any]:
    """The JSON line a node agent prints once serving (bounded by `deadline`, a monotonic time)."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError("the node agent printed no ready line in time")
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the node agent exited with status {proc.wait(STOP_TIMEOUT_S)} before serving")
            if line.lstrip().startswith("{"):
                return dict(json.loads(line))


def start_agents(
    phases: Mapping[str, Phase],
    speed_up: float = 1000.0,
    extra_args: Sequence[str] = (),
    settings_file: Path | None = None,
    env: Mapping[str, str] | None = None,
    memory_args: Sequence[str] = SMALL_MEMORY,
    identity_args: bool = True,
) -> list[AgentProcess]:
    """One node agent process per node on 127.0.0.1 (ports chosen by the OS), serving the given phases.

    Without `identity_args` the node id, host and profile flags are left out, so the settings file and
    `env` decide them (as in a pod); the handle's `node` is still the key given in `phases`.
    """
    started: list[tuple[str, subprocess.Popen[str], IO[str]]] = []
    handles: list[AgentProcess] = []
    try:
        for node, phase in sorted(phases.items()):
            args = ["node-agent", "serve", "--log-level", "WARNING", "--insecure"]
            if settings_file is not None:
                args += ["--settings", str(settings_file)]
            if identity_args:
                args += ["--node", node, "--host", "127.0.0.1", "--profile", PROFILE]
            args += [
                "--grpc-port", "0", "--no-metrics-enabled", "--mode", phase.value, "--speed-up", str(speed_up),
                "--shutdown-grace-s", "2", *memory_args, *extra_args,
            ]  # fmt: skip
            log = tempfile.NamedTemporaryFile("w+", prefix=f"node-agent-{node}-", suffix=".log", delete=False)  # noqa: SIM115
            proc = subprocess.Popen(
                cli_command(*args), stdout=subprocess.PIPE, stderr=log, text=True,
                env={**os.environ, **(env or {})}, start_new_session=True,
            )  # fmt: skip
            started.append((node, proc, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        for node, proc, log in started:
            handle = AgentProcess(node, "", 0, {}, proc, log)
            handles.append(handle)
            try:
                info = _read_ready_line(proc, deadline)
            except (TimeoutError, RuntimeError) as exc:
                raise RuntimeError(f"node agent {node}: {exc}; stderr:\n{handle.stderr()[-2000:]}") from exc
            host, _, port = str(info["address"]).rpartition(":")
            handle.host, handle.port, handle.info = host, int(port), info
        return handles
    except BaseException:
        for node, proc, log in started[len(handles):]:
            handles.append(AgentProcess(node, "", 0, {}, proc, log))
        for handle in handles:
            handle.stop()
        raise
