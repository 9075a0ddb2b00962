"""Pure manifest builders: every child object of an AgentServingCluster, as a dict, with no API calls.

`build_children(ctx)` returns all of them in apply order; each `build_*` returns one. Every child carries
the cluster as its controlling owner (garbage-collected with it) and the shared labels; pod templates
carry a hash of their rendered settings so a settings change rolls exactly the pods it concerns (a router
setting never restarts node agents, whose host memory holds the L2 KV pool).

Workloads run non-root with a read-only root filesystem and every capability dropped. Node agents run on
the selected nodes (minus nodes an earlier cluster claimed), get the node name and pod IP through the
downward API, mount the L2 pool's host memory, and are probed over gRPC health. Unless the cluster is
`security.insecure`, both workloads mount the credential Secrets their rendered settings name (the cluster
token, the mutual TLS material when set, and for the router its API keys), read-only.

Boundary: pure; the handlers apply what these return. `validate_spec_semantics` is re-exported here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from evolving_infra.node_agent.api.server import SERVICE_NAME as NODE_AGENT_SERVICE_NAME
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.operator import rbac
from evolving_infra.operator.meta import (
    ANNOTATION_PREFIX, ClusterRef, Component, child_metadata, labels, selector_labels,
)  # fmt: skip
from evolving_infra.operator.quantity import format_bytes, parse_quantity
from evolving_infra.operator.rendered import (
    L2_MOUNT, NODE_AGENT_ENV, NODE_AGENT_GRPC_PORT, NODE_AGENT_METRICS_PORT, NODE_AGENT_SETTINGS_FILE,
    NODE_AGENT_TRANSFER_PORT,
    ROUTER_ADMIN_PORT, ROUTER_HTTP_PORT, ROUTER_METRICS_PORT, ROUTER_SETTINGS_FILE, ROUTER_STATE_MOUNT, SETTINGS_DIR,
    credential_mounts, render_node_agent_settings, render_router_settings,
)  # fmt: skip
from evolving_infra.operator.semantics import host_memory_bytes, validate_spec_semantics
from evolving_infra.operator.spec import AgentServingClusterSpec, EngineBackend, HostMemoryMedium, ImageSpec, Quantity

__all__ = ["BuildContext", "build_children", "validate_spec_semantics"]

RUN_AS = 65532
NODE_AGENT_READINESS_SERVICE = NODE_AGENT_SERVICE_NAME
"""gRPC health service name the node agent reports ready on, NOT_SERVING once draining (empty name: alive)."""
GPU_RESOURCE = "nvidia.com/gpu"
SETTINGS_HASH = f"{ANNOTATION_PREFIX}/settings-hash"


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What the builders need: the cluster, its parsed spec, its hardware profile and operator-wide settings.

    default_image: the operator's own image, used where the spec sets none; excluded_nodes: nodes the
    selector matches but an earlier cluster claimed (see `partitions`).
    """

    cluster: ClusterRef
    spec: AgentServingClusterSpec
    profile: HardwareProfile | None
    default_image: str
    operator_namespace: str = rbac.OPERATOR_NAMESPACE
    operator_pod_labels: Mapping[str, str] = field(default_factory=lambda: dict(rbac.OPERATOR_POD_LABELS))
    excluded_nodes: Sequence[str] = ()
    metrics_namespace: str | None = None
    """Namespace of the Prometheus the NetworkPolicy admits to the node agents' metrics port (None: none)."""


def _settings_yaml(data: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(data), sort_keys=True)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _container_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}}


def _image(ctx: BuildContext, image: ImageSpec) -> dict[str, str]:
    return {"image": image.image or ctx.default_image, "imagePullPolicy": image.pull_policy.value}


def _env_from_field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _settings_volume(ctx: BuildContext, file: str) -> dict[str, Any]:
    return {
        "name": "settings",
        "configMap": {"name": ctx.cluster.child_name("settings"), "items": [{"key": file, "path": file}]},
    }


def _credential_volumes(ctx: BuildContext, roles: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the credential Secrets with these roles (`rendered.credential_mounts`), read-only
    files readable by the pod's group only; none for an insecure cluster."""
    mounts = credential_mounts(ctx.cluster, ctx.spec)
    volumes, volume_mounts = [], []
    for role in roles:
        m = mounts.get(role)
        if m is None:
            continue
        items = [{"key": key, "path": key} for key in m.keys]
        volumes.append({"name": m.volume, "secret": {"secretName": m.secret, "items": items, "defaultMode": 0o440}})
        volume_mounts.append({"name": m.volume, "mountPath": m.directory, "readOnly": True})
    return volumes, volume_mounts


def build_settings_configmap(ctx: BuildContext) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(ctx.cluster, Component.SETTINGS, "settings"),
        "data": {
            ROUTER_SETTINGS_FILE: _settings_yaml(render_router_settings(ctx.cluster, ctx.spec)),
            NODE_AGENT_SETTINGS_FILE: _settings_yaml(render_node_agent_settings(ctx.cluster, ctx.spec, ctx.profile)),
        },
    }


