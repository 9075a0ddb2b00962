"""Applying a cluster's child objects idempotently: create what is missing, re-apply what changed or drifted,
delete what is no longer wanted, nothing else.

Each child carries the hash of the object the builders produced (`serving.evolving-infra.io/applied-hash`);
a child whose hash differs (the spec changed) is re-applied. A child whose hash matches is compared with
what the builders want (`drift`): every field the operator sets must hold the same value live, fields the
API server or other controllers add are ignored, and quantities compare by value (`1Gi` = `1024Mi`), so
values the server normalises never cause a write loop. A child edited by hand is re-applied (server-side
apply, the operator's field manager) and the fields it reverted are reported. Children the spec no longer
wants (the NetworkPolicy once disabled) are found by their labels (`app.kubernetes.io/instance` and
`managed-by`) and their controlling owner reference, and deleted. A child that exists but is not controlled
by this cluster is never overwritten nor deleted: it is reported instead. Fields the server still answers
differently right after an apply are its normalisation, learnt per child and applied hash, and never
reverted again (so an unforeseen normalisation cannot cause a write and an event every resync).

Boundary: `desired_with_hash`, `drift` and `ownership_problem` are pure; `apply_children` and
`prune_children` call the API.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolving_infra.operator import kube
from evolving_infra.operator.kube import Kind, KubeApi, kind_of
from evolving_infra.operator.meta import ANNOTATION_PREFIX, MANAGED_BY, ClusterRef
from evolving_infra.operator.quantity import parse_quantity

APPLIED_HASH = f"{ANNOTATION_PREFIX}/applied-hash"
log = logging.getLogger(__name__)


def object_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def desired_with_hash(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `obj` annotated with its own hash."""
    out = copy.deepcopy(dict(obj))
    out.setdefault("metadata", {}).setdefault("annotations", {})[APPLIED_HASH] = object_hash(obj)
    return out


CHILD_KINDS: tuple[Kind, ...] = tuple(
    kube.KINDS[key]
    for key in (
        ("v1", "ServiceAccount"), ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("v1", "ConfigMap"), ("v1", "Service"), ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
    )
)  # fmt: skip
"""Every kind of child the builders make (the inventory `prune_children` looks through)."""
IGNORED_METADATA = frozenset({"name", "namespace", "ownerReferences"})
"""metadata the drift check leaves to others: identity, and ownership (checked by `ownership_problem`)."""


def _same_scalar(want: Any, have: Any) -> bool:
    if want == have and type(want) is type(have):
        return True
    if isinstance(want, bool) or isinstance(have, bool):
        return want == have and isinstance(want, bool) and isinstance(have, bool)
    if isinstance(want, int | float) and isinstance(have, int | float):
        return float(want) == float(have)
    if isinstance(want, str | int) and isinstance(have, str | int):
        try:
            return parse_quantity(want) == parse_quantity(have)
        except ValueError:
            return False
    return False


def _omittable(value: Any) -> bool:
    """A value the API server may leave out of its answer (`omitempty`): it counts as held when absent."""
    return value is None or value is False or (isinstance(value, str | dict | list) and not value)


def _drift(want: Any, have: Any, path: str, out: list[str]) -> None:
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            out.append(path or ".")
            return
        for key, value in want.items():
            if path == "metadata" and key in IGNORED_METADATA:
                continue
            where = f"{path}.{key}" if path else str(key)
            if key not in have:
                if not _omittable(value):
                    out.append(where)
            else:
                _drift(value, have[key], where, out)
    elif isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            out.append(path)
            return
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            _drift(w, h, f"{path}[{i}]", out)
    elif not _same_scalar(want, have):
        out.append(path)


