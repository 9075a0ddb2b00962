"""The gateway's manifest component (read-only RBAC, locked-down pod, probes on the admin port, args the
CLI accepts) and the Gateway API alternative (one HTTPRoute per partition matching the partition header)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from evolving_infra.cli.main import build_parser
from evolving_infra.fleet.partitions import load_partitions
from evolving_infra.gateway.httproutes import build_httproutes
from evolving_infra.gateway.proxy import PARTITION_HEADER

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "manifests" / "components" / "gateway"
FLEET = REPO / "manifests" / "examples" / "fleet-3072-gpus"
KUBECTL = shutil.which("kubectl")


def _objects() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    out = {}
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((COMPONENT / resource).read_text()):
            out[doc["kind"]] = doc
    return out


def test_rbac_is_read_only_on_agent_serving_clusters() -> None:
    objs = _objects()
    rules = objs["ClusterRole"]["rules"]
    assert rules == [{"apiGroups": ["serving.evolving-infra.io"], "resources": ["agentservingclusters"], "verbs": ["get", "list", "watch"]}]
    binding = objs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == objs["ServiceAccount"]["metadata"]["name"]


def test_deployment_is_locked_down_and_its_args_parse() -> None:
    dep = _objects()["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "evolving-infra-gateway"
    [c] = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    args = build_parser().parse_args(c["args"])
    assert args.cluster_labels == {"evolving-infra.io/fleet": "fleet-3072"} and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": args.port, "metrics": args.admin_port}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # The fleet example's clusters carry the label the gateway selects.
    for p in load_partitions([FLEET]):
        assert all(p.labels.get(k) == v for k, v in args.cluster_labels.items())
    service = _objects()["Service"]
    assert service["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: kustomize builds not checked")
def test_the_component_builds_with_the_install(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(REPO / "manifests", site)],
                "components": [os.path.relpath(COMPONENT, site)],
            }
        )
    )
    done = subprocess.run([KUBECTL, "kustomize", str(site)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = [d for d in yaml.safe_load_all(done.stdout) if d and d["metadata"]["name"] == "evolving-infra-gateway"]
    assert {d["kind"] for d in ours} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"}
    assert all(d["metadata"].get("namespace", "evolving-infra-system") == "evolving-infra-system" for d in ours)


def test_httproutes_match_the_partition_header_and_target_each_router() -> None:
    partitions = load_partitions([FLEET])
    routes = build_httproutes(partitions, "inference", "gateways")
    assert len(routes) == len(partitions) == 8
    for p, route in zip(partitions, routes):
        assert route["metadata"]["namespace"] == p.namespace
        [rule] = route["spec"]["rules"]
        [match] = rule["matches"]
        assert match["headers"] == [{"type": "Exact", "name": PARTITION_HEADER, "value": p.key}]
        assert rule["backendRefs"] == [{"name": f"{p.name}-router", "port": p.spec.router.port}]
        assert route["spec"]["parentRefs"] == [{"name": "inference", "namespace": "gateways"}]
    values = [r["spec"]["rules"][0]["matches"][0]["headers"][0]["value"] for r in routes]
    assert len(set(values)) == len(values)  # disjoint: each request matches one route


def test_the_shipped_httproutes_are_current() -> None:
    shipped = [d for d in yaml.safe_load_all((COMPONENT / "gateway-api" / "httproutes-fleet-3072.yaml").read_text()) if d]
    header = (COMPONENT / "gateway-api" / "httproutes-fleet-3072.yaml").read_text().splitlines()[1]
    command = shlex.split(header.lstrip("# "))
    assert command[:3] == ["evolving-infra", "gateway", "httproutes"]
    assert shipped == build_httproutes(load_partitions([FLEET]), "inference")


@pytest.mark.parametrize("version", ("1.33.0", "1.37.0"))
def test_the_component_objects_are_valid_kubernetes(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")
    for obj in _objects().values():
        kubernetes_validate.validate(obj, version, strict=True)
