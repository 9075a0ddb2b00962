"""Live state is reconciled: a child edited by hand is reverted with an event naming the field, a child the
spec no longer wants is deleted, and nothing the API server adds or normalises counts as drift."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.operator import kube, meta
from evolving_infra.operator.children import drift
from evolving_infra.operator.reconcile import CHILD_DELETED, DRIFT_REVERTED, reconcile


def _harness() -> Any:
    key = "_evolving_operator_tests_operator_harness"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name("operator_harness.py"))
        assert spec is not None and spec.loader is not None
        sys.modules[key] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]


H = _harness()
NS = H.NAMESPACE
DEPLOYMENTS = "apps/v1/deployments"
IMAGE = "spec.template.spec.containers[0].image"


async def _merge_patch(h: Any, path: str, patch: dict[str, Any]) -> None:
    """What `kubectl edit` or `kubectl patch --type=merge` does (another field manager)."""
    await h.api._request("PATCH", path, None, patch, "application/merge-patch+json")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_hand_edit_of_a_child_is_reverted_with_an_event_naming_the_field() -> None:
    async with H.operator_running(run=False) as h:
        await h.create(H.cluster_object("alpha", "a"))
        await reconcile(h.rt, NS, "alpha")
        desired = h.emulator.live(DEPLOYMENTS, NS, "alpha-router")
        wanted_image = desired["spec"]["template"]["spec"]["containers"][0]["image"]
        edited = copy.deepcopy(desired["spec"]["template"]["spec"]["containers"])
        edited[0]["image"] = "attacker.example/router:evil"
        await _merge_patch(h, f"/apis/apps/v1/namespaces/{NS}/deployments/alpha-router", {"spec": {"template": {"spec": {"containers": edited}}}})
        assert h.emulator.live(DEPLOYMENTS, NS, "alpha-router")["spec"]["template"]["spec"]["containers"][0]["image"] == "attacker.example/router:evil"

        outcome = await reconcile(h.rt, NS, "alpha")
        assert outcome is not None and outcome.children is not None
        [reverted] = outcome.children.reverted
        assert reverted.child == f"Deployment {NS}/alpha-router" and reverted.fields == (IMAGE,)
        assert h.emulator.live(DEPLOYMENTS, NS, "alpha-router")["spec"]["template"]["spec"]["containers"][0]["image"] == wanted_image
        events = [(t, r, m) for t, r, m in h.events if r == DRIFT_REVERTED]
        assert events == [("Warning", DRIFT_REVERTED, f"Deployment {NS}/alpha-router had been changed outside the operator; reverted {IMAGE}")]
        # Reverted once; the next pass finds nothing to do.
        again = await reconcile(h.rt, NS, "alpha")
        assert again is not None and again.children is not None and again.children.writes == 0


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_fields_added_by_the_server_or_other_controllers_are_not_drift() -> None:
    async with H.operator_running(run=False) as h:
        await h.create(H.cluster_object("alpha", "a"))
        await reconcile(h.rt, NS, "alpha")
        live = h.emulator.live(DEPLOYMENTS, NS, "alpha-router")
        containers = copy.deepcopy(live["spec"]["template"]["spec"]["containers"])
        containers[0]["terminationMessagePath"] = "/dev/termination-log"  # an API server default
        await _merge_patch(
            h, f"/apis/apps/v1/namespaces/{NS}/deployments/alpha-router",
            {"metadata": {"annotations": {"deployment.kubernetes.io/revision": "3"}},
             "spec": {"progressDeadlineSeconds": 600, "template": {"spec": {"containers": containers, "dnsPolicy": "ClusterFirst"}}}},
        )  # fmt: skip
        outcome = await reconcile(h.rt, NS, "alpha")
        assert outcome is not None and outcome.children is not None
        assert outcome.children.writes == 0 and not outcome.children.reverted


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_child_no_longer_wanted_is_deleted_with_an_event() -> None:
    async with H.operator_running(run=False) as h:
        await h.create(H.cluster_object("alpha", "a", networkPolicy={"enabled": True}))
        await reconcile(h.rt, NS, "alpha")
        assert h.emulator.live("networking.k8s.io/v1/networkpolicies", NS, "alpha-node-agent") is not None
        # A look-alike that belongs to nobody is never touched.
        foreign = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "alpha-extra", "namespace": NS, "labels": {"app.kubernetes.io/instance": "alpha", "app.kubernetes.io/managed-by": meta.MANAGED_BY}}}  # fmt: skip
        await h.api.create(foreign)
        await _merge_patch(h, f"/apis/{meta.API_VERSION}/namespaces/{NS}/{meta.PLURAL}/alpha", {"spec": {"networkPolicy": {"enabled": False}}})
        outcome = await reconcile(h.rt, NS, "alpha")
        assert outcome is not None and outcome.children is not None
        assert outcome.children.deleted == [f"NetworkPolicy {NS}/alpha-node-agent"]
        assert h.emulator.live("networking.k8s.io/v1/networkpolicies", NS, "alpha-node-agent") is None
        assert h.emulator.live("v1/configmaps", NS, "alpha-extra") is not None
        assert ("Normal", CHILD_DELETED, f"NetworkPolicy {NS}/alpha-node-agent is no longer wanted by the spec; deleted") in h.events
        again = await reconcile(h.rt, NS, "alpha")
        assert again is not None and again.children is not None and again.children.writes == 0
        assert await h.api.get(kube.KINDS[("v1", "ConfigMap")], NS, "alpha-settings") is not None


# --- drift() itself ------------------------------------------------------------------------------

scalars = st.one_of(st.integers(-5, 5), st.text("abc", max_size=3), st.booleans())
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)),
    max_leaves=12,
)


def _with_extras(value: Any, extra: Any) -> Any:
    """`value` with a key the desired object never sets added to every mapping (server defaults)."""
    if isinstance(value, dict):
        return {**{k: _with_extras(v, extra) for k, v in value.items()}, "zz-added": extra}
    if isinstance(value, list):
        return [_with_extras(v, extra) for v in value]
    return value


@given(desired=st.dictionaries(st.sampled_from(["spec", "data"]), trees, min_size=1), extra=scalars)
def test_added_fields_are_never_drift(desired: dict[str, Any], extra: Any) -> None:
    assert drift(desired, copy.deepcopy(desired)) == []
    assert drift(desired, _with_extras(desired, extra)) == []


@given(value=st.text("abc", min_size=1, max_size=3))
def test_a_changed_or_removed_leaf_is_named(value: str) -> None:
    desired = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x:1", "ports": [{"containerPort": 80}]}]}}}}
    changed = copy.deepcopy(desired)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "x:1" + value
    assert drift(desired, changed) == [IMAGE]
    removed = copy.deepcopy(desired)
    del removed["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert drift(desired, removed) == ["spec.template.spec.containers[0].ports"]
    longer = copy.deepcopy(desired)
    longer["spec"]["template"]["spec"]["containers"].append({"name": "sidecar"})
    assert drift(desired, longer) == ["spec.template.spec.containers"]


def test_quantities_compare_by_value_and_identity_is_not_compared() -> None:
    desired = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"resources": {"memory": "1Gi", "cpu": "1", "nvidia.com/gpu": 4}}}
    live = {"metadata": {"name": "b", "labels": {"x": "1", "y": "2"}}, "spec": {"resources": {"memory": "1024Mi", "cpu": "1000m", "nvidia.com/gpu": "4"}}}
    assert drift(desired, live) == []
    assert drift(desired, {**live, "spec": {"resources": {"memory": "2Gi", "cpu": "1", "nvidia.com/gpu": "4"}}}) == ["spec.resources.memory"]
    assert drift({"spec": {"enabled": True}}, {"spec": {"enabled": "true"}}) == ["spec.enabled"]
    assert drift({"metadata": {"labels": {"x": "1"}}}, {"metadata": {"labels": {"x": "2"}}}) == ["metadata.labels.x"]


def test_empty_values_the_server_omits_are_not_drift() -> None:
    desired = {"spec": {"medium": "", "hostNetwork": False, "items": [], "selector": {}, "name": "x"}}
    assert drift(desired, {"spec": {"name": "x"}}) == []
    assert drift(desired, {"spec": {"name": "x", "hostNetwork": True}}) == ["spec.hostNetwork"]
    assert drift({"spec": {"replicas": 0}}, {"spec": {}}) == ["spec.replicas"]


class _NormalisingServer:
    """A fake API that stores applies but always answers one field its own way (as a server normalises)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.applies = 0

    def _normalise(self, obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        if out.get("kind") == "Service":
            out["spec"]["type"] = "ClusterIP"
        return out

    async def get(self, kind: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self.objects.get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects[obj["metadata"]["name"]] = self._normalise(obj)
        return copy.deepcopy(self.objects[obj["metadata"]["name"]])

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applies += 1
        return await self.create(obj)


@pytest.mark.asyncio
async def test_a_field_the_server_normalises_is_learnt_not_reverted_every_pass() -> None:
    from evolving_infra.operator.children import apply_children
    from evolving_infra.operator.meta import ClusterRef, Component, child_metadata

    cluster = ClusterRef("c", "ns", "uid")
    service = {"apiVersion": "v1", "kind": "Service", "metadata": child_metadata(cluster, Component.ROUTER, "router"),
               "spec": {"type": "NodePort", "ports": [{"port": 80}]}}  # fmt: skip
    server, learned = _NormalisingServer(), {}
    first = await apply_children(server, cluster, [service], learned)  # type: ignore[arg-type]
    assert first.created == ["Service ns/c-router"]
    second = await apply_children(server, cluster, [service], learned)  # type: ignore[arg-type]
    assert second.reverted == [] and second.unchanged == ["Service ns/c-router"]  # tried once, learnt
    third = await apply_children(server, cluster, [service], learned)  # type: ignore[arg-type]
    assert third.writes == 0 and server.applies == 1
    # A real hand edit of another field is still reverted.
    server.objects["c-router"]["spec"]["ports"] = [{"port": 81}]
    fourth = await apply_children(server, cluster, [service], learned)  # type: ignore[arg-type]
    assert [r.fields for r in fourth.reverted] == [("spec.ports[0].port",)]
