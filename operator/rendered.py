"""The router's and the node agents' settings files, rendered from a spec for the settings ConfigMap.

Each file is what the service's own `load_settings(file)` reads: `render_router_settings` yields the fields
of `RouterSettings` (router/service/settings.py) and `render_node_agent_settings` the fields of
`NodeAgentSettings` (node_agent/service/settings.py), by the same names, flat, in the services' units
(seconds, pages). Policy keyword settings (`planner_settings`, `routing_settings`) are the keyword
arguments of `make_planner` and `make_prefill_router`, passed through unchanged.

Per-pod values are not in the shared file: the DaemonSet sets `EVOLVING_NODE_NODE` (the node name) and
`EVOLVING_NODE_HOST` (the pod IP) from the downward API (`NODE_AGENT_ENV`), and the environment wins over
the file. Node agents find each other by the addresses in KV events and fetch runs; the router finds them
through the headless Service (`nodes_dns`).

Credentials (docs/security.md): unless `security.insecure`, both services get the cluster token file (and the
mutual TLS files when `security.tlsSecret` is set) and the router its API key file, at the paths where the
workloads mount those Secrets (`credential_mounts`); `insecure` is rendered only when the CR asks for it.

Boundary: pure; ports and file names the workloads agree on are constants here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from evolving_infra.core.plugins import PolicyRegistry
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.node_agent.service.settings import MAX_PAGES
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.semantics import effective_kv
from evolving_infra.operator.spec import AgentServingClusterSpec, PlannerMode
from evolving_infra.router.planner.base import PlannerName
from evolving_infra.router.planner.registry import PLANNERS
from evolving_infra.router.routing.registry import DECODE_BINDING, PREFILL_ROUTING
from evolving_infra.router.routing.base import PrefillPolicyName

NODE_AGENT_GRPC_PORT = 50051
NODE_AGENT_TRANSFER_PORT = 50052
NODE_AGENT_METRICS_PORT = 9090
ROUTER_HTTP_PORT = 8000
ROUTER_ADMIN_PORT = 50061
ROUTER_METRICS_PORT = 9091
SETTINGS_DIR = "/etc/evolving-infra"
ROUTER_SETTINGS_FILE = "router.yaml"
NODE_AGENT_SETTINGS_FILE = "node-agent.yaml"
L2_MOUNT = "/var/lib/evolving-infra/l2"
ROUTER_STATE_MOUNT = "/var/lib/evolving-infra/router"
"""The router's state folder (an emptyDir: it outlives a crashed router container, not its pod)."""
BRANCH_SNAPSHOT_FILE = "branches.json"
POD_BIND_HOST = "0.0.0.0"
"""The router binds every interface of its pod (the Service and the kubelet's probes reach it there)."""
NODE_AGENT_ENV = (("EVOLVING_NODE_NODE", "spec.nodeName"), ("EVOLVING_NODE_HOST", "status.podIP"))
"""(variable, downward-API field) of the node agent settings that differ per pod."""


ANY_ADDRESS = ("0.0.0.0/0", "::/0")
"""Peer networks of rendered node agents unless `security.peerNetworks` names the pod network."""

SECRETS_DIR = "/etc/evolving-infra-secrets"
"""Where the credential Secrets are mounted, one folder each (`CredentialMount`)."""
TOKEN_KEY = "token"
API_KEYS_KEY = "api-keys"
TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")
"""The keys of a cert-manager Certificate's Secret (also of `kubectl create secret tls` plus `ca.crt`)."""


@dataclass(frozen=True, slots=True)
class CredentialMount:
    """One credential Secret as the pods see it: the volume, the Secret, its keys, and where they appear."""

    volume: str
    secret: str
    keys: tuple[str, ...]
    directory: str

    def path(self, key: str) -> str:
        return f"{self.directory}/{key}"


