"""The operator's own metrics: reconciles, children reverted and deleted, conditions, the planner's predicted
gain, API failures, and the NetworkPolicy rule that admits Prometheus to the node agents' metrics port."""

from __future__ import annotations

import copy
import importlib.util
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from evolving_infra.operator import kube, rbac
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.metrics import OperatorMetrics, predicted_gain
from evolving_infra.operator.reconcile import reconcile
from evolving_infra.operator.rendered import NODE_AGENT_METRICS_PORT
from evolving_infra.operator.status import AgentServingClusterStatus


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


def _samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_reconciles_children_and_conditions_are_counted() -> None:
    async with H.operator_running(run=False) as h:
        await h.create(H.cluster_object("alpha", "a", networkPolicy={"enabled": True}))
        bad = H.cluster_object("broken", "b")
        bad["spec"]["engine"]["profile"] = "no-such-profile"
        await h.create(bad)
        await reconcile(h.rt, NS, "alpha")
        await reconcile(h.rt, NS, "broken")
        await h.api._request(
            "PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/alpha-router", None, {"spec": {"replicas": 3}}, "application/merge-patch+json"
        )
        await h.api._request(
            "PATCH", f"/apis/serving.evolving-infra.io/v1alpha1/namespaces/{NS}/agentservingclusters/alpha", None,
            {"spec": {"networkPolicy": {"enabled": False}}}, "application/merge-patch+json",
        )  # fmt: skip
        await reconcile(h.rt, NS, "alpha")
        samples = _samples(h.rt.metrics)
        assert samples[("evolving_operator_reconciles_total", (("result", "ok"),))] == 2
        assert samples[("evolving_operator_reconciles_total", (("result", "invalid"),))] == 1
        assert samples[("evolving_operator_reconcile_duration_seconds_count", ())] == 3
        assert samples[("evolving_operator_drift_reverted_total", (("kind", "Deployment"),))] == 1
        assert samples[("evolving_operator_children_deleted_total", (("kind", "NetworkPolicy"),))] == 1
        assert samples[("evolving_operator_clusters", (("condition", "Invalid"),))] == 1
        assert samples[("evolving_operator_clusters", (("condition", "Progressing"),))] == 1  # alpha: router not available
        await h.api.delete(kube.CLUSTER, NS, "broken")
        await reconcile(h.rt, NS, "broken")
        assert _samples(h.rt.metrics)[("evolving_operator_clusters", (("condition", "Invalid"),))] == 0


def _decision_status(prefill: int, gains: dict[int, float | None]) -> AgentServingClusterStatus:
    candidates = [
        {"prefill": p, "split": f"{p}P{9 - p}D", "meanGain": g, "stderr": 0.1, "qualified": g is not None and g > 0.2,
         "verdict": "qualified" if g is not None and g > 0.2 else "below_threshold"}
        for p, g in gains.items()
    ]  # fmt: skip
    return AgentServingClusterStatus.from_kube(
        {
            "targetSplit": {
                "prefill": prefill, "decode": 9 - prefill, "split": f"{prefill}P{9 - prefill}D", "switchGeneration": 2,
                "decision": {"decidedAt": datetime(2026, 1, 1, tzinfo=UTC).isoformat(), "planner": "ours", "outcome": "switch", "candidates": candidates},
            }
        }
    )  # fmt: skip


def test_the_predicted_gain_is_that_of_the_chosen_candidate() -> None:
    status = _decision_status(5, {4: 0.0, 5: 0.8, 6: 0.3})
    assert predicted_gain(status) == 0.8
    assert predicted_gain(_decision_status(5, {4: 0.1})) is None
    assert predicted_gain(AgentServingClusterStatus()) is None
    metrics = OperatorMetrics()
    metrics.observe_status("ns", "c", status)
    assert _samples(metrics)[("evolving_operator_planner_predicted_gain", (("cluster", "c"), ("cluster_namespace", "ns")))] == 0.8
    metrics.forget("ns", "c")
    assert not any(name == "evolving_operator_planner_predicted_gain" for name, _ in _samples(metrics))


def test_the_network_policy_admits_prometheus_only_to_the_metrics_port() -> None:
    cluster = ClusterRef("c", "ns", "u")
    closed = rbac.build_network_policy(cluster, "ops")
    assert all(NODE_AGENT_METRICS_PORT not in [p["port"] for p in rule["ports"]] for rule in closed["spec"]["ingress"])
    operator_rule = closed["spec"]["ingress"][0]["from"][1]
    assert operator_rule["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
    scraped = rbac.build_network_policy(cluster, "ops", metrics_namespace="monitoring")
    extra = [r for r in scraped["spec"]["ingress"] if r not in closed["spec"]["ingress"]]
    assert extra == [
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
         "ports": [{"protocol": "TCP", "port": NODE_AGENT_METRICS_PORT}]}
    ]  # fmt: skip
    assert copy.deepcopy(closed)["spec"]["ingress"] == scraped["spec"]["ingress"][:2]


def test_api_failures_reach_the_metric() -> None:
    from evolving_infra.operator.kube import client_for
    from evolving_infra.operator.runner import make_runtime
    from evolving_infra.operator.settings import OperatorSettings

    rt = make_runtime(client_for("http://127.0.0.1:9"), OperatorSettings(api_retries=0, metrics_port=0))
    try:
        assert rt.api.on_failure is not None
        rt.api.on_failure()
        assert _samples(rt.metrics)[("evolving_operator_api_failures_total", ())] == 1
    finally:
        rt.close()
