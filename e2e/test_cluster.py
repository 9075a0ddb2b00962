"""The whole install on a real cluster: manifests, the 9-node example scaled to the cluster, a forced re-split.

Steps: `kubectl apply -k` of an overlay of manifests/ whose one `images:` entry is EVOLVING_E2E_IMAGE; label the
cluster's nodes (at most 9) into one pool; apply the example AgentServingCluster (emulated engine) scaled
down to those nodes, with small KV and resource requests; wait until `kubectl get asc` shows the split
with every node agent serving, the router and node agents on the operator's image (the spec names none);
edit the router's image by hand and wait for the operator to revert it; write a `status.targetSplit` that
moves one node (as the router's planner would) and wait for `status.split` to follow; clean up the
cluster object and the labels.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from evolving_infra.operator import meta
from evolving_infra.operator.images import qualify

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "evolving-e2e"
NAME = "e2e"
POOL_LABEL = "evolving-infra.io/pool"
OPERATOR_NAMESPACE = "evolving-infra-system"
Kubectl = Callable[..., str]


def wait(what: str, check: Callable[[], Any], timeout: float = 600, step: float = 3) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def cluster_object(example: dict[str, Any], nodes: int) -> dict[str, Any]:
    obj = copy.deepcopy(example)
    obj["metadata"] = {"name": NAME, "namespace": NAMESPACE}
    spec = obj["spec"]
    prefill = max(1, nodes // 2) if nodes > 1 else 1
    spec["nodeSelector"] = {"matchLabels": {POOL_LABEL: NAME}}
    spec["nodeCount"] = nodes
    spec["initialSplit"] = {"prefill": prefill, "decode": nodes - prefill}
    spec["planner"] = {**spec.get("planner", {}), "minPrefill": 0, "minDecode": 0}
    spec["kvCache"] = {"l2Tokens": 20000}
    spec["resources"] = {
        "router": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        "nodeAgent": {"requests": {"cpu": "50m", "memory": "256Mi"}},
    }
    return obj


def status(kubectl: Kubectl) -> dict[str, Any]:
    return json.loads(kubectl("get", "asc", NAME, "-n", NAMESPACE, "-o", "json")).get("status") or {}


@pytest.fixture
def installed(kubectl: Kubectl, image: str) -> Iterator[list[str]]:
    """Manifests applied with `image` (one kustomize images entry, as a platform team sets it); up to 9 nodes
    labelled into the pool; their names."""
    if "@" in image:
        name, digest = image.split("@", 1)
        entry = {"name": "evolving-infra", "newName": name, "digest": digest}
    else:
        name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
        entry = {"name": "evolving-infra", "newName": name, "newTag": tag}
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(REPO / "manifests", site)],
            "images": [entry],
        }
        (site / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        kubectl("apply", "--server-side", "-k", str(site))
    kubectl("-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/evolving-infra-operator", "--timeout=300s")
    nodes = sorted(json.loads(kubectl("get", "nodes", "-o", "json"))["items"], key=lambda n: n["metadata"]["name"])
    names = [n["metadata"]["name"] for n in nodes if not n["spec"].get("unschedulable")][:9]
    assert names, "the cluster has no schedulable node"
    kubectl("create", "namespace", NAMESPACE, check=False)
    # the cluster's credentials (docs/security.md): its token and the router's API keys, random per run
    token, api_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    for secret, key, value in ((f"{NAME}-cluster-token", "token", token), (f"{NAME}-api-keys", "api-keys", f"e2e:{api_key}")):
        kubectl("-n", NAMESPACE, "delete", "secret", secret, "--ignore-not-found", check=False)
        kubectl("-n", NAMESPACE, "create", "secret", "generic", secret, f"--from-literal={key}={value}")
    for name in names:
        kubectl("label", "node", name, f"{POOL_LABEL}={NAME}", "--overwrite")
    try:
        yield names
    finally:
        kubectl("delete", "asc", NAME, "-n", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=120s", check=False)
        kubectl("-n", NAMESPACE, "delete", "secret", f"{NAME}-cluster-token", f"{NAME}-api-keys", "--ignore-not-found", check=False)
        for name in names:
            kubectl("label", "node", name, f"{POOL_LABEL}-", check=False)


def test_the_example_cluster_serves_and_follows_a_target_split(kubectl: Kubectl, image: str, installed: list[str]) -> None:
    example = yaml.safe_load((Path(__file__).resolve().parents[1] / "manifests/examples/cluster-9-nodes.yaml").read_text())
    obj = cluster_object(example, len(installed))
    assert "images" not in obj["spec"]  # routers and node agents must follow the operator's own image
    kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    want = f"{obj['spec']['initialSplit']['prefill']}P{obj['spec']['initialSplit']['decode']}D"

    def serving() -> Any:
        s = status(kubectl)
        return s if s.get("split") == want and s.get("readyNodes") == len(installed) else None

    first = wait(f"split {want} with {len(installed)} node agents serving", serving)
    assert first["observedGeneration"] >= 1
    table = kubectl("get", "asc", NAME, "-n", NAMESPACE).splitlines()
    assert table[0].split()[:7] == ["NAME", "READY", "SPLIT", "PREFILL", "DECODE", "NODES", "ADAPTING"]
    assert table[1].split()[:3] == [NAME, "True", want]
    wanted_image = qualify(image)
    for kind in ("deployment/e2e-router", "daemonset/e2e-node-agent"):
        assert kubectl("get", kind, "-n", NAMESPACE, "-o", "jsonpath={.spec.template.spec.containers[0].image}") == wanted_image, kind

    # A hand edit of a child is reverted at the next resync, with an event.
    kubectl("-n", NAMESPACE, "set", "image", "deployment/e2e-router", "router=registry.invalid/hand-edited:1")
    wait(
        "the hand-edited router image to be reverted",
        lambda: kubectl("get", "deployment/e2e-router", "-n", NAMESPACE, "-o", "jsonpath={.spec.template.spec.containers[0].image}") == wanted_image,
        timeout=120,
    )

    # What the router's planner does: a target that moves one node to the other phase.
    node = first["nodes"][0]
    generation = 1 + max(n.get("switchGeneration", 0) for n in first["nodes"])
    prefill = first["prefill"] + (-1 if node["phase"] == "prefill" else 1)
    decode = len(installed) - prefill
    target = {"prefill": prefill, "decode": decode, "split": f"{prefill}P{decode}D", "switchGeneration": generation, "moving": [node["name"]]}
    kubectl(
        "patch", "asc", NAME, "-n", NAMESPACE, "--subresource=status", "--type=merge",
        "--field-manager", meta.ROUTER_FIELD_MANAGER, "-p", json.dumps({"status": {"targetSplit": target}}),
    )  # fmt: skip
    followed = wait(f"split {target['split']}", lambda: (s := status(kubectl)).get("split") == target["split"] and s)
    moved = {n["name"]: n for n in followed["nodes"]}[node["name"]]
    assert moved["phase"] != node["phase"] and moved["switchGeneration"] == generation
    events = kubectl("get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={NAME}", "-o", "json")
    assert any(e.get("reason") == "PhaseSwitched" for e in json.loads(events)["items"])
