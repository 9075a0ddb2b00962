"""The AgentServingCluster status: what the system decided and observed, never written by people or GitOps.

Two writers, each with its own field manager and its own fields:
- the router (`evolving-infra-router`) writes `targetSplit` (with the planner's decision behind it) and
  `fittedModels`;
- the operator (`evolving-infra-operator`) writes everything else: `split`, `prefill`, `decode`,
  `readyNodes`, `adapting`, `nodes`, `observedGeneration` and all conditions (it carries out the switches
  behind `Adapting` and watches the router Deployment behind `RouterReady`).
`conditions`, `nodes` and `fittedModels` are map-lists keyed by type, name and node, so server-side apply
merges the two writers entry by entry. Fast-changing numbers (queues, KV occupancy, branch counts) are
metrics, not status.

Boundary: data only.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

from pydantic import Field, StringConstraints
from pydantic.json_schema import JsonDict

from evolving_infra.core.types import Phase
from evolving_infra.operator.rules import KubeModel
from evolving_infra.router.planner.base import Outcome, PlannerName, SwitchMode
from evolving_infra.router.planner.diagnostics import CandidateVerdict

MAX_NODES = 4096
SPLIT_PATTERN = r"^[0-9]+P[0-9]+D$"
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
NodeName = Annotated[str, StringConstraints(min_length=1, max_length=253)]


def format_split(prefill: int, decode: int) -> str:
    """A split written as in the paper, e.g. `4P5D`."""
    return f"{prefill}P{decode}D"


class ConditionType(enum.Enum):
    READY = "Ready"
    ROUTER_READY = "RouterReady"
    NODE_AGENTS_READY = "NodeAgentsReady"
    ADAPTING = "Adapting"
    DEGRADED = "Degraded"
    INVALID = "Invalid"
    PARTITIONS_CHECKED = "PartitionsChecked"
    PROGRESSING = "Progressing"


class ConditionStatus(enum.Enum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class NodeState(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    SWITCHING = "switching"
    UNREACHABLE = "unreachable"


class Condition(KubeModel):
    """One aspect of the cluster's state, in the standard Kubernetes condition shape."""

    type: ConditionType = Field(
        description=(
            "Ready: serving requests (stays True during a routine re-split); RouterReady; NodeAgentsReady; "
            "Adapting: a switch is in progress; Degraded: serving with less than asked (a node unreachable, a "
            "switch rolled back, a node claimed by another cluster); Invalid: the spec cannot be applied; "
            "PartitionsChecked: whether node claims were checked against clusters in every namespace (False in a "
            "namespaced install, which sees only its own namespace); Progressing: the spec is being rolled out "
            "(False: RolloutComplete, or ProgressDeadlineExceeded when it did not become Ready in time)."
        )
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(min_length=1, max_length=1024, pattern=REASON_PATTERN, description="Why, in one CamelCase word.")
    message: str = Field(default="", max_length=32768, description="Why, for people.")
    last_transition_time: datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(default=None, ge=0, description="The spec generation this condition was set for.")


class Candidate(KubeModel):
    """One candidate prefill count the planner weighed."""

    prefill: int = Field(ge=0, le=MAX_NODES, description="Prefill nodes of the candidate split.")
    split: str = Field(pattern=SPLIT_PATTERN, description="The candidate split, e.g. 5P4D.")
    mean_gain: float | None = Field(default=None, description="Mean predicted throughput gain over the usable slices.")
    stderr: float | None = Field(default=None, ge=0, description="Standard error of that mean.")
    qualified: bool = Field(description="Whether the gain exceeds the significance threshold.")
    verdict: CandidateVerdict = Field(
        description="qualified, below_threshold, too_few_slices, prefill_kv_short (a move towards decode whose "
        "prefill nodes' KV memory would not hold the active branches' contexts, refused by the planner's active_kv rule), "
        "or restores_headroom (in a check between decisions: a move towards prefill that rule allows)."
    )
    prefill_kv_pages: int | None = Field(
        default=None, ge=0, description="KV pages the candidate's prefill nodes hold in GPU and host memory together."
    )
    prefill_utilization: float | None = Field(
        default=None, ge=0, le=1, description="How busy the throughput model predicts the candidate's prefill side (0-1)."
    )


class PlannerDecision(KubeModel):
    """The planner decision behind a target split."""

    decided_at: datetime = Field(description="When the planner decided.")
    planner: PlannerName = Field(description="The planner that decided.")
    outcome: Outcome = Field(description="switch, hold, skipped_switch_in_flight or skipped_cooldown.")
    reason: str = Field(default="", max_length=4096, description="The planner's reason, for people.")
    candidates: list[Candidate] = Field(default_factory=list, max_length=MAX_NODES, description="Candidates weighed, if the planner weighs any.")


class TargetSplit(KubeModel):
    """The split the planner wants, and which nodes change phase to reach it."""

    prefill: int = Field(ge=0, le=MAX_NODES, description="Target prefill nodes.")
    decode: int = Field(ge=0, le=MAX_NODES, description="Target decode nodes.")
    split: str = Field(pattern=SPLIT_PATTERN, description="Target split, e.g. 5P4D.")
    switch_generation: int = Field(ge=0, description="Epoch of this target; a node has applied it when its switchGeneration reaches it.")
    moving: list[NodeName] = Field(default_factory=list, max_length=MAX_NODES, description="Nodes that change phase.")
    mode: SwitchMode = Field(
        default=SwitchMode.IN_PLACE,
        description="How the moving nodes switch: in_place, in_place_strand_kv (their KV is dropped after the switch) "
        "or relaunch (the engine restarts empty after relaunchSeconds).",
    )
    relaunch_seconds: float = Field(default=0.0, ge=0, le=86_400, description="Downtime of a relaunch, seconds.")
    decision: PlannerDecision | None = Field(default=None, description="The decision behind this target.")


class NodeStatus(KubeModel):
    """One node agent as the operator last saw it."""

    name: NodeName = Field(description="Kubernetes node name.")
    pod: str | None = Field(default=None, max_length=253, description="Node agent pod.")
    address: str | None = Field(default=None, max_length=253, description="Node agent gRPC address (pod IP and port).")
    phase: Phase = Field(description="Phase the node serves: prefill or decode.")
    state: NodeState = Field(description="serving, draining (finishing old-phase work), switching, or unreachable.")
    switch_generation: int = Field(default=0, ge=0, description="Last target switchGeneration this node has applied.")


class PrefillFit(KubeModel):
    """Fitted prefill iteration model (eq. 1) of one node, in seconds."""

    c0: float = Field(description="Fixed cost per iteration.")
    c1: float = Field(description="Cost per uncached token.")
    c2: float = Field(description="Cost per query-key pair.")
    c3: float = Field(description="Cost per token restored from host memory.")
    held_out_error: float | None = Field(default=None, ge=0, description="Mean relative error on held-out iterations.")
    samples: int = Field(default=0, ge=0, description="Iterations the fit used.")


class DecodeFit(KubeModel):
    """Fitted decode iteration model (eq. 2) of one node, in seconds."""

    d0: float = Field(description="Fixed cost per iteration.")
    d1: float = Field(description="Cost of reading all routed experts.")
    d2: float = Field(description="Cost per running request.")
    held_out_error: float | None = Field(default=None, ge=0, description="Mean relative error on held-out iterations.")
    samples: int = Field(default=0, ge=0, description="Iterations the fit used.")


class FittedModel(KubeModel):
    """The iteration-time models the router fitted for one node."""

    node: NodeName = Field(description="Kubernetes node name.")
    fitted_at: datetime | None = Field(default=None, description="When the fit was frozen.")
    prefill: PrefillFit | None = Field(default=None, description="Prefill model, once fitted.")
    decode: DecodeFit | None = Field(default=None, description="Decode model, once fitted.")


def _map_list(key: str) -> JsonDict:
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


class AgentServingClusterStatus(KubeModel):
    """What the system decided and observed; written only by the operator and the router."""

    observed_generation: int | None = Field(default=None, ge=0, description="The spec generation the operator last acted on.")
    split: str | None = Field(default=None, pattern=SPLIT_PATTERN, description="Current split, e.g. 4P5D.")
    prefill: int | None = Field(default=None, ge=0, le=MAX_NODES, description="Nodes serving prefill now.")
    decode: int | None = Field(default=None, ge=0, le=MAX_NODES, description="Nodes serving decode now.")
    ready_nodes: int | None = Field(default=None, ge=0, le=MAX_NODES, description="Node agents serving.")
    adapting: bool | None = Field(default=None, description="Whether a re-split is in progress.")
    target_split: TargetSplit | None = Field(default=None, description="The planner's target (written by the router).")
    nodes: list[NodeStatus] | None = Field(
        default=None, max_length=MAX_NODES, description="Each node's phase and state.", json_schema_extra=_map_list("name")
    )
    fitted_models: list[FittedModel] | None = Field(
        default=None,
        max_length=MAX_NODES,
        description="Per-node iteration-time models (written by the router).",
        json_schema_extra=_map_list("node"),
    )
    conditions: list[Condition] | None = Field(
        default=None, max_length=32, description="Standard conditions.", json_schema_extra=_map_list("type")
    )
