"""Reconciling one AgentServingCluster: validate, claim nodes, apply children, track node agents, write status.

`reconcile(rt, namespace, name)` is what every trigger runs (create, resume, spec update, the periodic
resync): it reads the object afresh, and
1. parses and checks the spec (schema rules, then the checks that need the hardware profiles); a spec
   that fails sets `Invalid` and creates nothing — every check runs before the first write;
2. works out the partition claims of all clusters over the nodes' labels, and keeps this cluster's node
   agents off nodes an earlier cluster claimed;
3. applies the children (only what is missing, changed or edited by hand; see `children`) and deletes
   those the spec no longer wants, with an event for each child reverted or deleted;
4. tracks the node agents (pods, addresses, `GetState`) and the router's availability into status;
5. places collocated node agents into a phase (`placement`: the initial split, or a node that joined
   later) through `SwitchPhase`; a failed placement is retried (`Outcome.retry_delay`, when the caller
   passes its `attempt`) and degrades the cluster.
Status is written (server-side apply, the operator's field manager, `/status` only) only when the
operator's part of it changed. The operator never writes `spec`.

All work on one cluster holds that cluster's lock, so a resync never interleaves with a phase switch.

Boundary: the imperative shell around the pure builders, claims, node tracking and status summary.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.operator import conditions, images, kube, meta, nodes, placement, summary
from evolving_infra.operator.agents import AgentError, AgentState, AgentUnavailable, NodeAgentClient
from evolving_infra.operator.credentials import CredentialsUnavailable, cluster_credentials
from evolving_infra.operator.builders import BuildContext, build_children
from evolving_infra.operator.children import ApplyResult, NormalizedFields, apply_children, prune_children
from evolving_infra.operator.conditions import Want
from evolving_infra.operator.kube import KubeApi, KubeError
from evolving_infra.operator.metrics import OperatorMetrics
from evolving_infra.operator.partitions import ClusterSelection, NodeLabels, PartitionClaim, claim_nodes
from evolving_infra.operator.semantics import builtin_profile_table, resolve_profile, validate_spec_semantics
from evolving_infra.operator.settings import OperatorSettings
from evolving_infra.operator.spec import AgentServingClusterSpec, NodeSelector
from evolving_infra.operator.status import AgentServingClusterStatus, ConditionStatus, ConditionType, NodeStatus
from evolving_infra.operator.summary import Problem

log = logging.getLogger(__name__)

NO_CREDENTIALS = "NO_CREDENTIALS"
"""The code of an agent not called because the cluster's credential Secret is missing or unusable."""
CREDENTIALS_MISSING = "CredentialsMissing"
"""The problem (Degraded condition reason) that reports it, with the Secret and the key at fault."""
CREDENTIALS_REFUSED = "CredentialsRefused"
"""Node agents answered UNAUTHENTICATED: the token (or certificate) the operator read is not theirs."""

DRIFT_REVERTED = "DriftReverted"
"""Event reason: a child edited by hand was re-applied (the message names the fields)."""
CHILD_DELETED = "ChildDeleted"
"""Event reason: a child the spec no longer wants was deleted."""


class EventSink(Protocol):
    def __call__(self, body: Mapping[str, Any], type: str, reason: str, message: str) -> None: ...


