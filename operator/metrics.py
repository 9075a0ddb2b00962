"""The operator's own Prometheus metrics (its own registry), served on `EVOLVING_OPERATOR_METRICS_PORT`.

| series | type | labels | meaning |
| --- | --- | --- | --- |
| `evolving_operator_reconciles_total` | counter | result | reconciles run: ok, invalid (spec cannot be applied), error |
| `evolving_operator_reconcile_duration_seconds` | histogram | | duration of one reconcile |
| `evolving_operator_api_failures_total` | counter | | Kubernetes API calls that failed after their retries |
| `evolving_operator_switches_total` | counter | result | switch attempts: converged, retry, rolled_back, stale, nothing |
| `evolving_operator_switch_duration_seconds` | histogram | | a switch attempt that converged: from its start to the last node switched |
| `evolving_operator_rollbacks_total` | counter | cluster_namespace, cluster | target splits rolled back |
| `evolving_operator_drift_reverted_total` | counter | kind | children re-applied after a change outside the operator |
| `evolving_operator_children_deleted_total` | counter | kind | children deleted because the spec no longer wants them |
| `evolving_operator_clusters` | gauge | condition | clusters whose condition is True (Ready, Degraded, Invalid, Adapting, Progressing) |
| `evolving_operator_planner_predicted_gain` | gauge | cluster_namespace, cluster | mean predicted gain of the candidate behind the current target split (status.targetSplit.decision) |

Labels are bounded: result and kind are small enums; cluster_namespace and cluster name the
AgentServingClusters people created (one series per cluster; not `namespace`, which the scrape sets to the
operator's own). Never a request, branch or node id.

Boundary: metric objects and their updates; `serve` starts the exposition endpoint.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from evolving_infra.operator.status import AgentServingClusterStatus, ConditionStatus, ConditionType

WATCHED_CONDITIONS = (
    ConditionType.READY, ConditionType.DEGRADED, ConditionType.INVALID, ConditionType.ADAPTING, ConditionType.PROGRESSING,
)  # fmt: skip
_RECONCILE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SWITCH_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800)


class OperatorMetrics:
    """The series in the module docstring, on their own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "evolving_operator_"
        self.reconciles = Counter(p + "reconciles", "Reconciles run, by result.", ["result"], registry=r)
        self.reconcile_seconds = Histogram(p + "reconcile_duration_seconds", "Duration of one reconcile.", buckets=_RECONCILE_BUCKETS, registry=r)
        self.api_failures = Counter(p + "api_failures", "Kubernetes API calls that failed after their retries.", registry=r)
        self.switches = Counter(p + "switches", "Switch attempts by how they ended.", ["result"], registry=r)
        self.switch_seconds = Histogram(p + "switch_duration_seconds", "Converged switch attempts, start to last node switched.", buckets=_SWITCH_BUCKETS, registry=r)
        self.rollbacks = Counter(p + "rollbacks", "Target splits rolled back.", ["cluster_namespace", "cluster"], registry=r)
        self.drift_reverted = Counter(p + "drift_reverted", "Children re-applied after a change outside the operator.", ["kind"], registry=r)
        self.children_deleted = Counter(p + "children_deleted", "Children deleted because the spec no longer wants them.", ["kind"], registry=r)
        self.clusters = Gauge(p + "clusters", "Clusters whose condition is True.", ["condition"], registry=r)
        self.predicted_gain = Gauge(
            p + "planner_predicted_gain", "Mean predicted gain of the candidate behind the current target split.", ["cluster_namespace", "cluster"], registry=r
        )
        self._true: dict[tuple[str, str], frozenset[ConditionType]] = {}
        self._gains: set[tuple[str, str]] = set()
        for condition in WATCHED_CONDITIONS:
            self.clusters.labels(condition=condition.value).set(0)
        for result in ("ok", "invalid", "error"):
            self.reconciles.labels(result=result)

    def observe_status(self, namespace: str, name: str, status: AgentServingClusterStatus) -> None:
        """Record a cluster's conditions and its planner's predicted gain after a reconcile."""
        self._true[(namespace, name)] = frozenset(
            c.type for c in status.conditions or () if c.status is ConditionStatus.TRUE and c.type in WATCHED_CONDITIONS
        )
        self._recount()
        gain = predicted_gain(status)
        if gain is None:
            self._drop_gain(namespace, name)
        else:
            self.predicted_gain.labels(cluster_namespace=namespace, cluster=name).set(gain)
            self._gains.add((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        """A cluster is gone: drop its series."""
        self._true.pop((namespace, name), None)
        self._recount()
        self._drop_gain(namespace, name)

    def _drop_gain(self, namespace: str, name: str) -> None:
        if (namespace, name) in self._gains:
            self._gains.discard((namespace, name))
            self.predicted_gain.remove(namespace, name)

    def _recount(self) -> None:
        for condition in WATCHED_CONDITIONS:
            self.clusters.labels(condition=condition.value).set(sum(condition in true for true in self._true.values()))

    def children(self, reverted_kinds: Iterable[str], deleted_kinds: Iterable[str]) -> None:
        for kind in reverted_kinds:
            self.drift_reverted.labels(kind=kind).inc()
        for kind in deleted_kinds:
            self.children_deleted.labels(kind=kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:  # noqa: S104  (a pod's metrics port)
        """Serve `/metrics` on host:port from a background thread."""
        start_http_server(port, addr=host, registry=self.registry)


def predicted_gain(status: AgentServingClusterStatus) -> float | None:
    """The mean gain the planner predicted for the candidate it chose (the target's prefill count), if any."""
    target = status.target_split
    if target is None or target.decision is None:
        return None
    for candidate in target.decision.candidates:
        if candidate.prefill == target.prefill and candidate.mean_gain is not None and math.isfinite(candidate.mean_gain):
            return float(candidate.mean_gain)
    return None
