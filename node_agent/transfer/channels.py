"""gRPC channels to peer node agents, one per address, sized for page streams.

Boundary: channel lifetime only (no retries; callers map errors).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from evolving_infra.node_agent.transfer.base import MAX_MESSAGE_BYTES
from evolving_infra.proto.v1 import node_agent_pb2_grpc as rpc

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)


class PeerChannels:
    """Open channels to peers by gRPC address (`host:port`); `close` closes them all."""

    def __init__(self, factory: Callable[[str], grpc.Channel] | None = None) -> None:
        """`factory(address)` opens a channel (default: insecure); it carries the cluster's credentials."""
        self._factory = factory or (lambda address: grpc.insecure_channel(address, options=CHANNEL_OPTIONS))
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def stub(self, address: str) -> rpc.NodeAgentStub:
        if not address or ":" not in address:
            raise ValueError(f"peer address must be host:port, got {address!r}")
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._factory(address)
                self._channels[address] = channel
        return rpc.NodeAgentStub(channel)

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
