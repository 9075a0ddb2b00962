"""`RouterSettings`: the one validated settings object of a live router process.

It is the router's only settings object: the HTTP front end's fields are declared once in
`router/http/settings.HttpFrontFields` and inherited here; `http()` hands the front end its settings.

Sources, later ones winning: the field defaults, a YAML file (`--settings FILE`), environment variables with
the prefix `EVOLVING_ROUTER_` (nested fields with `__`), then command-line flags. `load_settings(file, flags)`
merges them; a bad value raises `SettingsError` naming every field at fault. Nothing is read at import time.

Node addresses: a static map `nodes` (node id -> host:port, for a local cluster) or `nodes_dns`, a headless
Service name with port (`name.namespace.svc:50051`) whose addresses are resolved and asked for their node id.

Boundary: configuration values only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from evolving_infra.core.eviction import EVICTION, EvictionPolicyName
from evolving_infra.core.types import Phase
from evolving_infra.core.plugins import load_plugins
from evolving_infra.router.http.settings import HttpFrontFields, RouterHttpSettings
from evolving_infra.router.planner import PlannerName
from evolving_infra.router.planner.registry import PLANNERS
from evolving_infra.router.routing import DecodePolicyName, PrefillPolicyName
from evolving_infra.router.routing.registry import DECODE_BINDING, PREFILL_ROUTING
from evolving_infra.settings import SettingsError, YamlFileSource, load_layered



class ApplierKind(enum.Enum):
    """Who carries out the planner's split changes."""

    LOCAL = "local"
    """The router calls SwitchPhase on the nodes itself (local cluster)."""
    KUBERNETES = "kubernetes"
    """The router writes the CR's status.targetSplit; the operator switches the nodes."""
    NONE = "none"
    """Decisions are logged and counted only."""


def _address(value: str, where: str) -> str:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{where}: address {value!r} must be host:port with a port 1-65535")
    return value


