"""One image for the whole install: retagging the kustomization retags the operator, and the operator's
routers and node agents follow its own image (read from its pod); references are registry-qualified."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.operator import images
from evolving_infra.operator.builders import BuildContext, build_children
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.semantics import builtin_profile_table
from evolving_infra.operator.spec import AgentServingClusterSpec

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: kustomize builds not checked")


def _spec(**extra: Any) -> AgentServingClusterSpec:
    return AgentServingClusterSpec.from_kube(
        {
            "nodeSelector": {"matchLabels": {"p": "a"}},
            "nodeCount": 2,
            "engine": {"profile": "glm-5.2-4xgb300-tp4"},
            "initialSplit": {"prefill": 1, "decode": 1},
            "networkPolicy": {"enabled": True},
            **extra,
        }
    )


def _workload_images(objs: list[dict[str, Any]]) -> dict[str, list[str]]:
    out = {}
    for obj in objs:
        if obj.get("kind") in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            pod = obj["spec"]["template"]["spec"]
            out[f"{obj['kind']}/{obj['metadata']['name']}"] = [c["image"] for c in pod.get("containers", []) + pod.get("initContainers", [])]
    return out


def _kustomize(folder: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


class _PodApi:
    """Just enough of KubeApi for `resolve_default_image`: one pod."""

    def __init__(self, pod: dict[str, Any] | None) -> None:
        self.pod = pod
        self.asked: list[tuple[str | None, str]] = []

    async def get(self, kind: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        self.asked.append((namespace, name))
        return self.pod


@pytest.mark.parametrize(
    "given_ref,qualified",
    [
        ("evolving-infra:0.1.0", "docker.io/library/evolving-infra:0.1.0"),
        ("evolving-infra", "docker.io/library/evolving-infra"),
        ("team/evolving-infra:1", "docker.io/team/evolving-infra:1"),
        ("ghcr.io/team/evolving-infra:1", "ghcr.io/team/evolving-infra:1"),
        ("registry.local:5000/evolving-infra@sha256:" + "a" * 64, "registry.local:5000/evolving-infra@sha256:" + "a" * 64),
        ("localhost/evolving-infra:dev", "localhost/evolving-infra:dev"),
    ],
)
def test_references_are_registry_qualified(given_ref: str, qualified: str) -> None:
    assert images.qualify(given_ref) == qualified


@given(st.from_regex(r"\A([a-z0-9]+(\.[a-z]+)?(:[0-9]{2,5})?/)?([a-z0-9-]+/){0,2}[a-z0-9-]+(:[a-z0-9.]+)?\Z"))
def test_qualifying_is_idempotent_and_keeps_the_name(ref: str) -> None:
    once = images.qualify(ref)
    assert images.qualify(once) == once
    assert once.endswith(ref)


def test_an_empty_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        images.qualify(" ")


@pytest.mark.asyncio
async def test_the_default_image_comes_from_the_setting_then_the_pod_then_the_fallback() -> None:
    pod = {"spec": {"containers": [{"name": "sidecar", "image": "x"}, {"name": "operator", "image": "reg.example/ei:7"}]}}
    assert await images.resolve_default_image(_PodApi(pod), "mine:1", "ns", "op") == ("docker.io/library/mine:1", "EVOLVING_OPERATOR_DEFAULT_IMAGE")
    api = _PodApi(pod)
    assert await images.resolve_default_image(api, None, "ops", "op-123") == ("reg.example/ei:7", "pod ops/op-123")
    assert api.asked == [("ops", "op-123")]
    assert await images.resolve_default_image(_PodApi(pod), None, "ops", None) == (images.FALLBACK_IMAGE, "fallback")
    # In a pod whose image cannot be read, never guess (a wrong default would roll every workload).
    with pytest.raises(images.ImageUnknown, match="ops/gone does not exist"):
        await images.resolve_default_image(_PodApi(None), None, "ops", "gone")
    with pytest.raises(images.ImageUnknown, match="has no 'operator' container image"):
        await images.resolve_default_image(_PodApi({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}), None, "ops", "op")
    assert images.FALLBACK_IMAGE.startswith("docker.io/library/evolving-infra:")


@needs_kubectl
@pytest.mark.asyncio
async def test_retagging_the_install_changes_every_workloads_image(tmp_path: Path) -> None:
    overlay = tmp_path / "retagged"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(REPO / "manifests" / "base", overlay)],
                # what `kustomize edit set image evolving-infra=registry.example.com/team/evolving-infra:9.9` writes
                "images": [{"name": "evolving-infra", "newName": "registry.example.com/team/evolving-infra", "newTag": "9.9"}],
            }
        )
    )
    rendered = _kustomize(overlay)
    wanted = "registry.example.com/team/evolving-infra:9.9"
    install = _workload_images(rendered)
    assert install == {"Deployment/evolving-infra-operator": [wanted]}
    [operator] = [d for d in rendered if d["kind"] == "Deployment"]
    env = {e["name"]: e for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["EVOLVING_OPERATOR_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["EVOLVING_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    # The pod the Deployment makes; the operator reads it back at start.
    pod = {"metadata": {"name": "op-1", "namespace": "evolving-infra-system"}, "spec": operator["spec"]["template"]["spec"]}
    image, source = await images.resolve_default_image(_PodApi(pod), None, "evolving-infra-system", "op-1")
    assert (image, source) == (wanted, "pod evolving-infra-system/op-1")
    ctx = BuildContext(ClusterRef("c", "ns", "u"), _spec(), builtin_profile_table()["glm-5.2-4xgb300-tp4"], image)
    children = _workload_images(build_children(ctx))
    assert children == {"DaemonSet/c-node-agent": [wanted], "Deployment/c-router": [wanted]}
    # spec.images stays the per-cluster override.
    own = _spec(images={"router": {"image": "other.example/router:2"}})
    children = _workload_images(build_children(BuildContext(ClusterRef("c", "ns", "u"), own, ctx.profile, image)))
    assert children == {"DaemonSet/c-node-agent": [wanted], "Deployment/c-router": ["other.example/router:2"]}


@needs_kubectl
def test_the_dev_overlay_retags_the_operator_and_so_its_children() -> None:
    rendered = _kustomize(REPO / "manifests" / "overlays" / "dev")
    assert _workload_images(rendered) == {"Deployment/evolving-infra-operator": ["evolving-infra:dev"]}