def utc_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _no_events(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    log.info("event %s %s: %s", type, reason, message)


@dataclass
class Runtime:
    """What handlers share: the API, the node agent client, settings, a clock, an event sink, per-cluster locks."""

    api: KubeApi
    agents: NodeAgentClient
    settings: OperatorSettings
    profiles: Mapping[str, HardwareProfile] | None = None
    clock: Callable[[], datetime] = utc_now
    events: EventSink = _no_events
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    normalized: NormalizedFields = field(default_factory=dict)
    """Fields the API server normalises, per child and applied hash (see `children.apply_children`)."""

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self.locks.setdefault((namespace, name), asyncio.Lock())

    def profile_table(self) -> Mapping[str, HardwareProfile]:
        return builtin_profile_table() if self.profiles is None else self.profiles

    def close(self) -> None:
        self.agents.close()
        self.api.close()


@dataclass(frozen=True, slots=True)
class Parsed:
    cluster: meta.ClusterRef
    spec: AgentServingClusterSpec | None
    problems: tuple[str, ...]


def parse(body: Mapping[str, Any], profiles: Mapping[str, HardwareProfile]) -> Parsed:
    """The cluster's identity, its spec and every problem that prevents applying it."""
    cluster = meta.ClusterRef.from_object(body)
    problems: list[str] = []
    if not meta.cluster_name_ok(cluster.name):
        problems.append(meta.NAME_RULE_MESSAGE + f" (got {cluster.name!r})")
    try:
        spec = AgentServingClusterSpec.from_kube(body.get("spec") or {})
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(["spec", *(str(p) for p in err["loc"])])
            problems.append(f"{where}: {str(err['msg']).removeprefix('Value error, ')}")
        return Parsed(cluster, None, tuple(problems))
    problems.extend(f"spec: {p}" for p in validate_spec_semantics(spec, profiles))
    return Parsed(cluster, spec, tuple(problems))


def parse_status(body: Mapping[str, Any]) -> AgentServingClusterStatus:
    """The object's status; an unreadable one counts as empty (the operator rewrites its own part)."""
    try:
        return AgentServingClusterStatus.from_kube(body.get("status") or {})
    except ValidationError as exc:
        log.warning("status of %s is unreadable, rebuilding the operator's part: %s", (body.get("metadata") or {}).get("name"), exc)
        return AgentServingClusterStatus()


def _selection(obj: Mapping[str, Any]) -> ClusterSelection | None:
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    try:
        selector = NodeSelector.from_kube(spec.get("nodeSelector") or {})
        created = datetime.fromisoformat(str(md.get("creationTimestamp")).replace("Z", "+00:00"))
        return ClusterSelection(str(md["namespace"]), str(md["name"]), created, selector, int(spec["nodeCount"]))
    except (ValidationError, ValueError, KeyError, TypeError):
        return None  # an invalid cluster claims nothing


class ClaimScope(enum.Enum):
    """How far the partition check reached (the `PartitionsChecked` condition's reason)."""

    ALL_NAMESPACES = "AllNamespaces"
    NAMESPACE_ONLY = "NamespaceOnly"
    UNAVAILABLE = "CheckUnavailable"


@dataclass(frozen=True, slots=True)
class Claimed:
    """This cluster's claim (None when unchecked) and how far the check reached."""

    claim: PartitionClaim | None
    scope: ClaimScope
    detail: str = ""

    def want(self) -> Want:
        if self.scope is ClaimScope.ALL_NAMESPACES:
            return Want.true(ConditionType.PARTITIONS_CHECKED, self.scope.value, "node claims checked against clusters in every namespace")
        if self.scope is ClaimScope.NAMESPACE_ONLY:
            message = (
                f"node claims checked against clusters in namespace {self.detail} only: the operator may not list clusters "
                "in other namespaces (namespaced install), so overlaps with them are not detected"
            )
            return Want.false(ConditionType.PARTITIONS_CHECKED, self.scope.value, message)
        message = f"node claims not checked: {self.detail}; node agents run on every selected node"
        return Want.false(ConditionType.PARTITIONS_CHECKED, self.scope.value, message)


async def claim(rt: Runtime, cluster: meta.ClusterRef) -> Claimed:
    """This cluster's claim among all clusters it may list: every namespace, else its own (a namespaced
    install), else none (nodes cannot be listed); the scope says which, for the `PartitionsChecked` condition."""
    scope = ClaimScope.ALL_NAMESPACES
    try:
        others = await rt.api.list(kube.CLUSTER)
    except KubeError as exc:
        if not exc.forbidden:
            raise
        scope = ClaimScope.NAMESPACE_ONLY
        try:
            others = await rt.api.list(kube.CLUSTER, cluster.namespace)
        except KubeError as inner:
            if not inner.forbidden:
                raise
            return Claimed(None, ClaimScope.UNAVAILABLE, f"clusters cannot be listed ({inner.message or inner.reason})")
    try:
        node_objs = await rt.api.list(kube.NODE)
    except KubeError as exc:
        if not exc.forbidden:
            raise
        log.warning("partition claims not checked for %s/%s: %s", cluster.namespace, cluster.name, exc)
        return Claimed(None, ClaimScope.UNAVAILABLE, f"nodes cannot be listed ({exc.message or exc.reason})")
    selections = [s for s in (_selection(o) for o in others if not (o.get("metadata") or {}).get("deletionTimestamp")) if s]
    labelled = [NodeLabels(str(n["metadata"]["name"]), (n["metadata"].get("labels") or {})) for n in node_objs]
    found = claim_nodes(selections, labelled).get((cluster.namespace, cluster.name))
    return Claimed(found, scope, cluster.namespace if scope is ClaimScope.NAMESPACE_ONLY else "")


def claim_problems(claim_: PartitionClaim | None) -> list[Problem]:
    if claim_ is None or claim_.ok:
        return []
    reason = "PartitionConflict" if claim_.conflicts else "NodeCountMismatch"
    return [Problem(reason, "; ".join(claim_.problems()))]


Answers = dict[str, AgentState | AgentError]


async def observe_nodes(
    rt: Runtime, cluster: meta.ClusterRef, spec: AgentServingClusterSpec, previous: list[NodeStatus] | None, allowed: frozenset[str] | None
) -> list[NodeStatus]:
    """Node agents of the cluster as they are now (pods, then each agent's own state)."""
    return (await observe_agents(rt, cluster, spec, previous, allowed))[0]


async def observe_agents(
    rt: Runtime, cluster: meta.ClusterRef, spec: AgentServingClusterSpec, previous: list[NodeStatus] | None, allowed: frozenset[str] | None
) -> tuple[list[NodeStatus], Answers]:
    """`observe_nodes` and each agent's answer, keyed by node."""
    pods = await rt.api.list(kube.POD, cluster.namespace, meta.selector_labels(cluster, meta.Component.NODE_AGENT))
    by_node = nodes.pods_by_node(pods, rt.settings.node_agent_port, allowed)
    gate = asyncio.Semaphore(rt.settings.agent_concurrency)
    missing: CredentialsUnavailable | None = None
    try:  # the switches that follow in this reconcile reuse what is registered here, per address
        rt.agents.use_credentials([p.address for p in by_node.values() if p.address], await cluster_credentials(rt.api, cluster, spec))
    except CredentialsUnavailable as error:
        missing = error
        log.warning("cluster %s/%s: %s; its node agents are not called", cluster.namespace, cluster.name, error)

    async def ask(pod: nodes.AgentPod) -> AgentState | AgentError:
        if pod.address is None:
            return AgentError(pod.pod, "NO_ADDRESS", "the pod has no IP yet")
        if missing is not None:
            return AgentUnavailable(pod.address, NO_CREDENTIALS, str(missing))
        async with gate:
            try:
                return await rt.agents.get_state(pod.address)
            except AgentError as exc:
                return exc

    names = sorted(by_node)
    answers = dict(zip(names, await asyncio.gather(*(ask(by_node[n]) for n in names)), strict=True))
    return nodes.track(by_node, previous, answers, spec.initial_split), answers


async def router_ready(rt: Runtime, cluster: meta.ClusterRef) -> bool:
    deployment = await rt.api.get(kube.DEPLOYMENT, cluster.namespace, cluster.child_name("router"))
    return bool(deployment and ((deployment.get("status") or {}).get("availableReplicas") or 0) >= 1)


async def write_status(rt: Runtime, body: Mapping[str, Any], before: AgentServingClusterStatus, after: AgentServingClusterStatus) -> bool:
    """Apply the operator's part of `after` to /status if it differs from `before`; whether it wrote."""
    if summary.same_owned(before, after):
        return False
    md = body.get("metadata") or {}
    patch = {
        "apiVersion": meta.API_VERSION,
        "kind": meta.KIND,
        "metadata": {"name": md["name"], "namespace": md["namespace"]},
        "status": summary.owned(after),
    }
    await rt.api.apply(patch, subresource="status")
    return True


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one reconcile did (for logs and tests)."""

    valid: bool
    children: ApplyResult | None = None
    status_written: bool = False
    problems: tuple[str, ...] = ()
    placed: tuple[str, ...] = ()
    """Nodes placed into a phase by this reconcile (see `placement`)."""
    retry_delay: float | None = None
    """Seconds before the caller should reconcile again (a placement attempt failed; attempts are left)."""
    status: AgentServingClusterStatus | None = None
    """The status as this reconcile left it."""


async def fetch(rt: Runtime, namespace: str, name: str) -> dict[str, Any] | None:
    return await rt.api.get(kube.CLUSTER, namespace, name)


async def reconcile(rt: Runtime, namespace: str, name: str, attempt: int | None = None) -> Outcome | None:
    """Bring one cluster's children and status in line with its spec; None when it is gone or going.

    `attempt` (from 0) numbers the caller's retries of a failed placement; None: no retry follows."""
    started = time.perf_counter()
    try:
        async with rt.lock(namespace, name):
            body = await fetch(rt, namespace, name)
            if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                rt.metrics.forget(namespace, name)
                return None
            outcome = await _reconcile_locked(rt, body, attempt)
    except Exception:
        rt.metrics.reconciles.labels(result="error").inc()
        raise
    finally:
        rt.metrics.reconcile_seconds.observe(time.perf_counter() - started)
    rt.metrics.reconciles.labels(result="ok" if outcome.valid else "invalid").inc()
    if outcome.status is not None:
        rt.metrics.observe_status(namespace, name, outcome.status)
    return outcome


@dataclass(frozen=True, slots=True)
class _Placed:
    nodes: list[NodeStatus]
    wants: tuple[Want, ...] = ()
    problems: tuple[Problem, ...] = ()
    placed: tuple[str, ...] = ()
    retry_delay: float | None = None


async def _place(rt: Runtime, body: Mapping[str, Any], tracked: list[NodeStatus], answers: Answers, spec: AgentServingClusterSpec,
                 status: AgentServingClusterStatus, attempt: int | None) -> _Placed:  # fmt: skip
    """Place collocated agents (see `placement`); the conditions, problems and retry delay that follow."""
    adapting = conditions.find(status.conditions, ConditionType.ADAPTING)
    retrying = adapting is not None and adapting.reason == placement.PLACEMENT_RETRYING and adapting.status is ConditionStatus.TRUE
    plan = placement.plan_placement(tracked, answers, spec.initial_split, status.target_split, retrying)
    if plan is None or not plan.moves:
        return _Placed(tracked)
    done = await placement.place(rt, body, tracked, plan)
    failed = {move.node for move, _ in done.failures}
    placed = tuple(m.node for m in plan.moves if m.node not in failed)
    if not done.failures:
        reason = placement.INITIAL_SPLIT if plan.initial else placement.NODE_PLACED
        rt.events(body, "Normal", reason, done.summary)
        return _Placed(done.nodes, (Want.false(ConditionType.ADAPTING, summary.SPLIT_CONVERGED, done.summary),), placed=placed)
    errors = "; ".join(f"{move.node}: {err}" for move, err in done.failures)
    refused = any(not isinstance(err, AgentUnavailable) for _, err in done.failures)
    if attempt is not None and attempt + 1 < rt.settings.switch_attempts and not refused:
        delay = rt.settings.switch_backoff(attempt)
        message = f"attempt {attempt + 1} of {rt.settings.switch_attempts} at {plan.split} failed, retrying in {delay:g} s: {errors}"
        want = Want.true(ConditionType.ADAPTING, placement.PLACEMENT_RETRYING, message)
        return _Placed(done.nodes, (want,), (Problem(placement.PLACEMENT_FAILED, message),), placed, delay)
    message = f"placing nodes for {plan.split} failed (the next resync tries again): {errors}"
    rt.events(body, "Warning", placement.PLACEMENT_FAILED, message)
    want = Want.false(ConditionType.ADAPTING, placement.PLACEMENT_FAILED, message)
    return _Placed(done.nodes, (want,), (Problem(placement.PLACEMENT_FAILED, message),), placed)


async def _reconcile_locked(rt: Runtime, body: dict[str, Any], attempt: int | None = None) -> Outcome:
    generation = (body.get("metadata") or {}).get("generation")
    before = parse_status(body)
    parsed = parse(body, rt.profile_table())
    if parsed.spec is None or parsed.problems:
        after = summary.invalid(before, parsed.problems, rt.clock(), generation)
        written = await write_status(rt, body, before, after)
        return Outcome(valid=False, status_written=written, problems=parsed.problems, status=after)
    cluster, spec = parsed.cluster, parsed.spec
    claimed = await claim(rt, cluster)
    claim_ = claimed.claim
    # Node agents run on the claimed nodes only: not on nodes an earlier cluster holds, nor on the surplus.
    excluded = tuple(sorted({c.node for c in claim_.conflicts} | set(claim_.surplus))) if claim_ is not None else ()
    ctx = BuildContext(
        cluster,
        spec,
        resolve_profile(spec, rt.profile_table()),
        rt.settings.default_image or images.FALLBACK_IMAGE,
        operator_namespace=rt.settings.namespace,
        excluded_nodes=excluded,
        metrics_namespace=rt.settings.metrics_namespace,
    )
    desired = build_children(ctx)
    applied = await apply_children(rt.api, cluster, desired, rt.normalized)
    applied.deleted.extend(await prune_children(rt.api, cluster, desired))
    for reverted in applied.reverted:
        rt.events(body, "Warning", DRIFT_REVERTED, reverted.message())
    for child in applied.deleted:
        rt.events(body, "Normal", CHILD_DELETED, f"{child} is no longer wanted by the spec; deleted")
    rt.metrics.children((r.kind for r in applied.reverted), (child.split(" ", 1)[0] for child in applied.deleted))
    problems = claim_problems(claim_)
    if applied.conflicts:
        problems.append(Problem("ChildConflict", "; ".join(applied.conflicts)))
    allowed = frozenset(claim_.nodes) if claim_ is not None else None
    tracked, answers = await observe_agents(rt, cluster, spec, before.nodes, allowed)
    uncredentialed = next((a for a in answers.values() if isinstance(a, AgentError) and a.code == NO_CREDENTIALS), None)
    if uncredentialed is not None:
        problems.append(Problem(CREDENTIALS_MISSING, uncredentialed.detail))
    refused = sorted(str(a) for a in answers.values() if isinstance(a, AgentError) and a.code == "UNAUTHENTICATED")
    if refused:
        problems.append(Problem(CREDENTIALS_REFUSED, "the operator's credentials were refused: " + "; ".join(refused[:3])))
    placed = await _place(rt, body, tracked, answers, spec, before, attempt)
    problems.extend(placed.problems)
    expected = len(claim_.nodes) if claim_ is not None else spec.node_count
    after = summary.summarize(
        before,
        tracked=placed.nodes,
        expected_nodes=expected,
        router_ready=await router_ready(rt, cluster),
        problems=problems,
        now=rt.clock(),
        generation=generation,
        rolled_out=bool(applied.created or applied.updated or applied.deleted),
        progress_deadline_seconds=rt.settings.progress_deadline_seconds,
    )
    after = summary.with_conditions(after, (claimed.want(), *placed.wants), rt.clock(), generation)
    written = await write_status(rt, body, before, after)
    return Outcome(
        valid=True, children=applied, status_written=written, problems=tuple(p.message for p in problems),
        placed=placed.placed, retry_delay=placed.retry_delay, status=after,
    )  # fmt: skip
