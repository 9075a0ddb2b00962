"""The AgentServingCluster spec: the one typed, documented, bounded settings model of a serving cluster.

Everything else is derived from these models: the CRD's openAPIV3Schema (`crdgen`), the field reference in
docs/operator.md, the rendered router and node-agent settings, and the child objects (`builders`). The
policy names are the router's and the core's own enums, so a name the CRD accepts is a name the router
can build.

Invariant: a spec that parses here also passes the CRD's schema and CEL rules, and the other way round
(tests check both directions on the same objects); checks that need data outside the object (the
hardware profiles) live in `semantics`.

Boundary: data and validation only; no I/O.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, ClassVar

from pydantic import Field, StringConstraints

from evolving_infra.core.eviction import EvictionPolicyName
from evolving_infra.operator.rules import KubeModel, Rule
from evolving_infra.operator.status import AgentServingClusterStatus
from evolving_infra.router.planner.base import PlannerName
from evolving_infra.router.routing.base import DecodePolicyName, PrefillPolicyName

__all__ = ["AgentServingClusterSpec", "AgentServingClusterStatus"]

MAX_NODES = 4096
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
Quantity = Annotated[
    int | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]
"""A Kubernetes resource quantity: an integer or a string such as `500m`, `4Gi`, `1.5e9`."""


class SelectorOperator(enum.Enum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class EngineBackend(enum.Enum):
    EMULATED = "emulated"
    SGLANG = "sglang"


class PlannerMode(enum.Enum):
    ADAPTIVE = "adaptive"
    STATIC = "static"


class ServiceType(enum.Enum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class PullPolicy(enum.Enum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class HostMemoryMedium(enum.Enum):
    MEMORY = "Memory"
    HUGEPAGES_2MI = "HugePages-2Mi"
    HUGEPAGES_1GI = "HugePages-1Gi"


class LabelSelectorRequirement(KubeModel):
    """One requirement on a node label, as in a Kubernetes label selector."""

    key: str = Field(min_length=1, max_length=317, description="The node label key the requirement applies to.")
    operator: SelectorOperator = Field(
        description="In and NotIn compare the label's value with `values`; Exists and DoesNotExist test the key only."
    )
    values: list[Annotated[str, StringConstraints(max_length=63)]] | None = Field(
        default=None, max_length=64, description="Label values; non-empty for In and NotIn, empty for Exists and DoesNotExist."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
            "values must be non-empty for In and NotIn, and empty for Exists and DoesNotExist",
            lambda s: bool(s.values) if s.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN) else not s.values,
        ),
    )


class NodeSelector(KubeModel):
    """The nodes of this cluster, selected by their labels (the requirements are ANDed)."""

    match_labels: dict[str, Annotated[str, StringConstraints(max_length=63)]] | None = Field(
        default=None, max_length=64, description="Labels a node must carry, key and value."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=16, description="Further requirements on node labels."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",
            "nodeSelector must contain at least one label or expression: an empty selector would claim every node",
            lambda s: bool(s.match_labels) or bool(s.match_expressions),
        ),
    )


class EngineSpec(KubeModel):
    """The engine each node agent runs, and what it serves."""

    backend: EngineBackend = Field(
        default=EngineBackend.EMULATED,
        description=(
            "emulated: real scheduling and KV accounting on CPUs, iteration times from the hardware profile; "
            "sglang: reserved for SGLang on the node's GPUs. No node agent implements it yet, so the operator "
            "marks such a cluster Invalid and deploys nothing for it."
        ),
    )
    profile: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$",
        description=(
            "Built-in hardware profile (model, GPU, parallelism), e.g. glm-5.2-4xgb300-tp4. Required for the "
            "emulated backend, where it sets the iteration times; for sglang it supplies KV capacities."
        ),
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Model the sglang backend serves (a path or model id). Required for sglang.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.backend != 'emulated' || has(self.profile)",
            "engine.profile is required with the emulated backend",
            lambda s: s.backend is not EngineBackend.EMULATED or s.profile is not None,
        ),
        Rule(
            "self.backend != 'sglang' || has(self.model)",
            "engine.model is required with the sglang backend",
            lambda s: s.backend is not EngineBackend.SGLANG or s.model is not None,
        ),
    )


class KvCacheSpec(KubeModel):
    """KV cache geometry; every field overrides the hardware profile's value when set."""

    page_tokens: int | None = Field(default=None, ge=1, le=4096, description="Tokens per KV page (profile default: 64).")
    l1_tokens: int | None = Field(
        default=None, ge=1, le=10**12, description="KV capacity of a node's GPU memory (L1), in tokens."
    )
    l2_tokens: int | None = Field(
        default=None, ge=1, le=10**13, description="KV capacity of a node's host memory (L2, the shared pool), in tokens."
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "!has(self.pageTokens) || !has(self.l1Tokens) || self.l1Tokens >= self.pageTokens",
            "kvCache.l1Tokens must hold at least one page (pageTokens)",
            lambda s: s.page_tokens is None or s.l1_tokens is None or s.l1_tokens >= s.page_tokens,
        ),
        Rule(
            "!has(self.pageTokens) || !has(self.l2Tokens) || self.l2Tokens >= self.pageTokens",
            "kvCache.l2Tokens must hold at least one page (pageTokens)",
            lambda s: s.page_tokens is None or s.l2_tokens is None or s.l2_tokens >= s.page_tokens,
        ),
    )