def _add_quantity(base: Mapping[str, Quantity], key: str, extra: int) -> dict[str, Quantity]:
    out = dict(base)
    out[key] = format_bytes(parse_quantity(out[key]) + extra) if key in out else format_bytes(extra)
    return out


def node_agent_resources(ctx: BuildContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resources, L2 volume source) of the node agent container: requests and limits plus the L2 pool."""
    spec = ctx.spec
    res = spec.resources.node_agent
    requests: dict[str, Quantity] = dict(res.requests)
    limits: dict[str, Quantity] = dict(res.limits or {})
    size = host_memory_bytes(spec, ctx.profile)
    medium = res.host_memory.medium
    volume: dict[str, Any] = {"medium": medium.value}
    if size is not None:
        volume["sizeLimit"] = format_bytes(size)
        if medium is HostMemoryMedium.MEMORY:
            # Memory-backed emptyDir pages count against the container's memory.
            requests = _add_quantity(requests, "memory", int(size))
            if "memory" in limits:
                limits = _add_quantity(limits, "memory", int(size))
        else:
            key = f"hugepages-{medium.value.split('-', 1)[1]}"
            requests[key] = limits[key] = format_bytes(size)  # huge pages: request must equal limit
    if spec.engine.backend is EngineBackend.SGLANG:
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = spec.gpus_per_node
    out: dict[str, Any] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out, volume


def node_affinity(ctx: BuildContext) -> dict[str, Any] | None:
    """Required node affinity for the selector's expressions and the nodes claimed by other clusters."""
    term: dict[str, Any] = {}
    exprs = ctx.spec.node_selector.match_expressions or ()
    if exprs:
        term["matchExpressions"] = [
            {"key": e.key, "operator": e.operator.value, **({"values": list(e.values)} if e.values else {})} for e in exprs
        ]
    if ctx.excluded_nodes:
        term["matchFields"] = [{"key": "metadata.name", "operator": "NotIn", "values": sorted(ctx.excluded_nodes)}]
    if not term:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def build_node_agent_daemonset(ctx: BuildContext) -> dict[str, Any]:
    cluster, spec = ctx.cluster, ctx.spec
    resources, l2_volume = node_agent_resources(ctx)
    settings = _settings_yaml(render_node_agent_settings(cluster, spec, ctx.profile))
    secret_volumes, secret_mounts = _credential_volumes(ctx, ("token", "tls"))
    container = {
        "name": "node-agent",
        **_image(ctx, spec.images.node_agent),
        "args": ["node-agent", "serve", "--settings", f"{SETTINGS_DIR}/{NODE_AGENT_SETTINGS_FILE}"],
        "env": [
            _env_from_field("NODE_NAME", "spec.nodeName"),
            _env_from_field("POD_NAME", "metadata.name"),
            _env_from_field("POD_NAMESPACE", "metadata.namespace"),
            _env_from_field("POD_IP", "status.podIP"),
            *(_env_from_field(name, path) for name, path in NODE_AGENT_ENV),
        ],
        "ports": [
            {"name": "grpc", "containerPort": NODE_AGENT_GRPC_PORT, "protocol": "TCP"},
            {"name": "kv-transfer", "containerPort": NODE_AGENT_TRANSFER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": NODE_AGENT_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {"grpc": {"port": NODE_AGENT_GRPC_PORT}, "periodSeconds": 10, "failureThreshold": 6},
        "readinessProbe": {
            "grpc": {"port": NODE_AGENT_GRPC_PORT, "service": NODE_AGENT_READINESS_SERVICE},
            "periodSeconds": 5,
        },
        "resources": resources,
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "settings", "mountPath": SETTINGS_DIR, "readOnly": True},
            {"name": "l2", "mountPath": L2_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
            *secret_mounts,
        ],
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": cluster.child_name("node-agent"),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": 120,
        "containers": [container],
        "volumes": [
            _settings_volume(ctx, NODE_AGENT_SETTINGS_FILE),
            {"name": "l2", "emptyDir": l2_volume},
            {"name": "tmp", "emptyDir": {}},
            *secret_volumes,
        ],
    }
    if spec.node_selector.match_labels:
        pod_spec["nodeSelector"] = dict(spec.node_selector.match_labels)
    affinity = node_affinity(ctx)
    if affinity is not None:
        pod_spec["affinity"] = affinity
    if spec.engine.backend is EngineBackend.SGLANG:
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": child_metadata(cluster, Component.NODE_AGENT, "node-agent"),
        "spec": {
            "selector": {"matchLabels": selector_labels(cluster, Component.NODE_AGENT)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": labels(cluster, Component.NODE_AGENT),
                    "annotations": {SETTINGS_HASH: _hash(settings)},
                },
                "spec": pod_spec,
            },
        },
    }