def credential_mounts(cluster: ClusterRef, spec: AgentServingClusterSpec) -> dict[str, CredentialMount]:
    """The Secrets a secure cluster's pods mount, by role (`token`, `tls`, `api-keys`); none when insecure."""
    sec = spec.security
    if sec.insecure:
        return {}
    out = {
        "token": CredentialMount(
            "cluster-token", sec.cluster_token_secret or cluster.child_name("cluster-token"), (TOKEN_KEY,), f"{SECRETS_DIR}/cluster-token"
        ),
        "api-keys": CredentialMount(
            "api-keys", sec.api_keys_secret or cluster.child_name("api-keys"), (API_KEYS_KEY,), f"{SECRETS_DIR}/api-keys"
        ),
    }
    if sec.tls_secret is not None:
        out["tls"] = CredentialMount("cluster-tls", sec.tls_secret, TLS_KEYS, f"{SECRETS_DIR}/tls")
    return out


def _credential_settings(cluster: ClusterRef, spec: AgentServingClusterSpec) -> dict[str, Any]:
    """The credential fields both services share (the same names in `RouterSettings` and `NodeAgentSettings`)."""
    mounts = credential_mounts(cluster, spec)
    if not mounts:
        return {"insecure": True}
    out: dict[str, Any] = {"cluster_token_file": mounts["token"].path(TOKEN_KEY)}
    tls = mounts.get("tls")
    if tls is not None:
        out |= {"tls_cert_file": tls.path("tls.crt"), "tls_key_file": tls.path("tls.key"), "tls_ca_file": tls.path("ca.crt"),
                "tls_server_name": node_agent_service_host(cluster)}  # fmt: skip
    return out


def peer_networks(spec: AgentServingClusterSpec) -> list[str]:
    """`security.peerNetworks` checked as CIDRs (ValueError naming the field), or every address."""
    networks = spec.security.peer_networks
    if not networks:
        return list(ANY_ADDRESS)
    for i, cidr in enumerate(networks):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError as error:
            raise ValueError(f"security.peerNetworks[{i}]: {error}") from None
    return list(networks)


def node_agent_service_host(cluster: ClusterRef) -> str:
    """DNS name of the node agents' headless Service (one A record per node agent pod)."""
    return f"{cluster.child_name('node-agent')}.{cluster.namespace}.svc"


def planner_settings(spec: AgentServingClusterSpec) -> dict[str, Any]:
    """Keyword settings of `make_planner(name, **settings)` for the spec's planner."""
    planner = spec.planner
    name = planner.effective_policy
    if name is PlannerName.OURS:
        return {
            "window_s": float(planner.window_seconds),
            "slices": planner.slices,
            "cooldown_s": float(planner.cooldown_seconds),
            "min_prefill": planner.min_prefill,
            "min_decode": planner.min_decode,
        }
    if name in (PlannerName.DYNAMO, PlannerName.ARROW):
        return {"min_prefill": planner.min_prefill, "min_decode": planner.min_decode}
    if name is PlannerName.STATIC:
        return {"interval_s": float(planner.window_seconds)}
    raise ValueError(f"planner.policy {name.value!r}: no rendering of its settings (a planner the CRD names needs one)")


def prefill_settings(spec: AgentServingClusterSpec) -> dict[str, Any]:
    """Keyword settings of `make_prefill_router(name, **settings)`; only the ttft policy takes the fetch model."""
    routing = spec.routing
    if routing.prefill_policy is not PrefillPolicyName.TTFT:
        return {}
    return {
        "fetch_fixed_s": routing.fetch.fixed_seconds,
        "fetch_per_token_s": routing.fetch.per_token_seconds,
        "min_fetch_tokens": routing.fetch.min_tokens,
        "copy_price_s_per_token": routing.copy_price_seconds_per_token,
    }


@dataclass(frozen=True, slots=True)
class ChosenPolicy:
    """One policy the spec chooses, with its settings as the router gets them and the CR field they come from."""

    registry: PolicyRegistry[Any]
    name: str
    settings: dict[str, Any]
    field: str

    def validate(self) -> None:
        """Raises PolicyError naming `field` when the declaration refuses the settings (the router's check)."""
        self.registry.validate(self.name, self.settings, self.field)