class InitialSplit(KubeModel):
    """Prefill and decode nodes at start; they must add up to nodeCount."""

    prefill: int = Field(ge=0, le=MAX_NODES, description="Nodes serving prefill at start.")
    decode: int = Field(ge=0, le=MAX_NODES, description="Nodes serving decode at start.")


class PlannerSpec(KubeModel):
    """How the split between prefill and decode nodes changes while the cluster serves."""

    mode: PlannerMode = Field(
        default=PlannerMode.ADAPTIVE,
        description="adaptive: the planner re-splits nodes online; static: the split stays at initialSplit.",
    )
    policy: PlannerName | None = Field(
        default=None,
        description=(
            "Planner in adaptive mode: ours (iteration-time models over the window's slices), dynamo "
            "(load thresholds, relaunch), arrow (TTFT/TPOT targets). Unset means ours; static mode allows "
            "only static or unset."
        ),
    )
    window_seconds: int = Field(default=600, ge=10, le=86400, description="Planning window T_win in seconds: a decision per window.")
    slices: int = Field(default=10, ge=1, le=600, description="Slices per window; a candidate split qualifies when its mean gain over the slices exceeds two standard errors.")
    warmup_seconds: int = Field(default=1800, ge=0, le=86400, description="Seconds of collocated warmup that fit the iteration-time models before the first decision.")
    cooldown_seconds: int = Field(default=120, ge=0, le=86400, description="Seconds after a switch completes during which no decision is made and no slice is used.")
    min_prefill: int = Field(default=1, ge=0, le=MAX_NODES, description="Fewest prefill nodes any split may have.")
    min_decode: int = Field(default=1, ge=0, le=MAX_NODES, description="Fewest decode nodes any split may have.")
    settings: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="More settings of the chosen planner: its declared fields (see Policy settings), over those "
        "the fields above give it. Checked against the planner's declaration; a bad field makes the cluster Invalid.",
    )

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.mode != 'static' || !has(self.policy) || self.policy == 'static'",
            "planner.policy must be static or unset when planner.mode is static",
            lambda s: s.mode is not PlannerMode.STATIC or s.policy in (None, PlannerName.STATIC),
        ),
        Rule(
            "self.mode != 'adaptive' || !has(self.policy) || self.policy != 'static'",
            "planner.policy static needs planner.mode static; an adaptive planner must be ours, dynamo or arrow",
            lambda s: s.mode is not PlannerMode.ADAPTIVE or s.policy is not PlannerName.STATIC,
        ),
        Rule(
            "self.windowSeconds >= self.slices",
            "planner.windowSeconds must be at least planner.slices (each slice lasts one second or more)",
            lambda s: s.window_seconds >= s.slices,
        ),
    )

    @property
    def effective_policy(self) -> PlannerName:
        """The planner that runs: `policy` if set, else ours (adaptive) or static."""
        if self.policy is not None:
            return self.policy
        return PlannerName.OURS if self.mode is PlannerMode.ADAPTIVE else PlannerName.STATIC


class FetchSpec(KubeModel):
    """Cost of fetching cached KV from a peer's host memory, tau(x) = fixedSeconds + perTokenSeconds * x."""

    fixed_seconds: float = Field(default=0.45, ge=0, le=60, description="Fixed setup time of one fetch, in seconds.")
    per_token_seconds: float = Field(default=1e-6, ge=0, le=1, description="Transfer time per fetched token, in seconds.")
    min_tokens: int = Field(default=512, ge=0, le=10**7, description="Fetches shorter than this are not worth their fixed cost; the tokens are recomputed.")


