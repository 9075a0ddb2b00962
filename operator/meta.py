"""Identity of the custom resource and the metadata every child shares: names, labels, owner references.

Constants of the API (group, version, kind, plural) live here so the CRD generator, the builders, the RBAC
rules and (later) the handlers agree. Children are named `<cluster>-<suffix>`; the longest suffix is 13
characters, so cluster names are limited to 50 (a Service name is a 63-character DNS label), and must
start with a letter.

Boundary: pure functions on plain data.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evolving_infra.operator.spec import LabelSelectorRequirement, NodeSelector, SelectorOperator

GROUP = "serving.evolving-infra.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AgentServingCluster"
PLURAL = "agentservingclusters"
SINGULAR = "agentservingcluster"
SHORT_NAMES = ("asc",)
CATEGORIES = ("evolving-infra",)

PART_OF = "evolving-infra"
MANAGED_BY = "evolving-infra-operator"
ANNOTATION_PREFIX = "serving.evolving-infra.io"
"""Prefix of our annotations (config hashes here; kopf's progress storage in the handlers)."""
OPERATOR_FIELD_MANAGER = "evolving-infra-operator"
ROUTER_FIELD_MANAGER = "evolving-infra-router"

MAX_NAME_LENGTH = 50
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE_CEL = f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')"
NAME_RULE_MESSAGE = (
    f"metadata.name must be at most {MAX_NAME_LENGTH} characters of lower-case letters, digits and '-', "
    "starting with a letter (children append up to 13 characters and Service names are DNS labels)"
)


def cluster_name_ok(name: str) -> bool:
    """The Python side of the CRD's name rule."""
    return len(name) <= MAX_NAME_LENGTH and re.fullmatch(NAME_PATTERN, name) is not None


class Component(enum.Enum):
    ROUTER = "router"
    NODE_AGENT = "node-agent"
    SETTINGS = "settings"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class ClusterRef:
    """The identity of one AgentServingCluster object, as owner references need it."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterRef:
        meta = obj.get("metadata") or {}
        missing = [key for key in ("name", "namespace", "uid") if not meta.get(key)]
        if missing:
            raise ValueError(f"AgentServingCluster object lacks metadata.{', metadata.'.join(missing)}")
        return cls(str(meta["name"]), str(meta["namespace"]), str(meta["uid"]))

    def child_name(self, suffix: str) -> str:
        return f"{self.name}-{suffix}"


def selector_labels(cluster: ClusterRef, component: Component) -> dict[str, str]:
    """Labels that select one component's pods of one cluster (stable: never change them on a live object)."""
    return {
        "app.kubernetes.io/name": PART_OF,
        "app.kubernetes.io/instance": cluster.name,
        "app.kubernetes.io/component": component.value,
    }


def labels(cluster: ClusterRef, component: Component) -> dict[str, str]:
    """The full label set of a child object."""
    return {
        **selector_labels(cluster, component),
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/part-of": PART_OF,
    }


def owner_reference(cluster: ClusterRef) -> dict[str, Any]:
    """The owner reference that makes the cluster the controller of a child (garbage-collected with it)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": cluster.name,
        "uid": cluster.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(
    cluster: ClusterRef, component: Component, suffix: str, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """metadata of a namespaced child: name, namespace, labels, owner reference."""
    meta: dict[str, Any] = {
        "name": cluster.child_name(suffix),
        "namespace": cluster.namespace,
        "labels": labels(cluster, component),
        "ownerReferences": [owner_reference(cluster)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def requirement_matches(req: LabelSelectorRequirement, node_labels: Mapping[str, str]) -> bool:
    """Kubernetes semantics: NotIn and DoesNotExist match a node without the key."""
    present = req.key in node_labels
    values = req.values or []
    if req.operator is SelectorOperator.IN:
        return present and node_labels[req.key] in values
    if req.operator is SelectorOperator.NOT_IN:
        return not present or node_labels[req.key] not in values
    if req.operator is SelectorOperator.EXISTS:
        return present
    return not present


def selector_matches(selector: NodeSelector, node_labels: Mapping[str, str]) -> bool:
    """Whether a node with `node_labels` is selected (all labels and all expressions must hold)."""
    for key, value in (selector.match_labels or {}).items():
        if node_labels.get(key) != value:
            return False
    return all(requirement_matches(req, node_labels) for req in selector.match_expressions or ())
