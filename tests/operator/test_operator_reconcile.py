"""The operator against the emulator: children and status from a CR, idempotence, invalid specs, deletion."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from evolving_infra.core.types import Phase
from evolving_infra.operator import kube, meta
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
agents_mod = H.load_helper("fake_node_agent")
NS = H.NAMESPACE
CHILD_KINDS = {"serviceaccounts", "roles", "rolebindings", "configmaps", "services", "daemonsets", "deployments", "networkpolicies"}


def _children(h: Any, cluster_uid: str) -> list[tuple[str, str]]:
    out = []
    for key in h.emulator.alive():
        obj = h.emulator.objects[key].raw
        refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
        if any(r.get("uid") == cluster_uid for r in refs):
            out.append((key[0].plural, key[2]))
    return sorted(out)


async def _three_node_cluster(h: Any, name: str = "alpha", pool: str = "a") -> tuple[dict[str, Any], list[Any]]:
    handles = agents_mod.start_agents({f"{name}-n{i}": Phase.PREFILL if i < 2 else Phase.DECODE for i in range(3)})
    for handle in handles:
        await h.add_node(handle.node, pool)
    body = await h.create(H.cluster_object(name, pool))
    for handle in handles:
        await h.add_agent_pod(name, handle.node, handle.host, handle.port)
    return body, handles


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_cluster_gets_its_children_and_a_true_status() -> None:
    async with H.operator_running() as h:
        body, handles = await _three_node_cluster(h)
        try:
            uid = body["metadata"]["uid"]
            await h.wait_for("children", lambda: len(_children(h, uid)) >= 11)
            kinds = {kind for kind, _ in _children(h, uid)}
            assert kinds == CHILD_KINDS
            for kind, name in _children(h, uid):
                group = {'daemonsets': 'apps/v1', 'deployments': 'apps/v1', 'roles': 'rbac.authorization.k8s.io/v1', 'rolebindings': 'rbac.authorization.k8s.io/v1', 'networkpolicies': 'networking.k8s.io/v1'}.get(kind, 'v1')
                obj = h.emulator.live(f"{group}/{kind}", NS, name)
                (ref,) = obj["metadata"]["ownerReferences"]
                assert ref == {"apiVersion": meta.API_VERSION, "kind": meta.KIND, "name": "alpha", "uid": uid, "controller": True, "blockOwnerDeletion": True}
            await h.router_available("alpha")
            await reconcile(h.rt, NS, "alpha")

            async def ready() -> Any:
                status = (await h.cluster("alpha")).get("status") or {}
                conds = {c["type"]: c for c in status.get("conditions") or ()}
                return status if conds.get("Ready", {}).get("status") == "True" else None

            status = await h.wait_for("Ready", ready)
            assert (status["split"], status["prefill"], status["decode"], status["readyNodes"]) == ("2P1D", 2, 1, 3)
            assert status["adapting"] is False
            assert status["observedGeneration"] == 1
            assert [(n["name"], n["phase"], n["state"]) for n in status["nodes"]] == [
                ("alpha-n0", "prefill", "serving"), ("alpha-n1", "prefill", "serving"), ("alpha-n2", "decode", "serving"),
            ]  # fmt: skip
            assert status["nodes"][0]["address"] == f"127.0.0.1:{handles[0].port}"
            conds = {c["type"]: c for c in status["conditions"]}
            assert {t: c["status"] for t, c in conds.items()} == {
                "Ready": "True", "RouterReady": "True", "NodeAgentsReady": "True",
                "Adapting": "False", "Degraded": "False", "Invalid": "False", "PartitionsChecked": "True",
                "Progressing": "False",
            }  # fmt: skip
            assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] for c in conds.values())
            # kopf keeps its state under our prefix; nothing under kopf's default one.
            annotations = (await h.cluster("alpha"))["metadata"].get("annotations") or {}
            assert any(k.startswith(meta.ANNOTATION_PREFIX + "/") for k in annotations)
            assert not any(k.startswith("kopf.zalando.org") for k in annotations)
        finally:
            for handle in handles:
                handle.stop()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_reconciling_again_writes_nothing_and_the_operator_never_writes_spec() -> None:
    async with H.operator_running() as h:
        body, handles = await _three_node_cluster(h)
        try:
            uid = body["metadata"]["uid"]
            await h.wait_for("children", lambda: len(_children(h, uid)) >= 11)
            await h.router_available("alpha")
            await reconcile(h.rt, NS, "alpha")  # settles the status after the router became available
            before = len(h.emulator.writes())
            assert before > 10  # the first pass did write: creates, status, kopf's annotations
            for _ in range(2):
                outcome = await reconcile(h.rt, NS, "alpha")
                assert outcome is not None and outcome.children is not None
                assert outcome.children.writes == 0 and not outcome.status_written
            assert h.emulator.writes()[before:] == []
            assert len(outcome.children.unchanged) == 11
            # A child deleted behind the operator's back comes back on the next pass, and only it.
            await h.api.delete(kube.KINDS[("v1", "ConfigMap")], NS, "alpha-settings")
            outcome = await reconcile(h.rt, NS, "alpha")
            assert outcome is not None and outcome.children is not None
            assert outcome.children.created == [f"ConfigMap {NS}/alpha-settings"] and outcome.children.writes == 1
            # Every write of the operator to the cluster object: its status, or kopf's metadata; never spec.
            cluster_path = f"/apis/{meta.API_VERSION}/namespaces/{NS}/{meta.PLURAL}/alpha"
            patches = [r for r in h.emulator.writes() if r.url.path.startswith(cluster_path) and r.method.value == "PATCH"]
            assert {r.url.path.removeprefix(cluster_path) for r in patches} == {"", "/status"}
            for request in patches:
                assert "spec" not in json.loads(request.body or b"{}"), request.url.path  # as sent, not as stored
        finally:
            for handle in handles:
                handle.stop()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_an_invalid_spec_that_passes_the_schema_gets_invalid_and_no_children() -> None:
    async with H.operator_running() as h:
        obj = H.cluster_object("broken", "b")
        obj["spec"]["engine"]["profile"] = "no-such-profile"  # schema-valid, unknown to the operator
        body = await h.create(obj)

        async def invalid() -> Any:
            conds = {c["type"]: c for c in ((await h.cluster("broken")).get("status") or {}).get("conditions") or ()}
            return conds.get("Invalid") if conds.get("Invalid", {}).get("status") == "True" else None

        cond = await h.wait_for("Invalid", invalid)
        assert cond["reason"] == "InvalidSpec"
        assert "engine.profile 'no-such-profile' is not a known hardware profile" in cond["message"]
        assert _children(h, body["metadata"]["uid"]) == []
        ready = {c["type"]: c for c in (await h.cluster("broken"))["status"]["conditions"]}["Ready"]
        assert ready["status"] == "False"


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_cluster_asking_for_the_reserved_sglang_backend_is_invalid_and_gets_nothing() -> None:
    async with H.operator_running() as h:
        obj = H.cluster_object("gpu", "s")
        obj["spec"]["engine"] = {"backend": "sglang", "model": "zai/GLM-5.2", "profile": "glm-5.2-4xgb300-tp4"}
        body = await h.create(obj)

        async def invalid() -> Any:
            conds = {c["type"]: c for c in ((await h.cluster("gpu")).get("status") or {}).get("conditions") or ()}
            return conds.get("Invalid") if conds.get("Invalid", {}).get("status") == "True" else None

        cond = await h.wait_for("Invalid", invalid)
        assert "engine.backend 'sglang' is reserved: no node agent implements an SGLang engine yet" in cond["message"]
        assert _children(h, body["metadata"]["uid"]) == []
        assert not any(r.method.value == "POST" and "/daemonsets" in r.url.path for r in h.emulator.writes())


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_deleting_the_cluster_leaves_its_children_to_the_garbage_collector() -> None:
    async with H.operator_running() as h:
        body = await h.create(H.cluster_object("gone", "g"))
        uid = body["metadata"]["uid"]
        await h.wait_for("children", lambda: len(_children(h, uid)) >= 11)
        finalizers = (await h.cluster("gone"))["metadata"].get("finalizers")
        assert finalizers == [f"{meta.ANNOTATION_PREFIX}/finalizer"]
        await h.api.delete(kube.CLUSTER, NS, "gone")
        # The finalizer (kopf's, for the resync timer) is released, then the object goes away.
        await h.wait_for("deletion", lambda: h.emulator.live(f"{meta.API_VERSION}/{meta.PLURAL}", NS, "gone") is None)
        removed = h.emulator.collect_garbage()
        assert len(removed) == 11
        assert _children(h, uid) == []