class RoutingSpec(KubeModel):
    """How the router places prefills and binds decodes."""

    prefill_policy: PrefillPolicyName = Field(
        default=PrefillPolicyName.TTFT,
        description=(
            "ttft (ours: shortest predicted TTFT with queue replay and exposed fetch), cache-aware, sticky, "
            "dynamo-kv, dynamo-kv-pool, round-robin."
        ),
    )
    decode_policy: DecodePolicyName = Field(
        default=DecodePolicyName.FEWEST_REQUESTS,
        description="fewest-requests (ours: fewest running requests among nodes with KV room), round-robin, power-of-two.",
    )
    fetch: FetchSpec = Field(default_factory=FetchSpec, description="Peer KV fetch cost model (used by the ttft policy).")
    copy_price_seconds_per_token: float = Field(
        default=1e-6, ge=0, le=1, description="Price per fetched token of the duplicate copy a fetch leaves behind (ttft policy)."
    )
    prefill_settings: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="More settings of the prefill routing policy: its declared fields (see Policy settings), over "
        "those the fields above give it. Checked against its declaration; a bad field makes the cluster Invalid.",
    )
    decode_settings: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="Settings of the decode binding policy: its declared fields (see Policy settings). Checked "
        "against its declaration; a bad field makes the cluster Invalid.",
    )


class EvictionSpec(KubeModel):
    """Which host (L2) KV pages a node drops first when its host memory is full."""

    policy: EvictionPolicyName = Field(
        default=EvictionPolicyName.BRANCH_COUNT,
        description="branch-count: pages no active branch references first, then least recently used; lru: least recently used.",
    )


class RouterSpec(KubeModel):
    """The router's Service (the OpenAI-compatible endpoint for agent harnesses)."""

    service_type: ServiceType = Field(default=ServiceType.CLUSTER_IP, description="Type of the router's Service.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port of the router's Service.")
    replicas: int = Field(
        default=1,
        ge=1,
        le=1,
        description=(
            "Always 1: the router keeps the KV directory, branch counts and the planner's window in memory, and "
            "a second replica would route on a second, diverging copy. Partition large fleets into several clusters."
        ),
    )


class ImageSpec(KubeModel):
    """A container image and its pull policy."""

    image: str | None = Field(default=None, min_length=1, max_length=512, description="Image reference; unset means the operator's own image.")
    pull_policy: PullPolicy = Field(default=PullPolicy.IF_NOT_PRESENT, description="Image pull policy.")


class ImagesSpec(KubeModel):
    """Images of the workloads; all default to the operator's image, whose entrypoint serves every role."""

    router: ImageSpec = Field(default_factory=ImageSpec, description="Image of the router.")
    node_agent: ImageSpec = Field(default_factory=ImageSpec, description="Image of the node agents.")


class RouterResources(KubeModel):
    """Compute resources of the router container."""

    requests: dict[str, Quantity] = Field(
        default={"cpu": "1", "memory": "2Gi"}, max_length=16, description="Resource requests."
    )
    limits: dict[str, Quantity] | None = Field(default=None, max_length=16, description="Resource limits.")


class HostMemorySpec(KubeModel):
    """Host memory of the L2 KV pool, mounted into each node agent."""

    medium: HostMemoryMedium = Field(
        default=HostMemoryMedium.MEMORY,
        description="Memory adds the pool to the container's memory request (and limit); HugePages-2Mi/1Gi request huge pages.",
    )
    size: Quantity | None = Field(
        default=None,
        description="Size of the pool; unset means L2 tokens times the profile's KV bytes per token.",
    )


class NodeAgentResources(KubeModel):
    """Compute resources of each node agent container, besides the host memory of L2."""

    requests: dict[str, Quantity] = Field(
        default={"cpu": "2", "memory": "4Gi"}, max_length=16, description="Resource requests, L2 excluded."
    )
    limits: dict[str, Quantity] | None = Field(default=None, max_length=16, description="Resource limits, L2 excluded.")
    host_memory: HostMemorySpec = Field(default_factory=HostMemorySpec, description="Host memory of the L2 KV pool.")


class ResourcesSpec(KubeModel):
    """Compute resources of the router and the node agents."""

    router: RouterResources = Field(default_factory=RouterResources, description="Router resources.")
    node_agent: NodeAgentResources = Field(default_factory=NodeAgentResources, description="Node agent resources.")


class NetworkPolicySpec(KubeModel):
    """A NetworkPolicy around the node agents (on unless disabled)."""

    enabled: bool = Field(
        default=True,
        description="Allow the node agents' gRPC port only from this cluster's router, the operator and peer node agents, and the KV transfer port only from peer node agents (needs a CNI that enforces NetworkPolicies).",
    )


SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A Secret's name: a DNS subdomain."""


