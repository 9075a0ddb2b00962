"""The simulator's settings: one validated object (`SimConfig`) whose every field is documented with its bounds.

A run is a cluster of `nodes` identical nodes (one hardware profile) with pluggable policies: the planner,
prefill routing, decode binding, host eviction, the engine data plane, whether host memory is one shared pool,
when decode KV is reserved, where the node models come from, and an optional agent pause rule. Presets for
the paper's systems live in `evolving_infra.sim.systems`; explicit fields override a preset.

Boundary: values and their validation only; no simulation here.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolving_infra.core.eviction import EVICTION, EvictionPolicyName
from evolving_infra.node_agent.engine import DataPlane
from evolving_infra.router.core.models import ModelOrigin
from evolving_infra.core.plugins import load_plugins
from evolving_infra.router.planner import PlannerName, parse_split
from evolving_infra.router.planner.registry import PLANNERS
from evolving_infra.router.routing import DecodePolicyName, PrefillPolicyName
from evolving_infra.router.routing.registry import DECODE_BINDING, PREFILL_ROUTING
from evolving_infra.sim.replay import AgentMix


class DecodeReservation(enum.Enum):
    """When a request's decode node is chosen and its KV room taken."""

    AT_PREFILL_START = "at-prefill-start"
    """Ours (paper E.3 line 13): bind when the prefill starts; queued requests hold no decode memory."""
    AT_ROUTING = "at-routing"
    """SGLang PD disaggregation (paper D.1): bind when routed and reserve decode KV from then until the
    transfer; the prefill may not start before the reservation is granted."""


ModelSource = ModelOrigin
"""Where the node models the router and planner evaluate come from (`ModelOrigin` of the control core)."""


class PauseRuleName(enum.Enum):
    NONE = "none"
    THUNDERAGENT = "thunderagent"
    """Every 5 s pause tool-waiting programs on a node whose active programs' KV exceeds 95 % of capacity."""


class SystemName(enum.Enum):
    """Presets of the systems the paper compares (see `evolving_infra.sim.systems` for each one's source)."""

    EVOLVING = "evolving"
    DYNAMO = "dynamo"
    BEST_STATIC = "best-static"
    ARROW = "arrow"
    CACHE_AWARE = "cache-aware"
    THUNDERAGENT = "thunderagent"


