"""The gateway's settings: one validated, documented object (`evolving-infra gateway serve` flags map onto it).

Boundary: configuration values only; nothing is read at import time.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolving_infra.fleet.binding import DEFAULT_LOAD_FACTOR


class GatewaySettings(BaseModel):
    """Where the gateway listens, where it learns its partitions, and how it binds and forwards."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1, description="Address to bind (0.0.0.0 inside a pod).")
    port: int = Field(default=8080, ge=0, le=65535, description="API port (0: any free port).")
    admin_port: int | None = Field(
        default=None, ge=0, le=65535, description="Port of /metrics, /healthz and /readyz (0: any free port; None: none)."
    )
    partition_files: tuple[Path, ...] = Field(
        default=(), description="AgentServingCluster YAML files or directories (local runs); re-read every refresh_s."
    )
    cluster_labels: dict[str, str] | None = Field(
        default=None,
        description="Learn partitions from the AgentServingClusters carrying all of these labels (in the cluster).",
    )
    cluster_namespace: str | None = Field(
        default=None, description="Namespace of those AgentServingClusters (None: every namespace)."
    )
    upstream_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^/]+$",
        description="Send every request here (a Gateway API listener, whose HTTPRoutes match the partition header) "
        "instead of the partition's router. None: straight to the partition router.",
    )
    refresh_s: float = Field(default=30.0, gt=0, le=3600, description="How often the partition set is re-read, seconds.")
    user_header: str = Field(
        default="x-evolving-user", min_length=1, max_length=128, description="Request header naming the user."
    )
    requirements_header: str = Field(
        default="x-evolving-requirements",
        min_length=1,
        max_length=128,
        description="Request header with the user's partition requirements, e.g. `region=eu|us,hardware=gb300`.",
    )
    api_key_file: Path | None = Field(
        default=None,
        description="API keys (`name:key` per line, as the router's); the key's name then identifies the user and "
        "every route but the probes needs `Authorization: Bearer <key>`.",
    )
    key_requirements_file: Path | None = Field(
        default=None,
        description="YAML mapping of API key name to its requirements (`alice: region=eu`); a request may narrow "
        "them, never widen them.",
    )
    load_factor: float = Field(
        default=DEFAULT_LOAD_FACTOR,
        gt=1.0,
        le=10.0,
        description="Bounded-load factor c: no partition takes more than ceil(c x its weighted share) of the users.",
    )
    user_idle_s: float = Field(
        default=3600.0, gt=0, le=30 * 86400, description="A user unseen this long is unbound (its next request is bound afresh)."
    )
    branch_idle_s: float = Field(
        default=3600.0, gt=0, le=30 * 86400, description="A branch with no request this long loses its partition pin."
    )
    health_interval_s: float = Field(
        default=5.0, gt=0, le=600, description="How often each partition router's /readyz is probed, seconds."
    )
    retry_after_s: float = Field(
        default=5.0, ge=0, le=3600, description="Retry-After sent with a 503 when the user's partition is down, seconds."
    )
    connect_timeout_s: float = Field(default=5.0, gt=0, le=600, description="Connecting to a partition router, seconds.")
    request_timeout_s: float = Field(
        default=900.0, gt=0, le=86_400, description="Longest a forwarded request may take, stream included, seconds."
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024, description="Largest accepted request body, bytes."
    )
    shutdown_grace_s: float = Field(
        default=30.0, ge=0, le=3600, description="On shutdown, how long in-flight requests may run on, seconds."
    )

    @model_validator(mode="after")
    def _one_source(self) -> GatewaySettings:
        if bool(self.partition_files) == (self.cluster_labels is not None):
            raise ValueError("give exactly one partition source: partition_files or cluster_labels")
        if self.cluster_labels is not None and not self.cluster_labels:
            raise ValueError("cluster_labels must name at least one label (an empty selector would take every cluster)")
        return self