def chosen_policies(spec: AgentServingClusterSpec) -> tuple[ChosenPolicy, ChosenPolicy, ChosenPolicy]:
    """Planner, prefill routing and decode binding: the typed fields' settings, then the free-form ones over them."""
    routing = spec.routing
    return (
        ChosenPolicy(PLANNERS, spec.planner.effective_policy.value,
                     {**planner_settings(spec), **(spec.planner.settings or {})}, "planner.settings"),
        ChosenPolicy(PREFILL_ROUTING, routing.prefill_policy.value,
                     {**prefill_settings(spec), **(routing.prefill_settings or {})}, "routing.prefillSettings"),
        ChosenPolicy(DECODE_BINDING, routing.decode_policy.value, dict(routing.decode_settings or {}),
                     "routing.decodeSettings"),
    )  # fmt: skip


def render_router_settings(cluster: ClusterRef, spec: AgentServingClusterSpec) -> dict[str, Any]:
    """`RouterSettings` fields: node discovery through the headless Service, the spec's policies and
    windows, and the kubernetes applier writing this cluster's `status.targetSplit` (none when static)."""
    planner = spec.planner
    chosen_planner, prefill, decode = chosen_policies(spec)
    out: dict[str, Any] = {
        "host": POD_BIND_HOST,
        "port": ROUTER_HTTP_PORT,
        "metrics_port": ROUTER_METRICS_PORT,
        "nodes_dns": f"{node_agent_service_host(cluster)}:{NODE_AGENT_GRPC_PORT}",
        "planner": chosen_planner.name,
        "planner_settings": chosen_planner.settings,
        "window_s": float(planner.window_seconds),
        "slices": planner.slices,
        "warmup_s": float(planner.warmup_seconds),
        "prefill_routing": prefill.name,
        "routing_settings": prefill.settings,
        "decode_routing": decode.name,
        "decode_settings": decode.settings,
        "eviction": spec.eviction.policy.value,
        "applier": "none" if planner.mode is PlannerMode.STATIC else "kubernetes",
        "cluster_name": cluster.name,
        "namespace": cluster.namespace,
        "branch_snapshot_file": f"{ROUTER_STATE_MOUNT}/{BRANCH_SNAPSHOT_FILE}",
        **_credential_settings(cluster, spec),
    }
    mounts = credential_mounts(cluster, spec)
    if mounts:
        out["api_key_file"] = mounts["api-keys"].path(API_KEYS_KEY)
    if spec.engine.profile is not None:
        out["profile"] = spec.engine.profile
    if spec.engine.model is not None:
        out["model_name"] = spec.engine.model
    # the settings the router will check at load, checked here too: a mismatch fails the reconcile, never runs
    for policy in (chosen_planner, prefill, decode):
        policy.validate()
    return out


def render_node_agent_settings(
    cluster: ClusterRef, spec: AgentServingClusterSpec, profile: HardwareProfile | None
) -> dict[str, Any]:
    """`NodeAgentSettings` fields shared by every node agent of the cluster (per-pod ones: `NODE_AGENT_ENV`).

    `kvCache.l1Tokens` / `l2Tokens` become the emulated engine's `l1_pages` / `l2_pages`: tokens divided by
    the profile's page size (the node agent's pages are the profile's), at least one page and at most the
    node agent's `MAX_PAGES`; unset, the node agent sizes them from the profile.
    """
    page_tokens = profile.page_tokens if profile is not None else effective_kv(spec, profile).page_tokens
    out: dict[str, Any] = {
        "grpc_port": NODE_AGENT_GRPC_PORT,
        "metrics_port": NODE_AGENT_METRICS_PORT,
        "eviction": spec.eviction.policy.value,
        **_credential_settings(cluster, spec),
        "peer_networks": peer_networks(spec),
        # a fetch may name only a member of this cluster: an address of its node agents' headless Service
        "peer_service": f"{node_agent_service_host(cluster)}:{NODE_AGENT_GRPC_PORT}",
    }
    if spec.engine.profile is not None:
        out["profile"] = spec.engine.profile
    for key, tokens in (("l1_pages", spec.kv_cache.l1_tokens), ("l2_pages", spec.kv_cache.l2_tokens)):
        if tokens is not None:
            out[key] = min(MAX_PAGES, max(1, tokens // page_tokens))
    return out
