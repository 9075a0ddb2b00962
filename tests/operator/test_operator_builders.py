"""Pure builders: selectors match labels, every child is owned, RBAC exactly as stated, NetworkPolicy peers,
security contexts, host memory for L2, and rendered settings that the router's registries accept."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from evolving_infra.core.eviction import eviction_policy
from evolving_infra.operator import rbac
from evolving_infra.operator.builders import (
    GPU_RESOURCE, SETTINGS_HASH, BuildContext, build_children, build_node_agent_daemonset, build_router_deployment,
    build_settings_configmap,
)  # fmt: skip
from evolving_infra.operator.meta import ClusterRef, Component, selector_labels
from evolving_infra.operator.quantity import parse_quantity
from evolving_infra.operator.rendered import NODE_AGENT_GRPC_PORT, NODE_AGENT_TRANSFER_PORT, planner_settings
from evolving_infra.operator.semantics import builtin_profile_table
from evolving_infra.operator.spec import AgentServingClusterSpec
from evolving_infra.router.planner.registry import make_planner
from evolving_infra.router.routing.registry import make_decode_binder, make_prefill_router

CLUSTER = ClusterRef("glm-9", "agents", "0b6c2f1e-1111-2222-3333-444455556666")
GLM = builtin_profile_table()["glm-5.2-4xgb300-tp4"]


def _spec(**edits: Any) -> AgentServingClusterSpec:
    data: dict[str, Any] = {
        "nodeSelector": {
            "matchLabels": {"evolving-infra.io/pool": "glm-9"},
            "matchExpressions": [{"key": "gpu", "operator": "In", "values": ["gb300"]}],
        },
        "nodeCount": 9,
        "engine": {"profile": "glm-5.2-4xgb300-tp4"},
        "initialSplit": {"prefill": 6, "decode": 3},
        "networkPolicy": {"enabled": True},
    }
    data.update(edits)
    return AgentServingClusterSpec.from_kube(data)


def _ctx(spec: AgentServingClusterSpec | None = None, **kw: Any) -> BuildContext:
    return BuildContext(CLUSTER, spec or _spec(), GLM, "evolving-infra:test", **kw)


def _matches(selector: Mapping[str, str], pod_labels: Mapping[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in selector.items())


def _by_kind(children: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    [obj] = [c for c in children if c["kind"] == kind and c["metadata"]["name"] == f"glm-9-{suffix}"]
    return obj


def test_every_child_is_owned_by_the_cluster_and_labelled() -> None:
    children = build_children(_ctx())
    assert len({(c["kind"], c["metadata"]["name"]) for c in children}) == len(children) == 11
    for child in children:
        md = child["metadata"]
        assert md["namespace"] == "agents"
        assert md["ownerReferences"] == [
            {
                "apiVersion": "serving.evolving-infra.io/v1alpha1",
                "kind": "AgentServingCluster",
                "name": "glm-9",
                "uid": CLUSTER.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = md["labels"]
        assert labels["app.kubernetes.io/name"] == "evolving-infra"
        assert labels["app.kubernetes.io/instance"] == "glm-9"
        assert labels["app.kubernetes.io/managed-by"] == "evolving-infra-operator"
        assert labels["app.kubernetes.io/part-of"] == "evolving-infra"
        assert labels["app.kubernetes.io/component"] in {c.value for c in Component}
        assert len(md["name"]) <= 63


def test_network_policy_only_when_enabled() -> None:
    kinds = [c["kind"] for c in build_children(_ctx(_spec(networkPolicy={"enabled": False})))]
    assert "NetworkPolicy" not in kinds
    default = AgentServingClusterSpec.from_kube({k: v for k, v in _spec().to_kube().items() if k != "networkPolicy"})
    assert "NetworkPolicy" in [c["kind"] for c in build_children(_ctx(default))]  # on by default


def test_selectors_match_their_pods() -> None:
    children = build_children(_ctx())
    ds = _by_kind(children, "DaemonSet", "node-agent")
    dep = _by_kind(children, "Deployment", "router")
    agent_pod = ds["spec"]["template"]["metadata"]["labels"]
    router_pod = dep["spec"]["template"]["metadata"]["labels"]
    assert _matches(ds["spec"]["selector"]["matchLabels"], agent_pod)
    assert _matches(dep["spec"]["selector"]["matchLabels"], router_pod)
    assert not _matches(ds["spec"]["selector"]["matchLabels"], router_pod)
    assert _matches(_by_kind(children, "Service", "node-agent")["spec"]["selector"], agent_pod)
    assert _matches(_by_kind(children, "Service", "router")["spec"]["selector"], router_pod)
    assert _matches(_by_kind(children, "Service", "router-admin")["spec"]["selector"], router_pod)
    other = ClusterRef("other", "agents", "u2")
    assert not _matches(selector_labels(other, Component.NODE_AGENT), agent_pod)


def test_node_agents_land_on_the_selected_nodes_minus_claimed_ones() -> None:
    pod = build_node_agent_daemonset(_ctx(excluded_nodes=("n9", "n3")))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"evolving-infra.io/pool": "glm-9"}
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "gpu", "operator": "In", "values": ["gb300"]}]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n3", "n9"]}]


def test_node_agent_pod_shape() -> None:
    pod = build_node_agent_daemonset(_ctx())["spec"]["template"]["spec"]
    [c] = pod["containers"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env["NODE_NAME"] == "spec.nodeName" and env["POD_IP"] == "status.podIP"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"] == NODE_AGENT_GRPC_PORT
    assert c["livenessProbe"]["grpc"]["port"] == NODE_AGENT_GRPC_PORT
    assert c["readinessProbe"]["grpc"]["port"] == NODE_AGENT_GRPC_PORT
    assert c["image"] == "evolving-infra:test" and c["imagePullPolicy"] == "IfNotPresent"
    assert pod["serviceAccountName"] == "glm-9-node-agent" and pod["automountServiceAccountToken"] is False
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert set(mounts) == set(volumes) == {"settings", "l2", "tmp", "cluster-token"}
    assert volumes["settings"]["configMap"]["name"] == "glm-9-settings"


@pytest.mark.parametrize("build", [build_node_agent_daemonset, build_router_deployment])
def test_workloads_run_locked_down(build: Any) -> None:
    pod = build(_ctx())["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "add" not in sc["capabilities"]
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])  # the only writable scratch space


def test_l2_host_memory_is_added_to_the_memory_request() -> None:
    c = build_node_agent_daemonset(_ctx())["spec"]["template"]["spec"]["containers"][0]
    l2_bytes = GLM.l2_tokens * GLM.kv_bytes_per_token
    assert parse_quantity(c["resources"]["requests"]["memory"]) == parse_quantity("4Gi") + l2_bytes
    spec = _spec(resources={"nodeAgent": {"limits": {"memory": "8Gi"}, "hostMemory": {"size": "500G"}}})
    c = build_node_agent_daemonset(_ctx(spec))["spec"]["template"]["spec"]["containers"][0]
    assert parse_quantity(c["resources"]["limits"]["memory"]) == parse_quantity("8Gi") + 500 * 10**9


def test_l2_on_huge_pages_requests_them_equal_to_limits() -> None:
    spec = _spec(resources={"nodeAgent": {"hostMemory": {"medium": "HugePages-1Gi", "size": "512Gi"}}})
    pod = build_node_agent_daemonset(_ctx(spec))["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["requests"]["hugepages-1Gi"] == res["limits"]["hugepages-1Gi"] == "512Gi"
    assert res["requests"]["memory"] == "4Gi"
    assert {v["name"]: v for v in pod["volumes"]}["l2"]["emptyDir"] == {"medium": "HugePages-1Gi", "sizeLimit": "512Gi"}


def test_sglang_backend_requests_the_node_gpus() -> None:
    spec = _spec(engine={"backend": "sglang", "model": "zai/GLM-5.2", "profile": "glm-5.2-4xgb300-tp4"})
    pod = build_node_agent_daemonset(_ctx(spec))["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["limits"][GPU_RESOURCE] == res["requests"][GPU_RESOURCE] == 4
    assert GPU_RESOURCE not in build_node_agent_daemonset(_ctx())["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {})


def test_router_deployment_is_one_replica_recreate() -> None:
    dep = build_router_deployment(_ctx())
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "glm-9-router"


def test_router_service_follows_the_spec() -> None:
    spec = _spec(router={"serviceType": "LoadBalancer", "port": 443})
    svc = _by_kind(build_children(_ctx(spec)), "Service", "router")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 443, "targetPort": "http", "protocol": "TCP"}]
    headless = _by_kind(build_children(_ctx(spec)), "Service", "node-agent")
    assert headless["spec"]["clusterIP"] == "None"


def test_router_rbac_is_exactly_its_own_object_and_status() -> None:
    children = build_children(_ctx())
    role = _by_kind(children, "Role", "router")
    assert role["rules"] == [
        {
            "apiGroups": ["serving.evolving-infra.io"],
            "resources": ["agentservingclusters"],
            "resourceNames": ["glm-9"],
            "verbs": ["get", "watch"],
        },
        {
            "apiGroups": ["serving.evolving-infra.io"],
            "resources": ["agentservingclusters/status"],
            "resourceNames": ["glm-9"],
            "verbs": ["patch"],
        },
    ]
    binding = _by_kind(children, "RoleBinding", "router")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "glm-9-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "glm-9-router", "namespace": "agents"}]
    agent_sa = _by_kind(children, "ServiceAccount", "node-agent")
    assert agent_sa["automountServiceAccountToken"] is False
    roles = [c for c in children if c["kind"] in ("Role", "RoleBinding")]
    assert all(c["metadata"]["name"] == "glm-9-router" for c in roles)  # node agents get none


def test_network_policy_peers() -> None:
    children = build_children(_ctx(operator_namespace="ops", operator_pod_labels={"app": "op"}))
    policy = _by_kind(children, "NetworkPolicy", "node-agent")["spec"]
    agent_pod = _by_kind(children, "DaemonSet", "node-agent")["spec"]["template"]["metadata"]["labels"]
    router_pod = _by_kind(children, "Deployment", "router")["spec"]["template"]["metadata"]["labels"]
    assert _matches(policy["podSelector"]["matchLabels"], agent_pod)
    assert policy["policyTypes"] == ["Ingress"]
    grpc, transfer = policy["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": NODE_AGENT_GRPC_PORT}]
    router_peer, operator_peer, agent_peer = grpc["from"]
    assert set(router_peer) == {"podSelector"} and _matches(router_peer["podSelector"]["matchLabels"], router_pod)
    # peer node agents read pages and transfer endpoints over gRPC
    assert set(agent_peer) == {"podSelector"} and _matches(agent_peer["podSelector"]["matchLabels"], agent_pod)
    assert not _matches(agent_peer["podSelector"]["matchLabels"], router_pod)
    assert operator_peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
        "podSelector": {"matchLabels": {"app": "op"}},
    }
    assert transfer["ports"] == [{"protocol": "TCP", "port": NODE_AGENT_TRANSFER_PORT}]
    [peer] = transfer["from"]
    assert _matches(peer["podSelector"]["matchLabels"], agent_pod)
    assert not _matches(peer["podSelector"]["matchLabels"], router_pod)


def test_settings_change_rolls_only_the_pods_it_concerns() -> None:
    def hashes(spec: AgentServingClusterSpec) -> tuple[str, str]:
        ctx = _ctx(spec)
        return (
            build_node_agent_daemonset(ctx)["spec"]["template"]["metadata"]["annotations"][SETTINGS_HASH],
            build_router_deployment(ctx)["spec"]["template"]["metadata"]["annotations"][SETTINGS_HASH],
        )

    base = hashes(_spec())
    planner = hashes(_spec(planner={"windowSeconds": 300}))
    eviction = hashes(_spec(eviction={"policy": "lru"}))
    assert planner[0] == base[0] and planner[1] != base[1]
    assert eviction[0] != base[0]


@pytest.mark.parametrize(
    "planner",
    [{}, {"policy": "dynamo"}, {"policy": "arrow"}, {"mode": "static"}, {"windowSeconds": 60, "slices": 6, "cooldownSeconds": 0}],
)
@pytest.mark.parametrize("prefill", ["ttft", "cache-aware", "sticky", "dynamo-kv", "dynamo-kv-pool", "round-robin"])
def test_rendered_settings_build_every_policy(planner: dict[str, Any], prefill: str) -> None:
    spec = _spec(planner=planner, routing={"prefillPolicy": prefill, "decodePolicy": "power-of-two"})
    settings = yaml.safe_load(_by_kind(build_children(_ctx(spec)), "ConfigMap", "settings")["data"]["router.yaml"])
    made = make_planner(settings["planner"], **settings["planner_settings"])
    assert made is not None and settings["planner_settings"] == planner_settings(spec)
    make_prefill_router(settings["prefill_routing"], **settings["routing_settings"])
    make_decode_binder(settings["decode_routing"], random.Random(0))
    eviction_policy(settings["eviction"])
    assert settings["nodes_dns"] == f"glm-9-node-agent.agents.svc:{NODE_AGENT_GRPC_PORT}"


def test_node_agent_settings_apply_overrides_to_the_profile() -> None:
    spec = _spec(kvCache={"pageTokens": 32, "l2Tokens": 100000})
    data = yaml.safe_load(_by_kind(build_children(_ctx(spec)), "ConfigMap", "settings")["data"]["node-agent.yaml"])
    # The node agent's pages are the profile's (pageTokens does not reach it): l2Tokens / profile page size.
    assert data["l2_pages"] == 100000 // GLM.page_tokens
    assert "l1_pages" not in data  # unset: the node agent derives it from the profile's L1:L2 ratio
    assert data["profile"] == "glm-5.2-4xgb300-tp4"


def test_default_image_is_used_only_where_the_spec_sets_none() -> None:
    spec = _spec(images={"router": {"image": "reg/router:1", "pullPolicy": "Always"}})
    ctx = _ctx(spec)
    router = build_router_deployment(ctx)["spec"]["template"]["spec"]["containers"][0]
    agent = build_node_agent_daemonset(ctx)["spec"]["template"]["spec"]["containers"][0]
    assert (router["image"], router["imagePullPolicy"]) == ("reg/router:1", "Always")
    assert agent["image"] == "evolving-infra:test"


def test_network_policy_builder_defaults_to_the_operator_install() -> None:
    policy = rbac.build_network_policy(CLUSTER)
    peer = policy["spec"]["ingress"][0]["from"][1]
    assert peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "evolving-infra-system"
    assert peer["podSelector"]["matchLabels"] == dict(rbac.OPERATOR_POD_LABELS)


def test_the_router_keeps_its_branch_snapshot_in_a_writable_state_folder() -> None:
    """A router container that crashes and restarts continues its branches (router/branch_snapshot.py)."""
    ctx = _ctx()
    settings = yaml.safe_load(build_settings_configmap(ctx)["data"]["router.yaml"])
    pod = build_router_deployment(ctx)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [state] = [m for m in container["volumeMounts"] if m["name"] == "state"]
    assert settings["branch_snapshot_file"].startswith(state["mountPath"] + "/") and not state.get("readOnly")
    assert {v["name"]: v for v in pod["volumes"]}["state"]["emptyDir"]["sizeLimit"] == "1Gi"
