"""A Kubernetes API emulator for operator tests: KMock's emulator plus what a real API server adds.

On top of `kmock.KubernetesEmulator` this supplies:
- resource discovery from the CRD YAML and a table of core kinds (KMock does not read CRDs);
- metadata stamping: a name from `generateName`, uid, creationTimestamp, generation and resourceVersion on create; a new
  resourceVersion on every patch and a generation bump when `spec` changes;
- status/spec separation for the CRD (status only through `/status`, never through the object);
- list responses with `kind: <Kind>List` and `apiVersion`, filtered by `labelSelector`;
- a `meta.k8s.io/v1` Table (for `kubectl get`) built from the CRD's `additionalPrinterColumns`;
- the right groupVersion (`v1`) in core discovery;
- `collect_garbage()`: deletes objects whose controlling owner is gone (a real cluster's GC);
- RBAC refusals and stalls on demand: `refuse(predicate)` answers matching requests with 403 Forbidden
  (as a namespaced Role would), `stall(predicate)` holds matching requests until `release()` (a hung
  API server or a dead connection).

No schema validation, defaulting, CEL, 409 on stale resourceVersions or server-side apply merging
(an apply is merged like a JSON merge patch).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import kmock
import yaml
from kmock._internal import enums, rendering
from kmock._internal.k8s import KubernetesError

CORE_KINDS = (
    ("v1", "configmaps", "ConfigMap", True),
    ("v1", "services", "Service", True),
    ("v1", "serviceaccounts", "ServiceAccount", True),
    ("v1", "pods", "Pod", True),
    ("v1", "secrets", "Secret", True),
    ("v1", "events", "Event", True),
    ("v1", "nodes", "Node", False),
    ("v1", "namespaces", "Namespace", False),
    ("events.k8s.io/v1", "events", "Event", True),
    ("apps/v1", "deployments", "Deployment", True),
    ("apps/v1", "daemonsets", "DaemonSet", True),
    ("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    ("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True),
)
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _age(stamp: str | None) -> str:
    if not stamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def jsonpath(obj: Any, path: str) -> Any:
    """The value at a printer-column path: `.a.b` and `.a[?(@.k=="v")].c` forms."""
    value = obj
    for part in re.findall(r'\.([A-Za-z0-9_]+)|\[\?\(@\.([A-Za-z0-9_]+)=="([^"]*)"\)\]', path):
        key, fkey, fval = part
        if key:
            value = value.get(key) if isinstance(value, Mapping) else None
        else:
            value = next((v for v in value or () if isinstance(v, Mapping) and v.get(fkey) == fval), None)
        if value is None:
            return None
    return value


def _matches_selector(labels: Mapping[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif labels.get(term) is None:
            return False
    return True


@attrs.frozen
class Forbidden(KubernetesError):
    """What the API server answers a request RBAC does not allow."""

    status: int = 403
    reason: str = "Forbidden"
    message: str = "forbidden by the emulator's refusal rules (RBAC)"


Predicate = Callable[[rendering.Request], bool]


class Emulator(kmock.KubernetesEmulator):
    """See the module docstring; `load_crd(path)` declares a custom resource."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._counter = itertools.count(1)
        self._columns: dict[Any, list[dict[str, Any]]] = {}
        self._status_subresource: set[Any] = set()
        self._refusals: list[Predicate] = []
        self._stalls: list[Predicate] = []
        self._released: asyncio.Event | None = None
        self.stalled: list[str] = []
        for api_version, plural, kind, namespaced in CORE_KINDS:
            self.resources[f"{api_version}/{plural}"] = kmock.ResourceInfo(
                kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=VERBS
            )

    def load_crd(self, path: Path) -> None:
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            key = kmock.resource(spec["group"], version["name"], names["plural"])
            subresources = set((version.get("subresources") or {}).keys())
            self.resources[key] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular"),
                shortnames=names.get("shortNames") or (),
                categories=names.get("categories") or (),
                namespaced=spec["scope"] == "Namespaced",
                verbs=VERBS,
                subresources=subresources,
            )
            self._columns[key] = list(version.get("additionalPrinterColumns") or ())
            if "status" in subresources:
                self._status_subresource.add(key)

    # --- what a real API server does to writes ---------------------------------------------------
    def _stamp(self, request: rendering.Request) -> None:
        data = request.data
        if not isinstance(data, dict) or request.resource is None:
            return
        resource = self._known(request.resource)
        if request.action == enums.action.CREATE:
            md = data.setdefault("metadata", {})
            if not md.get("name") and md.get("generateName"):
                md["name"] = f"{md['generateName']}{next(self._counter):05d}"
            md.setdefault("uid", str(uuid.UUID(int=next(self._counter))))
            md.setdefault("creationTimestamp", _now())
            md["generation"] = 1
            md["resourceVersion"] = str(next(self._counter))
            if request.namespace and not md.get("namespace"):
                md["namespace"] = request.namespace
            if resource in self._status_subresource:
                data.pop("status", None)
        elif request.action == enums.action.UPDATE and request.name is not None:
            key = (resource, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                return
            live = self.objects[key].raw
            if resource in self._status_subresource:
                if request.subresource == "status":
                    kept = {"status": data.get("status")} if "status" in data else {}
                else:
                    kept = {k: v for k, v in data.items() if k != "status"}
                data.clear()
                data.update(kept)
            md = data.get("metadata")
            if not isinstance(md, dict):
                md = data["metadata"] = {}
            md["resourceVersion"] = str(next(self._counter))
            if "spec" in data and data["spec"] != live.get("spec"):
                md["generation"] = int((live.get("metadata") or {}).get("generation") or 1) + 1

    def _known(self, resource: Any) -> Any:
        for known in self.resources:
            if known == resource:
                return known
        return resource

    def refuse(self, predicate: Predicate) -> None:
        """Answer requests matching `predicate` with 403 Forbidden."""
        self._refusals.append(predicate)

    def stall(self, predicate: Predicate) -> None:
        """Hold requests matching `predicate` without answering until `release()`."""
        if self._released is not None and self._released.is_set():
            self._released = None  # a new round of stalls after an earlier release
        self._stalls.append(predicate)

    def release(self) -> None:
        """Let stalled requests go on (they are answered normally) and stop stalling."""
        self._stalls.clear()
        if self._released is not None:
            self._released.set()

    async def _handle(self, request: rendering.Request) -> Any:
        if any(refuse(request) for refuse in self._refusals):
            return await self._render_error(Forbidden())
        if any(stall(request) for stall in self._stalls):
            self.stalled.append(f"{request.method.value} {request.url.path}")
            if self._released is None:
                self._released = asyncio.Event()
            await self._released.wait()
        self._stamp(request)
        return await super()._handle(request)

    async def _serve_version(self, request: rendering.Request) -> Any:
        payload = await super()._serve_version(request)
        if request.resource is not None and request.resource.group == "":
            payload["groupVersion"] = request.resource.version
        return payload

    # --- reads ----------------------------------------------------------------------------------
    def _wants_table(self, request: rendering.Request) -> bool:
        return "as=Table" in (request.headers.get("Accept") or "")

    async def _serve_list(self, request: rendering.Request) -> Any:
        payload = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        items = [
            item
            for item in payload["items"]
            if not selector or _matches_selector((item.get("metadata") or {}).get("labels") or {}, selector)
        ]
        resource = self._known(request.resource)
        info = self.resources[resource]
        api_version = f"{resource.group}/{resource.version}" if resource.group else resource.version
        if self._wants_table(request):
            return self.table(resource, items)
        return {"apiVersion": api_version, "kind": f"{info.kind}List", "metadata": payload["metadata"], "items": items}

    async def _serve_fetch(self, request: rendering.Request) -> Any:
        payload = await super()._serve_fetch(request)
        if self._wants_table(request):
            return self.table(self._known(request.resource), [payload])
        return payload

    def table(self, resource: Any, items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """A meta.k8s.io/v1 Table with the resource's printer columns (Name and Age otherwise)."""
        columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "jsonPath": ".metadata.name"}]
        extra = self._columns.get(resource) or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        columns += [{"priority": 0, "description": "", "format": "", **c} for c in extra]
        rows = []
        for item in items:
            cells = []
            for column in columns:
                value = jsonpath(item, column["jsonPath"])
                cells.append(_age(value) if column["type"] == "date" else value)
            md = item.get("metadata") or {}
            rows.append(
                {"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": md}}
            )
        definitions = [{k: v for k, v in c.items() if k != "jsonPath"} for c in columns]
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "columnDefinitions": definitions, "rows": rows}

    # --- helpers for tests ------------------------------------------------------------------------
    def live(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        for known, ns, nm in list(self.objects):
            if known == key[0] and ns == namespace and nm == name:
                obj = self.objects[known, ns, nm]
                return None if obj.deleted else json.loads(json.dumps(obj.raw))
        return None

    def alive(self) -> list[tuple[Any, str | None, str]]:
        return [key for key in list(self.objects) if not self.objects[key].deleted]

    def collect_garbage(self) -> list[str]:
        """Delete (without events) every object whose controlling owner no longer exists; their names."""
        uids = {(self.objects[k].raw.get("metadata") or {}).get("uid") for k in self.alive()}
        removed = []
        for key in self.alive():
            refs = (self.objects[key].raw.get("metadata") or {}).get("ownerReferences") or ()
            owners = [r for r in refs if r.get("controller")]
            if owners and all(r.get("uid") not in uids for r in owners):
                self.objects[key].delete()
                removed.append(f"{key[0].plural}/{key[2]}")
        return removed

    def writes(self) -> list[rendering.Request]:
        """Every request that would change an object (POST, PUT, PATCH, DELETE), in order."""
        return [r for r in self if str(r.method.value) in WRITES]