def drift(desired: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """Paths (`spec.template.spec.containers[0].image`) where `live` does not hold what `desired` sets.

    Only fields `desired` sets count; a list must have the same length and each item hold its counterpart's
    fields; quantities compare by value; an empty or false value counts as held when the server left the
    field out (`omitempty`). `status` is the controllers' and never compared."""
    out: list[str] = []
    _drift({k: v for k, v in desired.items() if k != "status"}, live, "", out)
    return out


def _describe(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return f"{obj.get('kind')} {md.get('namespace', '')}/{md.get('name', '')}"


def ownership_problem(live: Mapping[str, Any], cluster: ClusterRef) -> str | None:
    """Why `live` must not be overwritten for `cluster`, or None when the cluster controls it."""
    refs = (live.get("metadata") or {}).get("ownerReferences") or ()
    if any(ref.get("uid") == cluster.uid and ref.get("controller") for ref in refs):
        return None
    owners = ", ".join(f"{r.get('kind')}/{r.get('name')}" for r in refs if r.get("controller")) or "nobody"
    return f"{_describe(live)} already exists and is controlled by {owners}; delete or rename it"


@dataclass(frozen=True, slots=True)
class Reverted:
    """A child edited by hand and re-applied: which, and the fields that had drifted."""

    child: str
    kind: str
    fields: tuple[str, ...]

    def message(self, limit: int = 5) -> str:
        shown = ", ".join(self.fields[:limit]) + (f" and {len(self.fields) - limit} more" if len(self.fields) > limit else "")
        return f"{self.child} had been changed outside the operator; reverted {shown}"


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    reverted: list[Reverted] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.reverted) + len(self.deleted)


NormalizedFields = dict[tuple[str, str], frozenset[str]]
"""Per (child, applied hash): fields the API server answers differently from what was applied (normalised)."""


async def apply_children(
    api: KubeApi, cluster: ClusterRef, children: Sequence[Mapping[str, Any]], normalized: NormalizedFields | None = None
) -> ApplyResult:
    """Create or re-apply each child that is missing, whose hash differs, or that drifted (in order).

    `normalized` (kept by the caller across reconciles) learns the fields the server still answers
    differently right after an apply: those are the server's normalisation, not a hand edit, and are not
    reverted again for that hash (no write and event every resync)."""
    result = ApplyResult()
    learned = normalized if normalized is not None else {}
    for child in children:
        desired = desired_with_hash(child)
        kind = kind_of(desired)
        md = desired["metadata"]
        label = _describe(desired)
        key = (label, md["annotations"][APPLIED_HASH])
        live = await api.get(kind, md.get("namespace"), md["name"])
        if live is None:
            await api.create(desired)
            result.created.append(label)
            continue
        problem = ownership_problem(live, cluster)
        if problem is not None:
            result.conflicts.append(problem)
            continue
        if ((live.get("metadata") or {}).get("annotations") or {}).get(APPLIED_HASH) == md["annotations"][APPLIED_HASH]:
            fields = [f for f in drift(desired, live) if f not in learned.get(key, frozenset())]
            if not fields:
                result.unchanged.append(label)
                continue
            answer = await api.apply(desired)
            kept: set[str] | frozenset[str] = set(drift(desired, answer)) & set(fields)
            if kept:
                learned[key] = learned.get(key, frozenset()) | kept
                log.warning("%s: the API server normalises %s; not treated as drift", label, ", ".join(sorted(kept)))
            reverted = tuple(f for f in fields if f not in kept)
            if reverted:
                result.reverted.append(Reverted(label, str(desired.get("kind")), reverted))
            else:
                result.unchanged.append(label)
            continue
        answer = await api.apply(desired)
        for stale in [k for k in learned if k[0] == label and k != key]:
            del learned[stale]  # what was learnt for an older hash of this child
        kept = frozenset(drift(desired, answer))
        if kept:
            learned[key] = kept
        result.updated.append(label)
    return result


def inventory_labels(cluster: ClusterRef) -> dict[str, str]:
    """Labels every child of `cluster` carries (see `meta.labels`), to find them all."""
    return {"app.kubernetes.io/instance": cluster.name, "app.kubernetes.io/managed-by": MANAGED_BY}


async def prune_children(api: KubeApi, cluster: ClusterRef, children: Sequence[Mapping[str, Any]]) -> list[str]:
    """Delete the children of `cluster` (labelled and controlled by it) that `children` no longer has; their names."""
    wanted = {(str(c.get("apiVersion")), str(c.get("kind")), str((c.get("metadata") or {}).get("name"))) for c in children}
    deleted = []
    for kind in CHILD_KINDS:
        for live in await api.list(kind, cluster.namespace, inventory_labels(cluster)):
            md = live.get("metadata") or {}
            name = str(md.get("name"))
            if (kind.api_version, kind.kind, name) in wanted or ownership_problem(live, cluster) is not None:
                continue
            await api.delete(kind, cluster.namespace, name)
            deleted.append(f"{kind.kind} {cluster.namespace}/{name}")
    return deleted