def build_node_agent_service(ctx: BuildContext) -> dict[str, Any]:
    """Headless: one DNS record per node agent, including agents not ready (a switching node stays reachable)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(ctx.cluster, Component.NODE_AGENT, "node-agent"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(ctx.cluster, Component.NODE_AGENT),
            "ports": [
                {"name": "grpc", "port": NODE_AGENT_GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "kv-transfer", "port": NODE_AGENT_TRANSFER_PORT, "targetPort": "kv-transfer", "protocol": "TCP"},
                {"name": "metrics", "port": NODE_AGENT_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_router_deployment(ctx: BuildContext) -> dict[str, Any]:
    cluster, spec = ctx.cluster, ctx.spec
    settings = _settings_yaml(render_router_settings(cluster, spec))
    secret_volumes, secret_mounts = _credential_volumes(ctx, ("token", "tls", "api-keys"))
    res = spec.resources.router
    resources: dict[str, Any] = {"requests": dict(res.requests)}
    if res.limits:
        resources["limits"] = dict(res.limits)
    container = {
        "name": "router",
        **_image(ctx, spec.images.router),
        "args": ["router", "serve", "--settings", f"{SETTINGS_DIR}/{ROUTER_SETTINGS_FILE}"],
        "env": [
            _env_from_field("POD_NAME", "metadata.name"),
            _env_from_field("POD_NAMESPACE", "metadata.namespace"),
            {"name": "CLUSTER_NAME", "value": cluster.name},
        ],
        "ports": [
            {"name": "http", "containerPort": ROUTER_HTTP_PORT, "protocol": "TCP"},
            {"name": "admin", "containerPort": ROUTER_ADMIN_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "resources": resources,
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "settings", "mountPath": SETTINGS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "state", "mountPath": ROUTER_STATE_MOUNT},
            *secret_mounts,
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(cluster, Component.ROUTER, "router"),
        "spec": {
            "replicas": spec.router.replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector_labels(cluster, Component.ROUTER)},
            "template": {
                "metadata": {"labels": labels(cluster, Component.ROUTER), "annotations": {SETTINGS_HASH: _hash(settings)}},
                "spec": {
                    "serviceAccountName": cluster.child_name("router"),
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(),
                    "containers": [container],
                    "volumes": [
                        _settings_volume(ctx, ROUTER_SETTINGS_FILE), {"name": "tmp", "emptyDir": {}},
                        {"name": "state", "emptyDir": {"sizeLimit": "1Gi"}}, *secret_volumes,
                    ],  # fmt: skip
                },
            },
        },
    }


def build_router_service(ctx: BuildContext) -> dict[str, Any]:
    """The OpenAI-compatible endpoint agent harnesses call."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(ctx.cluster, Component.ROUTER, "router"),
        "spec": {
            "type": ctx.spec.router.service_type.value,
            "selector": selector_labels(ctx.cluster, Component.ROUTER),
            "ports": [{"name": "http", "port": ctx.spec.router.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_router_admin_service(ctx: BuildContext) -> dict[str, Any]:
    """In-cluster only: the router's admin gRPC (drain and phase-switch coordination) and its metrics."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(ctx.cluster, Component.ROUTER, "router-admin"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(ctx.cluster, Component.ROUTER),
            "ports": [
                {"name": "admin", "port": ROUTER_ADMIN_PORT, "targetPort": "admin", "protocol": "TCP"},
                {"name": "metrics", "port": ROUTER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_children(ctx: BuildContext) -> list[dict[str, Any]]:
    """Every child object, in apply order (identities and settings before the workloads that use them)."""
    cluster = ctx.cluster
    children = [
        rbac.build_router_service_account(cluster),
        rbac.build_router_role(cluster),
        rbac.build_router_role_binding(cluster),
        rbac.build_node_agent_service_account(cluster),
        build_settings_configmap(ctx),
        build_node_agent_service(ctx),
        build_router_service(ctx),
        build_router_admin_service(ctx),
        build_node_agent_daemonset(ctx),
        build_router_deployment(ctx),
    ]
    if ctx.spec.network_policy.enabled:
        children.append(rbac.build_network_policy(cluster, ctx.operator_namespace, ctx.operator_pod_labels, ctx.metrics_namespace))
    return children
