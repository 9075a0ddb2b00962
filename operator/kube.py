"""A small async Kubernetes API client for the operator: get, list, create, server-side apply, delete.

Objects are plain dicts (the builders' output and the API server's JSON), addressed by apiVersion and kind
through `KINDS`, the table of every kind the operator touches. Calls run the official client's blocking
HTTP in a worker thread (`asyncio.to_thread`), so the event loop that runs kopf never blocks.

Writes are server-side apply with the operator's field manager (`evolving-infra-operator`): status
entries the router owns (`targetSplit`, `fittedModels`) are never touched, and fields the operator stops
setting are removed. Creation is an explicit POST, so a stale read never resurrects a deleted object.

Boundary: transport only. `load_client()` finds credentials (in-cluster service account, then the
kubeconfig) and says clearly when there are none.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client as kclient
from kubernetes import config as kconfig

from evolving_infra.operator import meta

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"


@dataclass(frozen=True, slots=True)
class Kind:
    """Where a kind lives in the API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource is not None:
                base += f"/{subresource}"
        return base


_KIND_LIST = (
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("v1", "Pod", "pods"),
    Kind("v1", "Event", "events"),
    Kind("v1", "Node", "nodes", namespaced=False),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("apps/v1", "DaemonSet", "daemonsets"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind(meta.API_VERSION, meta.KIND, meta.PLURAL),
)
KINDS: Mapping[tuple[str, str], Kind] = {(k.api_version, k.kind): k for k in _KIND_LIST}
"""Every kind the operator reads or writes, by (apiVersion, kind)."""

CLUSTER = KINDS[(meta.API_VERSION, meta.KIND)]
POD = KINDS[("v1", "Pod")]
NODE = KINDS[("v1", "Node")]
DEPLOYMENT = KINDS[("apps/v1", "Deployment")]


def kind_of(obj: Mapping[str, Any]) -> Kind:
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    try:
        return KINDS[key]
    except KeyError:
        raise ValueError(f"the operator does not manage {key[1]} objects of {key[0]}") from None


class KubeError(Exception):
    """The API server refused a request: HTTP status, reason and the server's message."""

    def __init__(self, status: int, reason: str, message: str, request: str) -> None:
        super().__init__(f"{request}: HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def forbidden(self) -> bool:
        return self.status == 403


class NoCredentials(RuntimeError):
    """Neither an in-cluster service account nor a kubeconfig was found."""


def load_client(kubeconfig: str | None = None, context: str | None = None) -> kclient.ApiClient:
    """An API client from the in-cluster service account, else the kubeconfig (`KUBECONFIG` or ~/.kube/config)."""
    if kubeconfig is None and context is None:
        try:
            kconfig.load_incluster_config()
            return kclient.ApiClient()
        except kconfig.ConfigException:
            pass
    try:
        configuration = kclient.Configuration()
        kconfig.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    except (kconfig.ConfigException, OSError, TypeError) as exc:
        where = kubeconfig or "KUBECONFIG or ~/.kube/config"
        raise NoCredentials(
            f"no Kubernetes credentials: not running in a pod with a service account, and no usable kubeconfig "
            f"at {where} ({exc}); run the operator in the cluster, or point KUBECONFIG at a cluster"
        ) from exc
    return kclient.ApiClient(configuration)


def client_for(host: str, token: str | None = None) -> kclient.ApiClient:
    """An API client for a plain URL (tests and local emulators)."""
    configuration = kclient.Configuration(host=host)
    if token:
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return kclient.ApiClient(configuration)


def selector_string(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class KubeApi:
    """Async dict-in, dict-out calls on an `ApiClient`; `field_manager` names the operator in managedFields."""

    def __init__(self, api_client: kclient.ApiClient, field_manager: str = meta.OPERATOR_FIELD_MANAGER) -> None:
        self._client = api_client
        self.field_manager = field_manager

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        request = f"{method} {path}"
        try:
            response = self._client.call_api(*params)
            response.read()
        except kclient.ApiException as exc:
            reason, message = str(exc.reason or ""), str(exc.body or "")
            try:
                payload = json.loads(exc.body or "{}")
                reason, message = str(payload.get("reason", reason)), str(payload.get("message", message))
            except (ValueError, AttributeError):
                pass
            raise KubeError(int(exc.status or 0), reason, message[:2000], request) from None
        if response.status >= 400:
            raise KubeError(response.status, str(response.reason), response.data.decode(errors="replace")[:2000], request)
        return json.loads(response.data or b"{}")

    async def _request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return await asyncio.to_thread(self._call, *args, **kwargs)

    async def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return await self._request("GET", kind.path(namespace, name))
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    async def list(
        self, kind: Kind, namespace: str | None = None, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """Objects of `kind` (in `namespace`, or everywhere), carrying all of `labels`."""
        query = [("labelSelector", selector_string(labels))] if labels else []
        items = (await self._request("GET", kind.path(namespace), query)).get("items") or []
        # Filter here as well: a server that ignores the selector must not hand us foreign objects.
        wanted = dict(labels or {})
        return [
            item
            for item in items
            if all(((item.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        kind = kind_of(obj)
        namespace = (obj.get("metadata") or {}).get("namespace")
        return await self._request("POST", kind.path(namespace), [("fieldManager", self.field_manager)], dict(obj))

    async def apply(self, obj: Mapping[str, Any], subresource: str | None = None) -> dict[str, Any]:
        """Server-side apply of `obj` (all fields the operator owns there) with the operator's field manager."""
        kind = kind_of(obj)
        md = obj.get("metadata") or {}
        query = [("fieldManager", self.field_manager), ("force", "true")]
        path = kind.path(md.get("namespace"), md["name"], subresource)
        return await self._request("PATCH", path, query, dict(obj), APPLY_CONTENT_TYPE)

    async def delete(self, kind: Kind, namespace: str | None, name: str) -> None:
        try:
            await self._request("DELETE", kind.path(namespace, name))
        except KubeError as exc:
            if not exc.not_found:
                raise
