"""manifests/components/monitoring: every metric the dashboard and the alerts name is exported by the code,
every expression parses as PromQL (`promql-parser` from PyPI, the Python binding of the Rust parser), and
the PodMonitors select the pods and ports the builders make."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

promql = pytest.importorskip("promql_parser", reason="promql-parser is in the test extra; without it PromQL is not checked")

from evolving_infra.node_agent.service.metrics import NodeMetrics  # noqa: E402
from evolving_infra.operator.builders import BuildContext, build_children  # noqa: E402
from evolving_infra.operator.meta import ClusterRef, selector_matches  # noqa: E402
from evolving_infra.operator.metrics import OperatorMetrics  # noqa: E402
from evolving_infra.operator.semantics import builtin_profile_table  # noqa: E402
from evolving_infra.operator.spec import AgentServingClusterSpec, NodeSelector  # noqa: E402
from evolving_infra.router.http.metrics import RouterMetrics  # noqa: E402
from evolving_infra.router.service.metrics import RouterServiceMetrics  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "manifests" / "components" / "monitoring"
KUBECTL = shutil.which("kubectl")
RELABELLED = {"asc", "component", "kubernetes_node"}
"""Labels the PodMonitor adds to every series."""
TARGET_LABELS = RELABELLED | {"namespace", "pod", "container", "endpoint", "job", "instance"}
"""Labels a series gets from its scrape target; a series' own label of the same name would be renamed
(`exported_namespace`), so none may have one."""
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m"}


def _workload_registries() -> list[CollectorRegistry]:
    return [RouterServiceMetrics().registry, RouterMetrics().registry, NodeMetrics().registry]


def exported(registries: list[CollectorRegistry] | None = None) -> dict[str, set[str]]:
    """Every series name the code exposes (counters with `_total`, histograms with their suffixes) and its labels."""
    out: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",), "summary": ("", "_count", "_sum")}
    for registry in registries if registries is not None else [*_workload_registries(), OperatorMetrics().registry]:
        for family in registry.collect():
            labels = set()
            for metric in registry._names_to_collectors.values():  # noqa: SLF001  (label names of families without samples)
                if getattr(metric, "_name", None) == family.name:
                    labels = set(getattr(metric, "_labelnames", ()))
            for suffix in suffixes[family.type]:
                out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def _alerts() -> list[dict[str, Any]]:
    rule = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text(encoding="utf-8"))
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def _dashboard_exprs() -> Iterator[tuple[str, str]]:
    dashboard = json.loads((COMPONENT / "dashboard.json").read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def _for_parser(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """(metric name, equality matchers) of every vector selector in `expr`, from the parsed AST."""
    found: list[tuple[str, dict[str, str]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql.VectorSelector):
            matchers = {m.name: m.value for m in node.matchers.matchers if str(m.op) in ("MatchOp.Equal", "=")}
            found.append((node.name, matchers))

    promql.walk(promql.parse(_for_parser(expr)), visit)
    return found


def all_exprs() -> list[tuple[str, str]]:
    return [(f"alert {a['alert']}", a["expr"]) for a in _alerts()] + [(f"panel {t}", e) for t, e in _dashboard_exprs()]


@pytest.mark.parametrize("where,expr", all_exprs(), ids=[w for w, _ in all_exprs()])
def test_every_expression_parses_and_names_only_exported_series(where: str, expr: str) -> None:
    names = exported()
    found = selectors(expr)
    assert found, f"{where}: no series in {expr!r}"
    for name, matchers in found:
        assert name in names, f"{where}: {name} is not exported by the router, node agent or operator code"
        unknown = set(matchers) - names[name] - TARGET_LABELS
        assert not unknown, f"{where}: {name} has no label(s) {sorted(unknown)}"


def test_the_alerts_cover_the_issue_list_and_are_labelled() -> None:
    alerts = {a["alert"]: a for a in _alerts()}
    assert {"EvolvingSwitchRolledBack", "EvolvingNodeAgentUnreachable", "EvolvingResplitFlapping", "EvolvingTTFTObjectiveBurn",
            "EvolvingLostKVReuseHigh", "EvolvingKVFetchFailures"} <= set(alerts)  # fmt: skip
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in ("warning", "critical"), name
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], name


def test_the_ttft_objective_uses_a_real_bucket_bound() -> None:
    metrics = RouterMetrics()
    from evolving_infra.router.http.api import Endpoint

    metrics.first_token(Endpoint.CHAT_COMPLETIONS, 1.0)
    bounds = {
        s.labels["le"]
        for f in text_string_to_metric_families(metrics.exposition().decode())
        for s in f.samples
        if s.name == "evolving_time_to_first_token_seconds_bucket"
    }
    used = {m["le"] for a in _alerts() for name, m in selectors(a["expr"]) if name.endswith("_bucket") and "le" in m}
    assert used and used <= bounds, (used, sorted(bounds))


def test_the_target_labels_do_not_clash_with_the_series_own() -> None:
    # The operator is scraped without honorLabels: none of its labels may be a target label.
    for name, labels in exported([OperatorMetrics().registry]).items():
        assert not labels & TARGET_LABELS, name
    # Routers and node agents are scraped with honorLabels (their `endpoint` wins): none of their labels may
    # shadow the target's identity labels.
    monitor = yaml.safe_load((COMPONENT / "podmonitor-workloads.yaml").read_text(encoding="utf-8"))
    assert all(e.get("honorLabels") for e in monitor["spec"]["podMetricsEndpoints"])
    for name, labels in exported(_workload_registries()).items():
        assert not labels & (TARGET_LABELS - {"endpoint"}), name


def test_the_dashboard_has_the_panels_the_issue_asks_for() -> None:
    titles = [t for t, _ in _dashboard_exprs()]
    for wanted in ("Split over time", "Phase switches", "Time to first token", "End-to-end", "KV hit rate vs ideal", "Lost KV reuse",
                   "Queued requests per node", "Planner"):  # fmt: skip
        assert any(t.startswith(wanted) for t in titles), wanted


def _pod_templates() -> dict[str, dict[str, Any]]:
    spec = AgentServingClusterSpec.from_kube(
        {"nodeSelector": {"matchLabels": {"p": "a"}}, "nodeCount": 2, "engine": {"profile": "glm-5.2-4xgb300-tp4"}, "initialSplit": {"prefill": 1, "decode": 1}}
    )
    ctx = BuildContext(ClusterRef("c", "ns", "u"), spec, builtin_profile_table()["glm-5.2-4xgb300-tp4"], "img")
    return {c["kind"]: c["spec"]["template"] for c in build_children(ctx) if c["kind"] in ("Deployment", "DaemonSet")}


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed: kustomize builds not checked")
def test_the_component_builds_and_its_pod_monitors_find_the_workloads(tmp_path: Path) -> None:
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
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}
    for key in (("PodMonitor", "evolving-infra-workloads"), ("PodMonitor", "evolving-infra-operator"), ("PodMonitor", "evolving-infra-gateway"), ("PrometheusRule", "evolving-infra-alerts"), ("ConfigMap", "evolving-infra-dashboard")):
        assert docs[key]["metadata"]["namespace"] == "evolving-infra-system", key
    assert docs[("ConfigMap", "evolving-infra-dashboard")]["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(docs[("ConfigMap", "evolving-infra-dashboard")]["data"]["evolving-infra.json"])
    operator = docs[("Deployment", "evolving-infra-operator")]["spec"]["template"]
    env = {e["name"]: e.get("value") for e in operator["spec"]["containers"][0]["env"]}
    assert env["EVOLVING_OPERATOR_METRICS_NAMESPACE"] == "monitoring"

    def selected(monitor: dict[str, Any], template: dict[str, Any]) -> bool:
        selector = NodeSelector.from_kube(monitor["spec"]["selector"])  # same shape as a label selector
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", ())}
        return selector_matches(selector, template["metadata"]["labels"]) and all(e["port"] in ports for e in monitor["spec"]["podMetricsEndpoints"])

    workloads = docs[("PodMonitor", "evolving-infra-workloads")]
    assert all(selected(workloads, t) for t in _pod_templates().values())
    assert not selected(workloads, operator)
    assert selected(docs[("PodMonitor", "evolving-infra-operator")], operator)


def test_the_gateway_pod_monitor_finds_the_global_router_and_keeps_its_labels() -> None:
    """The fleet's global router (manifests/components/gateway) is scraped by its own PodMonitor: it selects the
    gateway's pods and metrics port and nothing the operator makes, and no gateway series loses a label to the
    target's."""
    from evolving_infra.gateway.metrics import GatewayMetrics

    monitor = yaml.safe_load((COMPONENT / "podmonitor-gateway.yaml").read_text(encoding="utf-8"))
    assert "podmonitor-gateway.yaml" in yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())["resources"]
    gateway = yaml.safe_load((REPO / "manifests" / "components" / "gateway" / "deployment.yaml").read_text())["spec"]["template"]
    selector = NodeSelector.from_kube(monitor["spec"]["selector"])
    ports = {p["name"]: p["containerPort"] for c in gateway["spec"]["containers"] for p in c.get("ports", ())}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert selector_matches(selector, gateway["metadata"]["labels"]) and endpoint["port"] in ports
    assert "--admin-port=" + str(ports[endpoint["port"]]) in gateway["spec"]["containers"][0]["args"]  # /metrics lives there
    assert not any(selector_matches(selector, t["metadata"]["labels"]) for t in _pod_templates().values())
    assert endpoint["honorLabels"]  # the series' own `endpoint` (the OpenAI endpoint) wins over the port name
    relabelled = {r["targetLabel"] for r in endpoint.get("relabelings", ())}
    for name, labels in exported([GatewayMetrics().registry]).items():
        assert not labels & ((TARGET_LABELS - {"endpoint"}) | relabelled), name
