"""The namespaced install in any namespace: RBAC subjects follow the namespace, cluster-scoped objects get
per-install names, and partition claims are checked within the namespace with a condition saying so."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from evolving_infra.operator import meta
from evolving_infra.operator.reconcile import reconcile



def _harness() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


H = _harness()

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
NS = H.NAMESPACE
CLUSTERS_PATH = f"/apis/{meta.API_VERSION}/{meta.PLURAL}"


def _render_namespaced(tmp: Path, namespace: str) -> list[dict[str, Any]]:
    """The namespaced overlay after `kustomize edit set namespace NAMESPACE` (on a copy of manifests/)."""
    assert KUBECTL is not None
    copy = tmp / namespace / "manifests"
    shutil.copytree(REPO / "manifests", copy)
    kustomization = copy / "overlays" / "namespaced" / "kustomization.yaml"
    data = yaml.safe_load(kustomization.read_text(encoding="utf-8"))
    data["namespace"] = namespace
    kustomization.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    done = subprocess.run([KUBECTL, "kustomize", str(copy / "overlays" / "namespaced")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: kustomize builds not checked")
def test_the_namespaced_overlay_works_in_any_namespace(tmp_path: Path) -> None:
    installs = {ns: _render_namespaced(tmp_path, ns) for ns in ("team-a", "team-b")}
    names: dict[str, set[tuple[str, str]]] = {}
    for ns, docs in installs.items():
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                assert doc["metadata"]["namespace"] == ns, doc["metadata"]
            for subject in doc.get("subjects") or ():
                assert subject["namespace"] == ns, (doc["kind"], subject)
        bindings = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRoleBinding"}
        roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"}
        assert roles == {f"evolving-infra-operator-read.{ns}"}
        assert {b["roleRef"]["name"] for b in bindings.values()} == roles
        [dep] = [d for d in docs if d["kind"] == "Deployment"]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        assert "--namespace=$(POD_NAMESPACE)" in container["args"]
        env = {e["name"]: e for e in container["env"]}
        assert env["EVOLVING_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        names[ns] = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in {"ClusterRole", "ClusterRoleBinding", "Namespace"}}
    # Two installs share no cluster-scoped object but the CRD (which is the same for both).
    assert names["team-a"].isdisjoint(names["team-b"])


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: kustomize builds not checked")
def test_the_cluster_wide_install_binds_its_own_namespace() -> None:
    done = subprocess.run([KUBECTL, "kustomize", str(REPO / "manifests")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [binding] = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "evolving-infra-operator", "namespace": "evolving-infra-system"}]


def _conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions") or ()}


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_namespaced_operator_checks_claims_within_its_namespace_and_says_so() -> None:
    async with H.operator_running(run=False) as h:
        h.emulator.refuse(lambda r: r.method.value == "GET" and r.url.path == CLUSTERS_PATH)
        for node in ("n0", "n1", "n2"):
            await h.add_node(node, "shared")
        await h.create(H.cluster_object("first", "shared"))
        await reconcile(h.rt, NS, "first")
        await h.create(H.cluster_object("second", "shared"))
        outcome = await reconcile(h.rt, NS, "second")
        assert outcome is not None and outcome.valid
        conds = _conditions(await h.cluster("second"))
        checked = conds["PartitionsChecked"]
        assert (checked["status"], checked["reason"]) == ("False", "NamespaceOnly")
        assert f"namespace {NS} only" in checked["message"] and "not detected" in checked["message"]
        # Within the namespace the overlap is still found.
        assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "PartitionConflict"
        assert "already belong to serving/first" in conds["Degraded"]["message"]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_claims_that_cannot_be_checked_are_reported_not_skipped() -> None:
    async with H.operator_running(run=False) as h:
        h.emulator.refuse(lambda r: r.method.value == "GET" and r.url.path == "/api/v1/nodes")
        await h.create(H.cluster_object("blind", "p"))
        await reconcile(h.rt, NS, "blind")
        checked = _conditions(await h.cluster("blind"))["PartitionsChecked"]
        assert (checked["status"], checked["reason"]) == ("False", "CheckUnavailable")
        assert checked["message"].startswith("node claims not checked: nodes cannot be listed")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_cluster_wide_operator_says_claims_were_checked_everywhere() -> None:
    async with H.operator_running(run=False) as h:
        await h.create(H.cluster_object("wide", "p"))
        await reconcile(h.rt, NS, "wide")
        checked = _conditions(await h.cluster("wide"))["PartitionsChecked"]
        assert (checked["status"], checked["reason"]) == ("True", "AllNamespaces")