class RouterSettings(BaseSettings, HttpFrontFields):
    """Settings of the live router (sources in the module docstring)."""

    model_config = SettingsConfigDict(
        env_prefix="EVOLVING_ROUTER_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    metrics_port: int = Field(default=9401, ge=0, le=65535, description="Prometheus /metrics port (0: any free port).")
    metrics_enabled: bool = Field(default=True, description="Serve the router's own /metrics endpoint.")
    default_max_tokens: int = Field(default=256, ge=1, le=1_000_000, description="Output tokens when a request sets no max_tokens.")
    nodes: dict[str, str] = Field(default_factory=dict, description="Static node agents: node id -> gRPC host:port.")
    nodes_dns: str | None = Field(
        default=None, description="Headless Service name:port whose addresses are the node agents (Kubernetes)."
    )
    plugins: list[str] = Field(
        default_factory=list,
        description="Policy modules to load before the policies are looked up (dotted module names or .py paths).",
    )
    planner: str = Field(default=PlannerName.OURS.value, min_length=1, description="Phase-split planner (a declared planner policy).")
    planner_settings: dict[str, Any] = Field(default_factory=dict, description="Settings of the planner (its declared fields).")
    window_s: float = Field(default=600.0, gt=0, le=86_400, description="Planning window, seconds (paper: 600).")
    slices: int = Field(default=10, ge=1, le=1000, description="Slices per planning window (paper: 10).")
    prefill_routing: str = Field(default=PrefillPolicyName.TTFT.value, min_length=1, description="Prefill routing policy (a declared one).")
    routing_settings: dict[str, Any] = Field(default_factory=dict, description="Settings of the prefill routing policy (its declared fields).")
    decode_routing: str = Field(default=DecodePolicyName.FEWEST_REQUESTS.value, min_length=1, description="Decode binding policy (a declared one).")
    decode_settings: dict[str, Any] = Field(default_factory=dict, description="Settings of the decode binding policy (its declared fields).")
    eviction: str = Field(
        default=EvictionPolicyName.BRANCH_COUNT.value, min_length=1,
        description="Host eviction order of the nodes (a declared one); counts are pushed only to an order that reads them."
    )
    shared_pool: bool = Field(default=True, description="Host memory of all nodes is one pool (prefill nodes fetch from peers).")
    warmup_s: float = Field(
        default=0.0, ge=0, le=86_400,
        description="Collocated warmup T_learn, seconds: nodes serve both phases while their models are fitted, then "
        "move to initial_split (0: no warmup, the profile's models).",
    )  # fmt: skip
    fit_interval_s: float | None = Field(
        default=60.0, gt=0, le=86_400, description="During the warmup, refresh the provisional routing models this often (seconds)."
    )
    control_log: Path | None = Field(
        default=None,
        description="Append the control core's log (warmup, decisions, switch orders and completions) here as JSON lines.",
    )
    initial_split: dict[str, Phase] = Field(
        default_factory=dict,
        description="Phase of each node after the warmup (node id -> prefill|decode); nodes not named keep the phase they serve.",
    )
    profile: str = Field(default="deepseek-v4-flash-4xh200-tp4", min_length=1, description="Hardware profile: the models' shape and coefficients.")
    applier: ApplierKind = Field(default=ApplierKind.LOCAL, description="Who applies split changes: local, kubernetes or none.")
    cluster_name: str | None = Field(default=None, description="The AgentServingCluster whose status the kubernetes applier writes.")
    namespace: str = Field(default="default", min_length=1, description="Namespace of that cluster.")
    rpc_timeout_s: float = Field(default=10.0, gt=0, le=3600, description="Deadline of one unary call to a node agent.")
    switch_timeout_s: float = Field(default=300.0, gt=0, le=86_400, description="Deadline of one SwitchPhase call.")
    max_attempts: int = Field(default=3, ge=1, le=20, description="Tries per request before its first token (re-routed after a failure).")
    bind_wait_s: float = Field(default=30.0, gt=0, le=3600, description="How long a request waits for a decode node with KV room.")
    seed: int = Field(default=0, ge=0, description="Seed of the policies' random tie-breaks.")
    record_trace: Path | None = Field(default=None, description="At shutdown, write what was served as an agent trace (lengths, page hashes, times; never text) to this file.")
    record_models: Path | None = Field(default=None, description="At shutdown, write the fitted node models (JSON, for `simulate --models-from`) to this file.")
    record_time_scale: float = Field(default=1.0, gt=0, description="Recorded times are the router's clock times this factor (a local run's nodes run speed_up times faster).")
    branch_snapshot_file: Path | None = Field(default=None, description="Keep the branch table in this file (rewritten atomically while it changes, and at shutdown) and continue from it at start, so a restarted router keeps every active branch (router/branch_snapshot.py).")
    branch_snapshot_interval_s: float = Field(default=1.0, gt=0, le=3600, description="At most this many seconds of branch table changes are lost when the router dies.")
    # security toward the node agents (docs/security.md); the HTTP API's keys and limits are HttpFrontFields
    cluster_token_file: Path | None = Field(default=None, description="Shared cluster token sent to the node agents.")
    tls_cert_file: Path | None = Field(default=None, description="Mutual TLS with the node agents: the router's certificate (PEM).")
    tls_key_file: Path | None = Field(default=None, description="Mutual TLS: the router's private key (PEM).")
    tls_ca_file: Path | None = Field(default=None, description="Mutual TLS: the cluster CA (PEM).")
    tls_server_name: str | None = Field(default=None, min_length=1, max_length=253, description="Mutual TLS: the name the node agents' certificates carry, checked instead of the address dialled (in Kubernetes their Service's name).")
    insecure: bool = Field(default=False, description="Serve without API keys and call node agents without credentials (local runs only).")

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

    @field_validator("nodes")
    @classmethod
    def _node_addresses(cls, value: dict[str, str]) -> dict[str, str]:
        for node, address in value.items():
            _address(address, f"node {node!r}")
        return value

    @field_validator("nodes_dns")
    @classmethod
    def _dns(cls, value: str | None) -> str | None:
        return None if value is None else _address(value, "nodes_dns")

    @model_validator(mode="after")
    def _policies(self) -> RouterSettings:
        """Load the plugins, then check each policy's name and settings against its declaration."""
        load_plugins(self.plugins)
        PLANNERS.validate(self.planner, planner_settings(self), "planner_settings")
        PREFILL_ROUTING.validate(self.prefill_routing, self.routing_settings, "routing_settings")
        DECODE_BINDING.validate(self.decode_routing, self.decode_settings, "decode_settings")
        EVICTION.get(self.eviction, "eviction")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> RouterSettings:
        if bool(self.nodes) == (self.nodes_dns is not None):
            raise ValueError("give exactly one of nodes (static id -> host:port) and nodes_dns (headless Service name:port)")
        if self.applier is ApplierKind.KUBERNETES and not self.cluster_name:
            raise ValueError("applier 'kubernetes' needs cluster_name (the AgentServingCluster to write status to)")
        return self


    def http(self, context_tokens: int | None = None) -> RouterHttpSettings:
        """The HTTP front end's settings: its inherited fields, `context_tokens` when none is set (the live router
        passes one node's GPU tokens), and the admin server on `metrics_port` when metrics are enabled."""
        fields = {name: getattr(self, name) for name in HttpFrontFields.model_fields}
        if fields["context_tokens"] is None:
            fields["context_tokens"] = context_tokens
        return RouterHttpSettings(**fields, admin_port=self.metrics_port if self.metrics_enabled else None)


def planner_settings(settings: RouterSettings) -> dict[str, Any]:
    """The keyword settings of the chosen planner (ours takes the window from `window_s` and `slices`)."""
    out = dict(settings.planner_settings)
    if settings.planner == PlannerName.OURS.value and "window" not in out:
        out.setdefault("window_s", settings.window_s)
        out.setdefault("slices", settings.slices)
    return out


def load_settings(file: Path | None = None, flags: Mapping[str, Any] | None = None) -> RouterSettings:
    """Defaults < YAML `file` < `EVOLVING_ROUTER_*` environment < `flags` (None values in flags are ignored)."""
    return load_layered(RouterSettings, file, flags)
