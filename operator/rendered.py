"""The router's and the node agents' settings, rendered from a spec for the settings ConfigMap.

Keys are the keyword arguments of the registries that build each policy (`make_planner`,
`make_prefill_router`, `make_decode_binder`, `eviction_policy`), so the router passes them through
unchanged; tests build every policy from rendered settings.

Boundary: pure; ports and file names the workloads agree on are constants here.
"""

from __future__ import annotations

from typing import Any

from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.semantics import effective_kv, host_memory_bytes
from evolving_infra.operator.spec import AgentServingClusterSpec
from evolving_infra.router.planner.base import PlannerName
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
    return {"interval_s": float(planner.window_seconds)}


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


def render_router_settings(cluster: ClusterRef, spec: AgentServingClusterSpec) -> dict[str, Any]:
    return {
        "cluster": {"namespace": cluster.namespace, "name": cluster.name},
        "http_port": ROUTER_HTTP_PORT,
        "admin_port": ROUTER_ADMIN_PORT,
        "metrics_port": ROUTER_METRICS_PORT,
        "node_agents": {"service": node_agent_service_host(cluster), "grpc_port": NODE_AGENT_GRPC_PORT},
        "node_count": spec.node_count,
        "initial_split": {"prefill": spec.initial_split.prefill, "decode": spec.initial_split.decode},
        "planner": {
            "mode": spec.planner.mode.value,
            "name": spec.planner.effective_policy.value,
            "warmup_s": float(spec.planner.warmup_seconds),
            "settings": planner_settings(spec),
        },
        "prefill_routing": {"name": spec.routing.prefill_policy.value, "settings": prefill_settings(spec)},
        "decode_binding": {"name": spec.routing.decode_policy.value, "settings": {}},
        "eviction": {"name": spec.eviction.policy.value},
    }


def render_node_agent_settings(
    cluster: ClusterRef, spec: AgentServingClusterSpec, profile: HardwareProfile | None
) -> dict[str, Any]:
    kv = effective_kv(spec, profile)
    host_bytes = host_memory_bytes(spec, profile)
    engine: dict[str, Any] = {"backend": spec.engine.backend.value, "gpus": spec.gpus_per_node}
    if spec.engine.profile is not None:
        engine["profile"] = spec.engine.profile
    if spec.engine.model is not None:
        engine["model"] = spec.engine.model
    kv_cache: dict[str, Any] = {"page_tokens": kv.page_tokens, "l2_path": L2_MOUNT}
    for key, value in (("l1_tokens", kv.l1_tokens), ("l2_tokens", kv.l2_tokens)):
        if value is not None:
            kv_cache[key] = value
    if host_bytes is not None:
        kv_cache["l2_bytes"] = int(host_bytes)
    return {
        "cluster": {"namespace": cluster.namespace, "name": cluster.name},
        "grpc_port": NODE_AGENT_GRPC_PORT,
        "transfer_port": NODE_AGENT_TRANSFER_PORT,
        "metrics_port": NODE_AGENT_METRICS_PORT,
        "engine": engine,
        "kv_cache": kv_cache,
        "eviction": {"name": spec.eviction.policy.value},
    }
