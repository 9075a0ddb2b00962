"""Applying a cluster's child objects idempotently: create what is missing, re-apply what changed, nothing else.

Each child carries the hash of the object the builders produced (`serving.evolving-infra.io/applied-hash`);
a child whose hash matches is left alone, so a reconcile that finds nothing new makes no write, and
values the API server normalises (quantities, defaults) never cause a write loop. A child that exists but
is not controlled by this cluster is never overwritten: it is reported instead.

Boundary: `desired_with_hash` and `ownership_problem` are pure; `apply_children` calls the API.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolving_infra.operator.kube import KubeApi, kind_of
from evolving_infra.operator.meta import ANNOTATION_PREFIX, ClusterRef

APPLIED_HASH = f"{ANNOTATION_PREFIX}/applied-hash"


def object_hash(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def desired_with_hash(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `obj` annotated with its own hash."""
    out = copy.deepcopy(dict(obj))
    out.setdefault("metadata", {}).setdefault("annotations", {})[APPLIED_HASH] = object_hash(obj)
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


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return len(self.created) + len(self.updated)


async def apply_children(api: KubeApi, cluster: ClusterRef, children: Sequence[Mapping[str, Any]]) -> ApplyResult:
    """Create or re-apply each child whose hash differs from the live object's (in order)."""
    result = ApplyResult()
    for child in children:
        desired = desired_with_hash(child)
        kind = kind_of(desired)
        md = desired["metadata"]
        label = _describe(desired)
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
            result.unchanged.append(label)
            continue
        await api.apply(desired)
        result.updated.append(label)
    return result
