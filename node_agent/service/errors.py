"""How the node agent's failures become gRPC status codes (and, for refused requests, a `RejectReason`).

| failure | status | reject reason |
|---|---|---|
| malformed input (`ValueError`: pages, tokens, enums, unknown peer) | INVALID_ARGUMENT | - |
| wrong phase for the node's mode | FAILED_PRECONDITION | WRONG_PHASE |
| work refused while a phase switch drains | FAILED_PRECONDITION | DRAINING |
| stale or conflicting switch generation | FAILED_PRECONDITION | - |
| a request that can never fit in GPU memory, or no arena room for its KV now | RESOURCE_EXHAUSTED | TOO_LARGE / - |
| a request id the node already holds | ALREADY_EXISTS | DUPLICATE |
| a decode handed back by a switch, a concurrent switch, a transfer that failed | ABORTED (retry elsewhere or later) | - |
| prompt KV that never appeared on the prefill node | NOT_FOUND | - |
| the peer does not serve the transport | FAILED_PRECONDITION | - |
| the node is shutting down | UNAVAILABLE | - |

The reject reason travels in the trailing metadata key `evolving-reject-reason` (its enum name).

Boundary: the mapping only.
"""

from __future__ import annotations

import grpc

from evolving_infra.node_agent.engine import (
    DuplicateRequest,
    RequestTooLarge,
    SwitchInProgress,
    UnknownRequest,
    WrongPhase,
)
from evolving_infra.node_agent.service.mover import UnknownPeer
from evolving_infra.node_agent.transfer.errors import (
    ArenaFull,
    ChecksumMismatch,
    PagesMissing,
    TransferError,
    TransportUnavailable,
)
from evolving_infra.proto.convert import REJECT_REASON_KEY as REJECT_REASON_KEY  # (the wire key, shared)
from evolving_infra.proto.v1 import node_agent_pb2 as pb


class ServiceError(Exception):
    """A failure with its status code and, for refused requests, why."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: int = pb.REJECT_REASON_UNSPECIFIED) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.reason == pb.REJECT_REASON_UNSPECIFIED:
            return ()
        return ((REJECT_REASON_KEY, pb.RejectReason.Name(self.reason)),)


def unavailable(node: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAVAILABLE, f"node {node} is shutting down; send the work elsewhere")


def to_service_error(error: Exception, draining: bool = False) -> ServiceError:
    """The status for an engine, transfer or input error (table in the module docstring)."""
    message = str(error)
    if isinstance(error, ServiceError):
        return error
    if isinstance(error, SwitchInProgress):
        return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message, pb.REJECT_REASON_DRAINING)
    if isinstance(error, WrongPhase):
        reason = pb.REJECT_REASON_DRAINING if draining else pb.REJECT_REASON_WRONG_PHASE
        return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message, reason)
    if isinstance(error, RequestTooLarge):
        return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, message, pb.REJECT_REASON_TOO_LARGE)
    if isinstance(error, DuplicateRequest):
        return ServiceError(grpc.StatusCode.ALREADY_EXISTS, message, pb.REJECT_REASON_DUPLICATE)
    if isinstance(error, ArenaFull):
        return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"no host memory for the request's KV now: {message}")
    if isinstance(error, PagesMissing):
        return ServiceError(grpc.StatusCode.NOT_FOUND, message)
    if isinstance(error, TransportUnavailable):
        return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, message)
    if isinstance(error, ChecksumMismatch | TransferError):
        return ServiceError(grpc.StatusCode.ABORTED, f"KV transfer failed (retry): {message}")
    if isinstance(error, ValueError | UnknownPeer | UnknownRequest):
        return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)
    return ServiceError(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {message}")
