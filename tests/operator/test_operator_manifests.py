"""The kustomize install: it builds, the operator runs locked down, and its rights cover what it creates.

`kubectl kustomize` runs where kubectl is installed (skipped with a reason otherwise); the checks on the
files themselves always run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from evolving_infra.operator.builders import BuildContext, build_children
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.rbac import OPERATOR_NAMESPACE, OPERATOR_POD_LABELS, router_rules
from evolving_infra.operator.semantics import builtin_profile_table
from evolving_infra.operator.spec import AgentServingClusterSpec

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
KUSTOMIZATIONS = ["", "base", "overlays/namespaced", "overlays/dev", "examples/fleet-3072-gpus"]
KUBECTL = shutil.which("kubectl")
# Plural resource names of the kinds the builders create.
RESOURCES = {
    "ServiceAccount": ("", "serviceaccounts"), "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"), "ConfigMap": ("", "configmaps"),
    "Service": ("", "services"), "DaemonSet": ("apps", "daemonsets"), "Deployment": ("apps", "deployments"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
}  # fmt: skip


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _base_object(kind: str, name: str) -> dict[str, Any]:
    for file in (MANIFESTS / "base").glob("*.yaml"):
        for doc in _docs(file):
            if doc.get("kind") == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in manifests/base")


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str | None = None) -> bool:
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and ("resourceNames" not in r or name in r["resourceNames"])
        for r in rules
    )


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_kustomization_files_exist(folder: str) -> None:
    kustomization = yaml.safe_load((MANIFESTS / folder / "kustomization.yaml").read_text(encoding="utf-8"))
    for resource in kustomization.get("resources", []):
        assert (MANIFESTS / folder / resource).exists(), f"{folder}: {resource} missing"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: kustomize builds not checked")
@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_kustomize_builds(folder: str) -> None:
    out = subprocess.run([KUBECTL, "kustomize", str(MANIFESTS / folder)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    if folder in ("", "base", "overlays/dev"):
        assert {"CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= set(kinds)
    if folder == "overlays/namespaced":
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        cluster_roles = [d for d in docs if d["kind"] == "ClusterRole"]
        assert [d["metadata"]["name"] for d in cluster_roles] == ["evolving-infra-operator-read.evolving-infra-system"]
        resources = {res for rule in cluster_roles[0]["rules"] for res in rule["resources"]}
        assert resources == {"customresourcedefinitions", "nodes"}
        [dep] = [d for d in docs if d["kind"] == "Deployment"]
        assert "--namespace=$(POD_NAMESPACE)" in dep["spec"]["template"]["spec"]["containers"][0]["args"]
    if folder == "examples/fleet-3072-gpus":
        assert kinds.count("AgentServingCluster") == 8


def test_operator_deployment_is_single_recreate_locked_down_with_liveness() -> None:
    dep = _base_object("Deployment", "evolving-infra-operator")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in OPERATOR_POD_LABELS.items())
    [c] = pod["spec"]["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    liveness = next(a for a in c["args"] if a.startswith("--liveness="))
    port = int(liveness.rsplit(":", 1)[1].split("/")[0])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports[c["livenessProbe"]["httpGet"]["port"]] == port
    assert c["livenessProbe"]["httpGet"]["path"] == liveness.split(str(port), 1)[1]
    assert "readinessProbe" not in c


def test_operator_namespace_matches_the_network_policy_default() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "base/kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["namespace"] == OPERATOR_NAMESPACE
    assert _base_object("Namespace", OPERATOR_NAMESPACE)


def _children() -> list[dict[str, Any]]:
    spec = AgentServingClusterSpec.from_kube(
        {
            "nodeSelector": {"matchLabels": {"p": "a"}},
            "nodeCount": 2,
            "engine": {"profile": "glm-5.2-4xgb300-tp4"},
            "initialSplit": {"prefill": 1, "decode": 1},
            "networkPolicy": {"enabled": True},
        }
    )
    ctx = BuildContext(ClusterRef("c", "ns", "u"), spec, builtin_profile_table()["glm-5.2-4xgb300-tp4"], "img")
    return build_children(ctx)


@pytest.mark.parametrize(
    "rules_file,kind,name",
    [("base/clusterrole.yaml", "ClusterRole", "evolving-infra-operator"), ("overlays/namespaced/role.yaml", "Role", "evolving-infra-operator")],
)
def test_operator_rights_cover_every_child_and_the_router_role(rules_file: str, kind: str, name: str) -> None:
    [role] = [d for d in _docs(MANIFESTS / rules_file) if d["kind"] == kind and d["metadata"]["name"] == name]
    rules = role["rules"]
    for child in _children():
        group, resource = RESOURCES[child["kind"]]
        for verb in ("get", "list", "watch", "create", "patch", "delete"):
            assert _allows(rules, group, resource, verb), f"{kind} lacks {verb} {resource}"
    # RBAC forbids granting rights one does not hold: the operator must hold the router's.
    for rule in router_rules(ClusterRef("c", "ns", "u")):
        for verb in rule["verbs"]:
            assert _allows(rules, rule["apiGroups"][0], rule["resources"][0], verb, "c")
    assert _allows(rules, "serving.evolving-infra.io", "agentservingclusters/status", "patch")
    assert not _allows(rules, "serving.evolving-infra.io", "agentservingclusters", "update")  # never writes spec


def test_cluster_role_reads_nodes_for_partition_claims() -> None:
    rules = _base_object("ClusterRole", "evolving-infra-operator")["rules"]
    assert _allows(rules, "", "nodes", "list") and not _allows(rules, "", "nodes", "patch")


def test_image_dockerfile_runs_the_entrypoint_as_non_root() -> None:
    text = (REPO / "images/Dockerfile").read_text(encoding="utf-8")
    assert 'ENTRYPOINT ["evolving-infra"]' in text
    assert "USER 65532:65532" in text
    ignore = (REPO / "images/Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    assert ".venv" in ignore and ".git" in ignore
