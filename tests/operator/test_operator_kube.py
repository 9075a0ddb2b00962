"""API paths, kopf's login from the client configuration, child hashes and ownership, the status the operator owns."""

from __future__ import annotations

from kubernetes.client import Configuration

from evolving_infra.operator import children, kube, meta, summary
from evolving_infra.operator.handlers import connection_info, kopf_settings
from evolving_infra.operator.status import AgentServingClusterStatus, TargetSplit


def test_paths_of_core_group_cluster_scoped_and_subresources() -> None:
    assert kube.POD.path("ns") == "/api/v1/namespaces/ns/pods"
    assert kube.NODE.path(None, "n1") == "/api/v1/nodes/n1"
    assert kube.NODE.path("ignored", "n1") == "/api/v1/nodes/n1"
    assert kube.CLUSTER.path("ns", "c", "status") == f"/apis/{meta.API_VERSION}/namespaces/ns/{meta.PLURAL}/c/status"
    assert kube.CLUSTER.path() == f"/apis/{meta.API_VERSION}/{meta.PLURAL}"
    assert kube.kind_of({"apiVersion": "apps/v1", "kind": "DaemonSet"}).plural == "daemonsets"


def test_kopf_logs_in_with_the_clients_credentials() -> None:
    config = Configuration(host="https://k8s.example:6443")
    config.api_key = {"BearerToken": "abc"}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    config.ssl_ca_cert = "/ca.crt"
    info = connection_info(config)
    assert (info.server, info.token, info.scheme, info.ca_path, info.insecure) == ("https://k8s.example:6443", "abc", "Bearer", "/ca.crt", False)
    legacy = Configuration(host="http://127.0.0.1:1")
    legacy.api_key = {"authorization": "bearer xyz"}
    legacy.verify_ssl = False
    info = connection_info(legacy)
    assert (info.token, info.insecure) == ("xyz", True)
    assert connection_info(Configuration(host="http://h")).token is None


def test_kopf_keeps_its_state_under_our_prefix_and_posts_warnings_only() -> None:
    settings = kopf_settings()
    assert settings.persistence.finalizer.startswith(meta.ANNOTATION_PREFIX + "/")
    assert settings.persistence.progress_storage.prefix == meta.ANNOTATION_PREFIX
    assert settings.persistence.diffbase_storage.prefix == meta.ANNOTATION_PREFIX
    assert settings.posting.level == 30


def test_a_childs_hash_ignores_its_own_annotation_and_ownership_is_checked() -> None:
    cluster = meta.ClusterRef("c", "ns", "uid-1")
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta.child_metadata(cluster, meta.Component.SETTINGS, "settings"), "data": {"a": "1"}}
    first = children.desired_with_hash(obj)
    assert children.desired_with_hash(obj) == first and "annotations" not in obj["metadata"]
    changed = children.desired_with_hash({**obj, "data": {"a": "2"}})
    assert changed["metadata"]["annotations"][children.APPLIED_HASH] != first["metadata"]["annotations"][children.APPLIED_HASH]
    assert children.ownership_problem(first, cluster) is None
    foreign = {**first, "metadata": {**first["metadata"], "ownerReferences": []}}
    assert "controlled by nobody" in (children.ownership_problem(foreign, cluster) or "")
    other = meta.ClusterRef("d", "ns", "uid-2")
    assert "AgentServingCluster/c" in (children.ownership_problem(first, other) or "")


def test_the_operator_never_owns_the_routers_fields() -> None:
    status = AgentServingClusterStatus(
        split="1P1D", prefill=1, decode=1, target_split=TargetSplit(prefill=2, decode=0, split="2P0D", switch_generation=1)
    )
    owned = summary.owned(status)
    assert owned == {"split": "1P1D", "prefill": 1, "decode": 1}
    assert "targetSplit" not in owned and "fittedModels" not in owned
