"""A minimal NodeAgent gRPC servicer for operator tests: `SwitchPhase` and `GetState` with the real stubs.

It is served by the node agent's own server assembly (`node_agent.api.server.start_server`) on 127.0.0.1,
so the operator talks to it exactly as to a node agent. Tests use real node agent processes
(`node_agent_processes.start_agents`, same `node`/`host`/`port`/`stop()`) and this fake only where they
need a failure a real agent does not produce on demand, or need to count calls.

Failure injection: `fail_switches` answers that many SwitchPhase calls UNAVAILABLE; `reject_target`
answers FAILED_PRECONDITION for switches to that phase; `drain_seconds` sleeps (wall clock) before
switching, as a node finishing its running requests would.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc

from evolving_infra.core.types import NodeMode, Phase
from evolving_infra.node_agent.api.convert import mode_to_proto, phase_from_proto, phase_to_proto, switch_state_to_proto
from evolving_infra.node_agent.api.server import RunningServer, start_server
from evolving_infra.node_agent.engine.outputs import SwitchState
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc


@dataclass
class FakeState:
    node: str
    phase: Phase
    generation: int = 0
    switched: bool = False
    drain_seconds: float = 0.0
    fail_switches: int = 0
    reject_target: Phase | None = None
    calls: list[tuple[Phase, int]] = field(default_factory=list)


class FakeNodeAgent(rpc.NodeAgentServicer):
    def __init__(self, state: FakeState) -> None:
        self.state = state
        self._lock = threading.Lock()

    def SwitchPhase(self, request: pb.SwitchPhaseRequest, context: grpc.ServicerContext) -> pb.SwitchPhaseResponse:
        target = phase_from_proto(request.target)
        start = time.monotonic()
        with self._lock:
            s = self.state
            s.calls.append((target, request.generation))
            if s.fail_switches > 0:
                s.fail_switches -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "injected: the node is restarting")
            if s.reject_target is target:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"injected: refusing {target.value}")
            if request.generation < s.generation:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"generation {request.generation} < {s.generation}")
            if s.phase is target and s.generation == request.generation:
                return pb.SwitchPhaseResponse(phase=phase_to_proto(target), generation=s.generation, already_serving=True)
        time.sleep(s.drain_seconds)
        with self._lock:
            s.phase, s.generation, s.switched = target, request.generation, True
        took = time.monotonic() - start
        return pb.SwitchPhaseResponse(
            phase=phase_to_proto(target), generation=request.generation, drain_seconds=took * 0.9, switch_seconds=took
        )

    def GetState(self, request: pb.GetStateRequest, context: grpc.ServicerContext) -> pb.NodeState:
        with self._lock:
            s = self.state
            mode = NodeMode.PREFILL if s.phase is Phase.PREFILL else NodeMode.DECODE
            return pb.NodeState(
                node=s.node,
                mode=mode_to_proto(mode),
                switch_state=switch_state_to_proto(SwitchState.SWITCHED if s.switched else SwitchState.SERVING),
                generation=s.generation,
            )


@dataclass
class AgentHandle:
    node: str
    host: str
    port: int
    state: FakeState
    server: RunningServer | None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None)
            self.server = None


def start_agents(phases: dict[str, Phase]) -> list[AgentHandle]:
    """One agent per node on 127.0.0.1, serving the given phases."""
    handles = []
    for node, phase in sorted(phases.items()):
        state = FakeState(node=node, phase=phase)
        server = start_server(FakeNodeAgent(state), host="127.0.0.1", port=0, workers=4)
        port = int(server.address.rsplit(":", 1)[1])
        handles.append(AgentHandle(node, "127.0.0.1", port, state, server))
    return handles


def free_port() -> int:
    """A loopback port with nothing listening (for an unreachable agent)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
