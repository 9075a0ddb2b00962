"""Identity and access of a cluster's workloads: ServiceAccounts, the router's Role, the NetworkPolicy.

The router may get and watch its own AgentServingCluster (by resourceNames) and patch that object's status
subresource, nothing else. Node agents run with a ServiceAccount that mounts no token and has no Role: they
never talk to the API server. The NetworkPolicy (on unless the spec disables it) lets only the cluster's
router, the operator's pods and peer node agents reach the node agents' gRPC port, only peer node agents
reach the KV transfer port, and (when the operator names its namespace) only Prometheus reaches the metrics
port.

Boundary: pure builders returning dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evolving_infra.operator.meta import GROUP, PLURAL, ClusterRef, Component, child_metadata, selector_labels
from evolving_infra.operator.rendered import NODE_AGENT_GRPC_PORT, NODE_AGENT_METRICS_PORT, NODE_AGENT_TRANSFER_PORT

RBAC_API = "rbac.authorization.k8s.io/v1"
OPERATOR_NAMESPACE = "evolving-infra-system"
OPERATOR_POD_LABELS: Mapping[str, str] = {
    "app.kubernetes.io/name": "evolving-infra",
    "app.kubernetes.io/component": "operator",
}


def router_rules(cluster: ClusterRef) -> list[dict[str, Any]]:
    """The router's only permissions."""
    return [
        {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [cluster.name], "verbs": ["get", "watch"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "resourceNames": [cluster.name], "verbs": ["patch"]},
    ]


def build_router_service_account(cluster: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_metadata(cluster, Component.ROUTER, "router"),
        "automountServiceAccountToken": True,
    }


def build_router_role(cluster: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": child_metadata(cluster, Component.ROUTER, "router"),
        "rules": router_rules(cluster),
    }


def build_router_role_binding(cluster: ClusterRef) -> dict[str, Any]:
    name = cluster.child_name("router")
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": child_metadata(cluster, Component.ROUTER, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}],
    }


def build_node_agent_service_account(cluster: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_metadata(cluster, Component.NODE_AGENT, "node-agent"),
        "automountServiceAccountToken": False,
    }


def build_network_policy(
    cluster: ClusterRef,
    operator_namespace: str = OPERATOR_NAMESPACE,
    operator_pod_labels: Mapping[str, str] = OPERATOR_POD_LABELS,
    metrics_namespace: str | None = None,
) -> dict[str, Any]:
    """Ingress to the node agents: gRPC from the router, the operator (from its real namespace) and peer node
    agents (page reads and transfer endpoints), KV transfer from peers, and the metrics port from
    `metrics_namespace` (Prometheus) when one is given."""
    policy: dict[str, Any] = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(cluster, Component.NODE_AGENT, "node-agent"),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(cluster, Component.NODE_AGENT)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [
                        {"podSelector": {"matchLabels": selector_labels(cluster, Component.ROUTER)}},
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}},
                            "podSelector": {"matchLabels": dict(operator_pod_labels)},
                        },
                        {"podSelector": {"matchLabels": selector_labels(cluster, Component.NODE_AGENT)}},
                    ],
                    "ports": [{"protocol": "TCP", "port": NODE_AGENT_GRPC_PORT}],
                },
                {
                    "from": [{"podSelector": {"matchLabels": selector_labels(cluster, Component.NODE_AGENT)}}],
                    "ports": [{"protocol": "TCP", "port": NODE_AGENT_TRANSFER_PORT}],
                },
            ],
        },
    }
    if metrics_namespace is not None:
        policy["spec"]["ingress"].append(
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": metrics_namespace}}}],
                "ports": [{"protocol": "TCP", "port": NODE_AGENT_METRICS_PORT}],
            }
        )
    return policy