class SimConfig(BaseModel):
    """Every setting of one simulated run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: SystemName | None = Field(default=None, description="the preset the run started from (informational)")
    profile: str = Field(default="glm-5.2-4xgb300-tp4", min_length=1, description="built-in profile name or file")
    nodes: int = Field(default=9, ge=2, le=4096, description="nodes in the cluster, 2..4096")
    split: str = Field(default="6P3D", description="initial split '<P>P<D>D' with P, D >= 1 and P + D = nodes")
    plugins: list[str] = Field(
        default_factory=list, description="policy modules to load first (dotted module names or .py paths)"
    )
    planner: str = Field(default=PlannerName.OURS.value, min_length=1, description="phase-split planner (a declared one)")
    planner_settings: dict[str, Any] = Field(default_factory=dict, description="settings of the planner")
    prefill_routing: str = Field(default=PrefillPolicyName.TTFT.value, min_length=1, description="prefill routing policy")
    routing_settings: dict[str, Any] = Field(default_factory=dict, description="settings of the prefill routing policy")
    decode_routing: str = Field(default=DecodePolicyName.FEWEST_REQUESTS.value, min_length=1, description="decode binder")
    decode_settings: dict[str, Any] = Field(default_factory=dict, description="settings of the decode binder")
    eviction: str = Field(
        default=EvictionPolicyName.BRANCH_COUNT.value, min_length=1, description="host eviction order (a declared one)"
    )
    data_plane: DataPlane = Field(default=DataPlane.ASYNC_FETCH, description="how host KV reaches GPU memory")
    shared_pool: bool = Field(default=True, description="host memory of all nodes is one pool (peer fetches)")
    decode_reservation: DecodeReservation = Field(
        default=DecodeReservation.AT_PREFILL_START, description="when decode KV is bound and reserved"
    )
    models: ModelSource = Field(default=ModelSource.FITTED, description="node models for router and planner")
    collocated_warmup: bool = Field(
        default=True, description="every node serves both phases during warmup (needed to fit node models)"
    )
    warmup_s: float = Field(default=1800.0, ge=0, le=86_400, description="warmup excluded from scoring, 0..86400 s")
    duration_s: float | None = Field(
        default=None, gt=0, le=7 * 86_400, description="scored time after warmup (None: until the trace ends)"
    )
    drain_s: float = Field(
        default=600.0, ge=0, le=86_400, description="after the scored window, run at most this long to finish "
        "the requests issued in it (their latencies are scored), 0..86400 s"
    )
    agents: int | None = Field(default=None, ge=1, le=1_000_000, description="closed-loop concurrency (None: open loop)")
    max_active: int | None = Field(default=None, ge=1, description="open loop: cap on active agents (None: no cap)")
    skip_late_s: float | None = Field(
        default=None, ge=0, le=7 * 86_400, description="closed loop: a freed slot skips agents whose start_s is more "
        "than this many seconds before the run's current time, so the replay follows a schedule laid out in the "
        "trace (None: every agent starts, in file order)"
    )
    agent_mix: dict[str, list[float]] | None = Field(
        default=None, description="closed loop: each workload label's target share of the active agents at steps of "
        "agent_mix_step_s from the start (linear in between, the last value after; the labels' shares add up to 1 at "
        "every step); a freed slot goes to the label furthest below its share (None: file order alone)"
    )
    agent_mix_step_s: float | None = Field(
        default=None, gt=0, le=7 * 86_400, description="closed loop: seconds between the points of agent_mix"
    )
    seed: int = Field(default=0, ge=0, description="seed of every random stream of the run")
    noise: float = Field(
        default=0.05, ge=0, le=1.0, description="relative std. dev. of the engines' log-normal iteration-time noise, "
        "0..1 (ignored with exact_models)"
    )
    exact_models: bool = Field(
        default=False, description="debugging switch: engines take iteration times from eq. 1 and 2 alone (no ground-"
        "truth effects, no noise), so fitted models can be exact"
    )
    pause_rule: PauseRuleName = Field(default=PauseRuleName.NONE, description="agent pause rule (ThunderAgent)")
    context_length_tokens: int = Field(
        default=200_000, ge=1, description="model context length for Dynamo's prefill ratio (workloads cap at 200K)"
    )
    fit_interval_s: float = Field(
        default=60.0, gt=0, description="during warmup, refit the provisional routing models this often (s)"
    )
    span_s: float = Field(default=60.0, gt=0, description="node busy-time spans are cut at least this often (s)")

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data: Any) -> Any:
        """Policy names given as enums become their names."""
        if isinstance(data, dict):
            data = {k: (v.value if k in ("planner", "prefill_routing", "decode_routing") and isinstance(v, enum.Enum)
                        else v) for k, v in data.items()}  # fmt: skip
        return data

    @model_validator(mode="after")
    def _policies(self) -> SimConfig:
        """Load the plugins, then check each policy's name and settings against its declaration."""
        load_plugins(self.plugins)
        PLANNERS.validate(self.planner, self.planner_settings, "planner_settings")
        PREFILL_ROUTING.validate(self.prefill_routing, self.routing_settings, "routing_settings")
        DECODE_BINDING.validate(self.decode_routing, self.decode_settings, "decode_settings")
        EVICTION.get(self.eviction, "eviction")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> SimConfig:
        try:
            p, d = parse_split(self.split)
        except ValueError as exc:
            raise ValueError(f"split: {exc}") from None
        if p < 1 or d < 1:
            raise ValueError(f"split {self.split!r}: both phases need at least one node")
        if p + d != self.nodes:
            raise ValueError(f"split {self.split!r} has {p + d} nodes but nodes is {self.nodes}")
        if self.models is ModelSource.FITTED and (not self.collocated_warmup or self.warmup_s <= 0):
            raise ValueError(
                "models 'fitted' needs a collocated warmup with warmup_s > 0 (the fit needs both phases on every "
                "node); set collocated_warmup and warmup_s, or use models 'profile'"
            )
        if self.exact_models and "noise" in self.model_fields_set and self.noise > 0:
            raise ValueError("exact_models runs the engines without noise; leave noise unset or 0")
        if self.agents is not None and self.max_active is not None:
            raise ValueError("agents (closed loop) and max_active (open loop) exclude each other")
        if self.skip_late_s is not None and self.agents is None:
            raise ValueError("skip_late_s is a closed-loop setting; give agents (open loop starts agents at start_s)")
        if (self.agent_mix is None) != (self.agent_mix_step_s is None):
            raise ValueError("agent_mix and agent_mix_step_s go together: give both or neither")
        if self.agent_mix is not None:
            if self.agents is None:
                raise ValueError("agent_mix is a closed-loop setting; give agents")
            self.replay_mix  # noqa: B018 (validates the schedule: AgentMix raises ValueError naming the problem)
        return self

    @property
    def replay_mix(self) -> AgentMix | None:
        """The replayer's `AgentMix` of `agent_mix` (None without one)."""
        if self.agent_mix is None or self.agent_mix_step_s is None:
            return None
        return AgentMix.of(self.agent_mix_step_s, self.agent_mix)

    @property
    def engine_noise(self) -> float:
        """The noise the engines apply: `noise`, or 0 with `exact_models`."""
        return 0.0 if self.exact_models else self.noise

    @property
    def split_counts(self) -> tuple[int, int]:
        return parse_split(self.split)

    @property
    def scored_end(self) -> float | None:
        return None if self.duration_s is None else self.warmup_s + self.duration_s

    def describe(self) -> dict[str, Any]:
        """The settings as plain JSON-ready data."""
        return self.model_dump(mode="json")


def field_help() -> dict[str, str]:
    """Each field's description (for CLI help and docs)."""
    return {name: info.description or "" for name, info in SimConfig.model_fields.items()}
