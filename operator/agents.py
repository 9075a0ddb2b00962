"""The operator's client of the node agents' gRPC API: `SwitchPhase` and `GetState`, with deadlines.

Protobuf stays here: callers get `SwitchResult` and `AgentState` dataclasses with the core's enums, or one
of two errors that say what happens next:
- `AgentUnavailable` (UNAVAILABLE, DEADLINE_EXCEEDED, connection refused, ...): temporary, retry later;
- `AgentRejected` (FAILED_PRECONDITION, INVALID_ARGUMENT, ...): this request will never succeed as is.

Calls run the blocking stubs in a worker thread (the deadlines are enforced by gRPC on the wall clock),
one channel per address, reused. Each call presents the cluster's credentials (`use_credentials`: the
reconciler gives them for the cluster's node agent addresses, from its token and TLS Secrets).

Boundary: transport and conversion; what to switch and when is decided in `switch_plan`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import grpc

from evolving_infra.core.types import NodeMode, Phase, SwitchMode
from evolving_infra.node_agent.api.convert import mode_from_proto, phase_from_proto, switch_state_from_proto
from evolving_infra.node_agent.engine.outputs import SwitchState
from evolving_infra.node_agent.api.auth import ClusterCredentials, blocking_channel
from evolving_infra.node_agent.transfer.channels import CHANNEL_OPTIONS
from evolving_infra.proto.convert import SwitchHow, switch_request_to_proto
from evolving_infra.proto.v1 import node_agent_pb2 as pb
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

TEMPORARY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)


@dataclass(frozen=True, slots=True)
class SwitchResult:
    """What a node reported after a `SwitchPhase`."""

    phase: Phase
    generation: int
    drain_seconds: float
    switch_seconds: float
    handed_back: int
    already_serving: bool


@dataclass(frozen=True, slots=True)
class AgentState:
    """The part of a node's `GetState` the operator records."""

    node: str
    mode: NodeMode
    switch_state: SwitchState
    generation: int

    @property
    def phase(self) -> Phase | None:
        """The phase served, or None while collocated (warmup)."""
        return {NodeMode.PREFILL: Phase.PREFILL, NodeMode.DECODE: Phase.DECODE}.get(self.mode)


class AgentError(Exception):
    """A node agent call failed; `address` and the gRPC status name say where and why."""

    def __init__(self, address: str, code: str, detail: str) -> None:
        super().__init__(f"node agent {address}: {code}: {detail}")
        self.address = address
        self.code = code
        self.detail = detail


class AgentUnavailable(AgentError):
    """Temporary: the agent did not answer in time or could not be reached."""


class AgentRejected(AgentError):
    """Permanent for this request: the agent refused it (e.g. a stale switch generation)."""


class NodeAgentClient(Protocol):
    """What the operator needs from node agents (tests may substitute their own)."""

    async def switch_phase(
        self, address: str, target: Phase, generation: int, mode: SwitchMode = SwitchMode.IN_PLACE, relaunch_s: float = 0.0
    ) -> SwitchResult: ...

    async def get_state(self, address: str) -> AgentState: ...

    def use_credentials(self, addresses: Iterable[str], credentials: ClusterCredentials | None) -> None: ...

    def close(self) -> None: ...


def _error(address: str, exc: grpc.RpcError) -> AgentError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    cls = AgentUnavailable if code in TEMPORARY_CODES else AgentRejected
    return cls(address, code.name if code is not None else "UNKNOWN", detail)


class GrpcNodeAgentClient:
    """`NodeAgentClient` over gRPC with per-call deadlines (seconds). Calls to an address present the
    credentials last given for it (`use_credentials`: a cluster's token and/or mutual TLS), else none."""

    def __init__(self, switch_deadline: float, state_deadline: float) -> None:
        self._channels: dict[str, tuple[ClusterCredentials | None, grpc.Channel]] = {}
        self._credentials: dict[str, ClusterCredentials | None] = {}
        self._lock = threading.Lock()
        self.switch_deadline = switch_deadline
        self.state_deadline = state_deadline

    def use_credentials(self, addresses: Iterable[str], credentials: ClusterCredentials | None) -> None:
        """Present `credentials` on calls to these node agents from now on (a changed credential, e.g. a rotated
        token, reopens the address's channel at its next call)."""
        with self._lock:
            for address in addresses:
                self._credentials[address] = credentials

    def _stub(self, address: str) -> rpc.NodeAgentStub:
        if not address or ":" not in address:
            raise ValueError(f"node agent address must be host:port, got {address!r}")
        with self._lock:
            credentials = self._credentials.get(address)
            held = self._channels.get(address)
            if held is None or held[0] != credentials:
                if held is not None:
                    held[1].close()
                held = self._channels[address] = (credentials, blocking_channel(address, credentials, CHANNEL_OPTIONS))
        return rpc.NodeAgentStub(held[1])

    def _switch(self, address: str, target: Phase, generation: int, how: SwitchHow) -> SwitchResult:
        request = switch_request_to_proto(target, generation, how)
        try:  # a relaunch answers once the node serves again: the deadline covers its downtime
            reply = self._stub(address).SwitchPhase(request, timeout=self.switch_deadline + how.relaunch_s)
        except grpc.RpcError as exc:
            raise _error(address, exc) from None
        try:
            phase = phase_from_proto(reply.phase)
        except ValueError as exc:
            raise AgentRejected(address, "BAD_REPLY", str(exc)) from None
        if phase is not target:
            raise AgentRejected(address, "BAD_REPLY", f"asked for {target.value}, the node reports {phase.value}")
        return SwitchResult(
            phase=phase,
            generation=int(reply.generation),
            drain_seconds=float(reply.drain_seconds),
            switch_seconds=float(reply.switch_seconds),
            handed_back=len(reply.handed_back),
            already_serving=bool(reply.already_serving),
        )

    def _state(self, address: str) -> AgentState:
        try:
            reply = self._stub(address).GetState(pb.GetStateRequest(), timeout=self.state_deadline)
        except grpc.RpcError as exc:
            raise _error(address, exc) from None
        if reply.switch_state == pb.SWITCH_STATE_RELAUNCHING:  # serves nothing until its downtime is over
            raise AgentUnavailable(address, "RELAUNCHING", f"node {reply.node} relaunches for a phase switch")
        try:
            return AgentState(
                node=reply.node,
                mode=mode_from_proto(reply.mode),
                switch_state=switch_state_from_proto(reply.switch_state),
                generation=int(reply.generation),
            )
        except ValueError as exc:
            raise AgentRejected(address, "BAD_REPLY", str(exc)) from None

    async def switch_phase(
        self, address: str, target: Phase, generation: int, mode: SwitchMode = SwitchMode.IN_PLACE, relaunch_s: float = 0.0
    ) -> SwitchResult:
        try:
            how = SwitchHow(mode, relaunch_s)
        except ValueError as exc:  # a bad mode or downtime: refused before any call
            raise AgentRejected(address, "BAD_SWITCH_MODE", str(exc)) from None
        try:
            return await asyncio.to_thread(self._switch, address, target, generation, how)
        except ValueError as exc:  # a malformed address
            raise AgentRejected(address, "BAD_ADDRESS", str(exc)) from None

    async def get_state(self, address: str) -> AgentState:
        try:
            return await asyncio.to_thread(self._state, address)
        except ValueError as exc:
            raise AgentRejected(address, "BAD_ADDRESS", str(exc)) from None

    def close(self) -> None:
        with self._lock:
            channels, self._channels = [c for _, c in self._channels.values()], {}
        for channel in channels:
            channel.close()
