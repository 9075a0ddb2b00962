"""Every manifest the install and the operator render is valid Kubernetes for each supported version.

Built-in kinds are checked with `kubernetes-validate` (PyPI; it ships the API schemas of each Kubernetes
release, so no download happens) in strict mode (unknown fields are errors). AgentServingCluster objects are
checked against the generated CRD's schema and CEL rules with the API-server stand-in of conftest.py.
The Prometheus Operator's kinds (PodMonitor, PrometheusRule) have no schema here and are counted, not
checked. `kubectl kustomize` renders the kustomizations (skipped with a reason without kubectl).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

from evolving_infra.operator.builders import BuildContext, build_children  # noqa: E402
from evolving_infra.operator.meta import ClusterRef  # noqa: E402
from evolving_infra.operator.semantics import builtin_profile_table  # noqa: E402
from evolving_infra.operator.spec import AgentServingClusterSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
KUBECTL = shutil.which("kubectl")
SUPPORTED_VERSIONS = ("1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0")
"""The Kubernetes releases docs/operations.md states as supported."""
KUSTOMIZATIONS = ("", "base", "overlays/namespaced", "overlays/dev", "examples/fleet-3072-gpus")
NO_SCHEMA = {"PodMonitor", "PrometheusRule"}
"""Custom kinds of the Prometheus Operator: no schema ships with kubernetes-validate."""
PROFILE = "glm-5.2-4xgb300-tp4"


def _kustomize(folder: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _with_monitoring() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(MANIFESTS, site)],
                    "components": [os.path.relpath(MANIFESTS / "components" / "monitoring", site)],
                }
            )
        )
        return _kustomize(site)


def _children_variants() -> list[dict[str, Any]]:
    profile = builtin_profile_table()[PROFILE]
    base = {
        "nodeSelector": {"matchLabels": {"p": "a"}, "matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
        "nodeCount": 9,
        "engine": {"profile": PROFILE},
        "initialSplit": {"prefill": 4, "decode": 5},
    }
    variants = [
        base,
        {**base, "networkPolicy": {"enabled": True}, "router": {"serviceType": "LoadBalancer", "port": 443}},
        {**base, "planner": {"mode": "static"}, "resources": {"nodeAgent": {"hostMemory": {"medium": "HugePages-1Gi", "size": "512Gi"}}}},
        {**base, "images": {"router": {"image": "registry.example.com/r:1", "pullPolicy": "Always"}}, "kvCache": {"l2Tokens": 20000}},
        {**base, "security": {"tlsSecret": "c4-tls", "clusterTokenSecret": "shared", "apiKeysSecret": "keys", "peerNetworks": ["10.244.0.0/16"]}},
        {**base, "security": {"insecure": True}},
    ]
    out = []
    for i, raw in enumerate(variants):
        ctx = BuildContext(
            ClusterRef(f"c{i}", "serving", "00000000-0000-0000-0000-000000000001"), AgentServingClusterSpec.from_kube(raw), profile,
            "docker.io/library/evolving-infra:0.1.0", excluded_nodes=("n7",), metrics_namespace="monitoring",
        )  # fmt: skip
        out.extend(build_children(ctx))
    return out


@functools.cache
def rendered() -> tuple[tuple[str, str], ...]:
    """(where, JSON) of every distinct rendered object."""
    found: dict[str, str] = {}
    sources: list[tuple[str, list[dict[str, Any]]]] = [("builders", _children_variants())]
    if KUBECTL is not None:
        sources += [(f"kustomize manifests/{k}", _kustomize(MANIFESTS / k)) for k in KUSTOMIZATIONS]
        sources.append(("kustomize with components/monitoring", _with_monitoring()))
    for where, docs in sources:
        for doc in docs:
            found.setdefault(json.dumps(doc, sort_keys=True), f"{where}: {doc['kind']} {doc['metadata'].get('name')}")
    return tuple((where, text) for text, where in found.items())


def _validate(doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_rendered_manifest_is_valid_for_the_supported_versions(version: str, apiserver: Any) -> None:
    kinds: dict[str, int] = {}
    for where, text in rendered():
        doc = json.loads(text)
        kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
        if doc["kind"] in NO_SCHEMA:
            continue
        if doc["kind"] == "AgentServingCluster":
            assert apiserver.errors(doc) == [], where
            continue
        try:
            _validate(doc, version)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where} is not valid Kubernetes {version}: {exc}")
    assert {"Deployment", "DaemonSet", "Service", "ConfigMap", "Role", "RoleBinding", "ServiceAccount", "NetworkPolicy"} <= set(kinds)
    if KUBECTL is not None:
        assert {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Namespace", "AgentServingCluster", "PodMonitor"} <= set(kinds)


def test_the_validator_rejects_what_the_api_server_would() -> None:
    """The check above is not vacuous: a wrongly typed field and an unknown field are both refused."""
    deployment = next(json.loads(t) for _, t in rendered() if json.loads(t)["kind"] == "Deployment")
    _validate(deployment, SUPPORTED_VERSIONS[-1])
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "one"
    unknown = copy.deepcopy(deployment)
    unknown["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    for bad in (wrong_type, unknown):
        with pytest.raises(kubernetes_validate.ValidationError):
            _validate(bad, SUPPORTED_VERSIONS[-1])