class SecuritySpec(KubeModel):
    """Credentials of the cluster's gRPC API and of the router's HTTP API, from Secrets in the cluster's namespace.

    The Secrets are the user's (or cert-manager's, or an external-secrets controller's): the operator mounts them
    into the router and node agent pods, reads the cluster token itself for its own calls to the node agents,
    and never writes them.
    """

    insecure: bool = Field(
        default=False,
        description="Run without credentials: node agents accept unauthenticated calls from any pod address and the "
        "router serves the API without keys. For test clusters only; every Secret below is then ignored.",
    )
    cluster_token_secret: Annotated[str, StringConstraints(pattern=SECRET_NAME_PATTERN)] | None = Field(
        default=None,
        description="Secret whose key `token` is the cluster token (16-4096 printable characters) the router, the "
        "node agents and the operator send on every gRPC call; unset means `<cluster name>-cluster-token`.",
    )
    tls_secret: Annotated[str, StringConstraints(pattern=SECRET_NAME_PATTERN)] | None = Field(
        default=None,
        description="Secret with mutual TLS material in cert-manager's layout (`tls.crt`, `tls.key`, `ca.crt`), "
        "mounted into the router and every node agent and presented by the operator; its certificate must name "
        "the node agents' Service (`<cluster name>-node-agent.<namespace>.svc`), which every member checks instead "
        "of a pod's address. Unset: the token alone.",
    )
    api_keys_secret: Annotated[str, StringConstraints(pattern=SECRET_NAME_PATTERN)] | None = Field(
        default=None,
        description="Secret whose key `api-keys` holds the router's API keys (one `name:key` per line); unset means "
        "`<cluster name>-api-keys`.",
    )
    peer_networks: list[Annotated[str, StringConstraints(min_length=2, max_length=64)]] | None = Field(
        default=None,
        max_length=32,
        description="CIDRs node agents may fetch KV pages from (set the pod network's); unset means any address.",
    )


class AgentServingClusterSpec(KubeModel):
    """An agent-serving cluster: its nodes, engine, initial split, planner, routing and workloads."""

    node_selector: NodeSelector = Field(description="Labels that select this cluster's nodes; pools of different clusters must be disjoint.")
    node_count: int = Field(ge=1, le=MAX_NODES, description="Number of nodes the selector is expected to match.")
    gpus_per_node: int = Field(default=4, ge=1, le=16, description="GPUs of each node; must agree with the hardware profile.")
    engine: EngineSpec = Field(description="Engine backend and what it serves.")
    kv_cache: KvCacheSpec = Field(default_factory=KvCacheSpec, description="Overrides of the profile's KV page size and capacities.")
    initial_split: InitialSplit = Field(description="Prefill and decode nodes at start (and always, in static mode).")
    planner: PlannerSpec = Field(default_factory=PlannerSpec, description="Online re-splitting.")
    routing: RoutingSpec = Field(default_factory=RoutingSpec, description="Prefill routing and decode binding.")
    eviction: EvictionSpec = Field(default_factory=EvictionSpec, description="Host KV eviction order.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="Router Service and replicas.")
    images: ImagesSpec = Field(default_factory=ImagesSpec, description="Container images.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Container resources.")
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec, description="NetworkPolicy around the node agents.")
    security: SecuritySpec = Field(default_factory=SecuritySpec, description="Credentials of the gRPC and HTTP APIs.")

    RULES: ClassVar[tuple[Rule, ...]] = (
        Rule(
            "self.initialSplit.prefill + self.initialSplit.decode == self.nodeCount",
            "initialSplit.prefill + initialSplit.decode must equal nodeCount",
            lambda s: s.initial_split.prefill + s.initial_split.decode == s.node_count,
            detail=lambda s: f"got {s.initial_split.prefill} + {s.initial_split.decode}, nodeCount {s.node_count}",
        ),
        Rule(
            "self.planner.minPrefill + self.planner.minDecode <= self.nodeCount",
            "planner.minPrefill + planner.minDecode must not exceed nodeCount",
            lambda s: s.planner.min_prefill + s.planner.min_decode <= s.node_count,
            detail=lambda s: f"got {s.planner.min_prefill} + {s.planner.min_decode}, nodeCount {s.node_count}",
        ),
        Rule(
            "self.initialSplit.prefill >= self.planner.minPrefill && self.initialSplit.decode >= self.planner.minDecode",
            "initialSplit must respect planner.minPrefill and planner.minDecode",
            lambda s: s.initial_split.prefill >= s.planner.min_prefill and s.initial_split.decode >= s.planner.min_decode,
            detail=lambda s: (
                f"got {s.initial_split.prefill}P{s.initial_split.decode}D, "
                f"minimum {s.planner.min_prefill}P{s.planner.min_decode}D"
            ),
        ),
    )
