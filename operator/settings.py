"""The operator's own settings: one validated object, read from the environment (`EVOLVING_OPERATOR_*`).

These are operator-wide knobs (where it runs, which image children default to, how long a phase switch may
take and how failed switches are retried); everything about one serving cluster is in its spec.

Boundary: data and validation only; the CLI builds the object, handlers receive it.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from evolving_infra.operator import rbac
from evolving_infra.operator.rendered import NODE_AGENT_GRPC_PORT


class OperatorSettings(BaseSettings):
    """Operator-wide settings; each can be set as `EVOLVING_OPERATOR_<FIELD>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="EVOLVING_OPERATOR_", frozen=True, extra="forbid")

    namespace: str = Field(
        default=rbac.OPERATOR_NAMESPACE,
        min_length=1,
        max_length=63,
        description="Namespace the operator runs in (the NetworkPolicy admits its pods to the node agents).",
    )
    default_image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description=(
            "Image of routers and node agents whose spec names none; unset: the operator's own image, read from "
            "its pod (see `images`)."
        ),
    )
    pod_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="The operator's own pod (downward API), read at start for its image.",
    )
    node_agent_port: int = Field(
        default=NODE_AGENT_GRPC_PORT,
        ge=1,
        le=65535,
        description="gRPC port of a node agent when its pod declares no container port named grpc.",
    )
    switch_deadline_seconds: float = Field(
        default=600.0,
        gt=0,
        le=86400,
        description="Deadline of one SwitchPhase call: draining the old phase's running requests plus the switch.",
    )
    state_deadline_seconds: float = Field(
        default=5.0, gt=0, le=600, description="Deadline of one GetState call while tracking node agents."
    )
    switch_attempts: int = Field(
        default=4,
        ge=1,
        le=100,
        description="Attempts at a target split before the nodes already switched are switched back (rolled back).",
    )
    switch_backoff_seconds: float = Field(
        default=5.0, gt=0, le=3600, description="Delay before the second attempt; doubles with every further attempt."
    )
    switch_backoff_max_seconds: float = Field(
        default=120.0, gt=0, le=86400, description="Longest delay between two attempts."
    )
    resync_seconds: float = Field(
        default=30.0,
        gt=0,
        le=86400,
        description="Interval at which each cluster's node agents, router and partition claims are re-read into status.",
    )
    agent_concurrency: int = Field(
        default=32, ge=1, le=4096, description="Node agents called at once (GetState while tracking, SwitchPhase while switching)."
    )

    progress_deadline_seconds: float = Field(
        default=600.0,
        gt=0,
        le=86400,
        description=(
            "How long a cluster may be Progressing (rolling out, not yet Ready) before Progressing turns False with "
            "ProgressDeadlineExceeded (and Argo CD's health check reports Degraded)."
        ),
    )
    metrics_port: int = Field(
        default=8081, ge=0, le=65535, description="Port of the operator's /metrics endpoint (0: not served)."
    )
    metrics_namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description=(
            "Namespace of the Prometheus that scrapes node agents; clusters' NetworkPolicy admits it to the "
            "metrics port (unset: no scrape rule)."
        ),
    )
    api_connect_timeout_seconds: float = Field(
        default=5.0, gt=0, le=300, description="Connect timeout of every Kubernetes API call (the operator's and kopf's)."
    )
    api_read_timeout_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="Read timeout of every Kubernetes API call (kopf's watches excepted: they time out at 5 minutes)."
    )
    api_retries: int = Field(
        default=2, ge=0, le=10, description="Further attempts at an API call that timed out, failed to connect, was throttled or got a 5xx."
    )

    @model_validator(mode="after")
    def _backoff_bounds(self) -> OperatorSettings:
        if self.switch_backoff_max_seconds < self.switch_backoff_seconds:
            raise ValueError(
                f"switch_backoff_max_seconds ({self.switch_backoff_max_seconds}) must be at least "
                f"switch_backoff_seconds ({self.switch_backoff_seconds})"
            )
        return self

    def switch_backoff(self, attempt: int) -> float:
        """Delay before attempt `attempt + 1` (attempt 0 is the first): doubling, capped."""
        return min(self.switch_backoff_max_seconds, self.switch_backoff_seconds * 2.0 ** max(0, attempt))
