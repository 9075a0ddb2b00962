"""`NodeAgentSettings`: the one validated settings object of a node agent process.

Sources, later ones winning: the field defaults, a YAML file (`--settings FILE`), environment variables
with the prefix `EVOLVING_NODE_` (nested fields with `__`, e.g. `EVOLVING_NODE_TRANSFER__CHUNK_BYTES`),
then command-line flags. `load_settings(file, flags)` merges them; a bad value raises `SettingsError`
naming every field at fault and what is allowed. Nothing is read at import time.

Emulated memory: a profile describes real hardware (DeepSeek-V4-Flash on 4xH200 holds 70 M tokens in host
memory, 237 KB of KV per 64-token page), far more than a test machine should map. The emulated engine
therefore runs with `l2_pages` host pages (default: the profile's, capped at 16,384) of `page_bytes`
emulated bytes each (default 4 KiB instead of the real page size), and GPU pages in the profile's
L1:L2 ratio. Iteration times still come from the profile, divided by `speed_up`.

Boundary: configuration values and their resolution against a profile; no sockets, no engine.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from evolving_infra.core.eviction import EVICTION, EvictionPolicyName
from evolving_infra.core.plugins import load_plugins
from evolving_infra.core.types import NodeMode
from evolving_infra.node_agent.engine.outputs import DataPlane
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.node_agent.transfer.arena import MAX_ARENA_BYTES
from evolving_infra.node_agent.transfer.base import TransportKind, TransportSettings
from evolving_infra.settings import SettingsError, YamlFileSource, load_layered

DEFAULT_PROFILE = "deepseek-v4-flash-4xh200-tp4"
EMULATED_L2_PAGES_CAP = 16_384
"""Default cap on host pages of the emulated engine (the profile's count when smaller)."""
EMULATED_PAGE_BYTES = 4096
"""Default bytes per emulated KV page in the host arena."""
MAX_PAGES = 1 << 22
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class NodeAgentSettings(BaseSettings):
    """Settings of one node agent (sources and the emulated memory scaling in the module docstring)."""

    model_config = SettingsConfigDict(
        env_prefix="EVOLVING_NODE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    node: str = Field(
        default="node-0",
        description="Node id reported in KV events and state (letters, digits, '.', '_', '-'; 1-253 chars).",
    )
    allow_wildcard_host: bool = Field(
        default=False, description="Allow binding a wildcard host (all interfaces); off by default."
    )
    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Address the gRPC and metrics servers bind. A wildcard (0.0.0.0, ::) needs allow_wildcard_host.",
    )
    grpc_port: int = Field(default=50051, ge=0, le=65535, description="gRPC port (0: any free port).")
    metrics_port: int = Field(default=9400, ge=0, le=65535, description="Prometheus /metrics port (0: any free port).")
    metrics_enabled: bool = Field(default=True, description="Serve the Prometheus /metrics endpoint.")
    profile: str = Field(
        default=DEFAULT_PROFILE,
        min_length=1,
        description="Hardware profile: a built-in name or a .yaml/.yml/.json file (see docs/hardware-profiles.md).",
    )
    mode: NodeMode = Field(default=NodeMode.COLLOCATED, description="Initial mode: collocated, prefill or decode.")
    eviction: str = Field(
        default=EvictionPolicyName.BRANCH_COUNT.value,
        min_length=1,
        description="Host (L2) eviction order: branch-count, lru, or one a plugin module declares.",
    )
    plugins: list[str] = Field(
        default_factory=list,
        description="Policy modules to load before the eviction order is looked up (dotted module names or .py paths).",
    )
    data_plane: DataPlane = Field(
        default=DataPlane.ASYNC_FETCH,
        description="How host KV reaches GPU memory on prefill: async-fetch (ours) or hicache-loadback.",
    )
    transfer: TransportSettings = Field(
        default=TransportSettings(kind=TransportKind.GRPC),
        description="KV transport (kind: grpc or mooncake-tcp; chunk sizes; checksum checks).",
    )
    peers: dict[str, str] = Field(
        default_factory=dict,
        description="Known peers: node id -> gRPC address (host:port), used when a fetch run names no address.",
    )
    speed_up: float = Field(
        default=1.0, gt=0, le=1e6, description="Emulated time runs this many times faster than the wall clock (>0)."
    )
    l2_pages: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PAGES,
        description=f"Host (L2) pages of the emulated engine (default: the profile's, at most {EMULATED_L2_PAGES_CAP}).",
    )
    l1_pages: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PAGES,
        description="GPU (L1) pages of the emulated engine (default: l2_pages in the profile's L1:L2 ratio).",
    )
    page_bytes: int = Field(
        default=EMULATED_PAGE_BYTES, ge=64, le=1 << 24, description="Bytes of one emulated KV page in the host arena."
    )
    arena_slack_pages: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PAGES,
        description="Extra arena slots beyond l2_pages for KV pulled for decodes before admission and for "
        "evicted pages still being read by peers (default: a quarter of l2_pages, at least 64).",
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of the iteration-time noise generator.")
    noise: float = Field(
        default=0.05, ge=0, le=1,
        description="Relative standard deviation of log-normal iteration-time noise (0: none; ignored with exact_models).",
    )
    exact_models: bool = Field(
        default=False,
        description="Debugging switch: iteration times are eq. 1 and 2 alone (no ground-truth effects, no noise).",
    )
    event_queue: int = Field(
        default=4096,
        ge=16,
        le=1_000_000,
        description="Messages buffered per StreamEvents subscriber; one that falls further behind is dropped.",
    )
    state_interval_s: float = Field(
        default=1.0, ge=0, le=3600, description="Seconds between state snapshots on StreamEvents (0: only on change)."
    )
    decode_pull_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="How long a decode waits for its prompt KV to appear on the prefill node, seconds.",
    )
    shutdown_grace_s: float = Field(
        default=30.0, ge=0, le=3600, description="On SIGTERM/SIGINT, how long accepted requests may run on, seconds."
    )
    workers: int = Field(default=8, ge=1, le=256, description="Threads for KV transfers and page streaming.")
    check_invariants: bool = Field(default=False, description="Check the engine's page accounting after every call.")
    cluster_token_file: Path | None = Field(
        default=None, description="File holding the shared cluster token callers must send (and this node sends to peers)."
    )
    tls_cert_file: Path | None = Field(default=None, description="Mutual TLS: this node's certificate chain (PEM).")
    tls_key_file: Path | None = Field(default=None, description="Mutual TLS: this node's private key (PEM).")
    tls_ca_file: Path | None = Field(default=None, description="Mutual TLS: the cluster CA that signs every member (PEM).")
    tls_server_name: str | None = Field(
        default=None, min_length=1, max_length=253,
        description="Mutual TLS: the name peers' certificates carry, checked instead of the address dialled (in "
        "Kubernetes the node agents' Service name: pod IPs are in no certificate).",
    )  # fmt: skip
    insecure: bool = Field(
        default=False,
        description="Serve without authentication when no token or TLS files are given (local runs only).",
    )
    peer_networks: list[str] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"],
        description="Networks (CIDR) a fetch run's peer_address may point into, besides the addresses in peers.",
    )
    peer_service: str | None = Field(
        default=None,
        min_length=3,
        max_length=300,
        description="The cluster's node-agent Service (host:port, a headless Service in Kubernetes): a fetch run's "
        "peer_address must then be one of the addresses it resolves to (refreshed every peer_refresh_s).",
    )
    peer_refresh_s: float = Field(default=5.0, gt=0, le=3600, description="How often peer_service is resolved again.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, YamlFileSource(settings_cls))

    @field_validator("node")
    @classmethod
    def _node_id(cls, value: str) -> str:
        if not _NODE_ID.match(value):
            raise ValueError(
                f"node id {value!r} must be 1-253 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return value

    @field_validator("host")
    @classmethod
    def _not_wildcard(cls, value: str, info: ValidationInfo) -> str:
        if value.strip() in WILDCARD_HOSTS and not info.data.get("allow_wildcard_host", False):
            raise ValueError(
                f"{value!r} is a wildcard address (every interface); give the node's own address "
                "(e.g. 127.0.0.1 or the pod IP) or set allow_wildcard_host"
            )
        return value

    @field_validator("peers")
    @classmethod
    def _peer_addresses(cls, value: dict[str, str]) -> dict[str, str]:
        for node, address in value.items():
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ValueError(f"peer {node!r}: address {address!r} must be host:port with a port 1-65535")
        return value

    @field_validator("peer_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as error:
                raise ValueError(f"peer network {network!r} is not a CIDR network: {error}") from None
        return value

    @model_validator(mode="after")
    def _eviction_declared(self) -> NodeAgentSettings:
        load_plugins(self.plugins)
        EVICTION.get(self.eviction, "eviction")
        return self

    @model_validator(mode="after")
    def _arena_size(self) -> NodeAgentSettings:
        if self.l2_pages is not None:
            slots = self.l2_pages + self.slack_for(self.l2_pages)
            if slots * self.page_bytes > MAX_ARENA_BYTES:
                raise ValueError(
                    f"arena of {slots} pages x {self.page_bytes} bytes exceeds {MAX_ARENA_BYTES} bytes; "
                    "lower l2_pages or page_bytes"
                )
        return self

    def slack_for(self, l2_pages: int) -> int:
        return self.arena_slack_pages if self.arena_slack_pages is not None else max(64, l2_pages // 4)


@dataclass(frozen=True, slots=True)
class EmulatedMemory:
    """Page counts and sizes the emulated engine and the arena run with (resolved against a profile)."""

    l1_pages: int
    l2_pages: int
    page_bytes: int
    arena_slots: int
    profile: HardwareProfile
    """The profile with its L1/L2 token capacities replaced by the emulated page counts."""


def resolve_memory(settings: NodeAgentSettings, profile: HardwareProfile) -> EmulatedMemory:
    """The emulated L1/L2 sizes for `profile` (defaults and caps in the module docstring)."""
    l2 = settings.l2_pages or min(profile.l2_pages, EMULATED_L2_PAGES_CAP)
    ratio = profile.l1_tokens / profile.l2_tokens
    l1 = settings.l1_pages or max(1, min(profile.l1_pages, round(l2 * ratio)))
    slots = l2 + settings.slack_for(l2)
    if slots * settings.page_bytes > MAX_ARENA_BYTES:
        raise SettingsError("settings", [("l2_pages", f"arena of {slots} x {settings.page_bytes} bytes is too large")])
    data = profile.model_dump()
    data.update(l1_tokens=l1 * profile.page_tokens, l2_tokens=l2 * profile.page_tokens)
    return EmulatedMemory(l1, l2, settings.page_bytes, slots, HardwareProfile.model_validate(data))


def load_settings(file: Path | None = None, flags: Mapping[str, Any] | None = None) -> NodeAgentSettings:
    """Defaults < YAML `file` < `EVOLVING_NODE_*` environment < `flags` (None values in flags are ignored)."""
    return load_layered(
        NodeAgentSettings,
        file,
        flags,
        allowed_for=lambda where: TransportSettings if where.startswith("transfer.") else NodeAgentSettings,
    )
