"""A small async Kubernetes API client for the operator: get, list, create, server-side apply, delete.

Objects are plain dicts (the builders' output and the API server's JSON), addressed by apiVersion and kind
through `KINDS`, the table of every kind the operator touches. Calls run the official client's blocking
HTTP in a worker thread (`asyncio.to_thread`), so the event loop that runs kopf never blocks.

Every call has a connect and a read timeout and is retried a bounded number of times (with a doubling
delay) when the server is unreachable, too slow, overloaded (429) or failing (5xx); a creation is retried
only when it cannot have reached the server (connection refused or not established) or was throttled, so
a retry never creates twice. Calls run on the client's own thread pool, so one hung call holds one
thread for at most its timeouts and never the event loop or other clusters' calls.

Writes are server-side apply with the operator's field manager (`evolving-infra-operator`): status
entries the router owns (`targetSplit`, `fittedModels`) are never touched, and fields the operator stops
setting are removed. Creation is an explicit POST, so a stale read never resurrects a deleted object.

Boundary: transport only. `load_client()` finds credentials (in-cluster service account, then the
kubeconfig) and says clearly when there are none.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import urllib3
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
    Kind("v1", "Secret", "secrets"),
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
SECRET = KINDS[("v1", "Secret")]
"""Read only: a cluster's token Secret, for the operator's own calls to its node agents."""


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


class KubeUnavailable(KubeError):
    """No answer: the connection failed or a timeout passed (`sent`: the request may have reached the server)."""

    def __init__(self, reason: str, message: str, request: str, sent: bool) -> None:
        super().__init__(0, reason, message, request)
        self.sent = sent


RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
IDEMPOTENT = frozenset({"GET", "PATCH", "DELETE"})
"""Methods the operator uses idempotently (PATCH is always a server-side apply of a whole intent)."""


@dataclass(frozen=True, slots=True)
class ApiLimits:
    """Timeouts and retries of every API call."""

    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    retries: int = 2
    """Further attempts after the first; 0: never retry."""
    backoff: float = 0.5
    """Delay before the first retry, in seconds; doubles after each."""
    workers: int = 16
    """Threads for calls in flight at once."""

    def __post_init__(self) -> None:
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError(f"API timeouts must be positive, got connect {self.connect_timeout} and read {self.read_timeout}")
        if self.retries < 0 or self.backoff < 0 or self.workers < 1:
            raise ValueError(f"API retries and backoff must be non-negative and workers at least 1, got {self}")


def retryable(method: str, exc: KubeError) -> bool:
    """Whether a failed call may be tried again without doing its work twice."""
    if isinstance(exc, KubeUnavailable):
        return method in IDEMPOTENT or not exc.sent
    if method in IDEMPOTENT:
        return exc.status in RETRIED_STATUSES
    return exc.status == 429


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

    def __init__(
        self, api_client: kclient.ApiClient, field_manager: str = meta.OPERATOR_FIELD_MANAGER, limits: ApiLimits = ApiLimits()
    ) -> None:
        self._client = api_client
        self.field_manager = field_manager
        self.limits = limits
        # Retries are ours (bounded, idempotence-aware): the transport must not retry on its own.
        pool = api_client.rest_client.pool_manager
        pool.connection_pool_kw["retries"] = False
        pool.clear()
        self._executor = ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="kube-api")
        self.failures = 0
        """Calls that failed after their last attempt (for metrics)."""
        self.on_failure: Callable[[], None] | None = None
        """Called once per call that failed after its last attempt (the operator's metrics)."""

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
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
            response = self._client.call_api(*params, _request_timeout=(self.limits.connect_timeout, self.limits.read_timeout))
            response.read()
        except (urllib3.exceptions.ConnectTimeoutError, urllib3.exceptions.NewConnectionError) as exc:
            raise KubeUnavailable("ConnectFailed", str(exc)[:2000], request, sent=False) from None
        except urllib3.exceptions.ReadTimeoutError as exc:
            raise KubeUnavailable("Timeout", f"no answer within {self.limits.read_timeout:g} s ({exc})"[:2000], request, sent=True) from None
        except urllib3.exceptions.HTTPError as exc:
            raise KubeUnavailable("ConnectionFailed", str(exc)[:2000], request, sent=True) from None
        except kclient.ApiException as exc:
            reason, message = str(exc.reason or ""), str(exc.body or "")
            try:
                payload = json.loads(exc.body or "{}")
                reason, message = str(payload.get("reason", reason)), str(payload.get("message", message))
            except (ValueError, AttributeError):
                pass
            raise KubeError(int(exc.status or 0), reason, message[:2000], request) from None
        if response.status >= 400:
            body = response.data.decode(errors="replace")  # type: ignore[attr-defined]  # bytes: read() loaded it
            raise KubeError(response.status, str(response.reason), body[:2000], request)
        return json.loads(response.data or b"{}")

    async def _request(self, method: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """`_call` on the pool, retried per `retryable` up to `limits.retries` times."""
        loop = asyncio.get_running_loop()
        call = functools.partial(self._call, method, *args, **kwargs)
        attempt = 0
        while True:
            try:
                return await loop.run_in_executor(self._executor, call)
            except KubeError as exc:
                if attempt >= self.limits.retries or not retryable(method, exc):
                    if exc.status not in (403, 404, 409):  # answers, not failures
                        self.failures += 1
                        if self.on_failure is not None:
                            self.on_failure()
                    raise
            await asyncio.sleep(self.limits.backoff * 2**attempt)
            attempt += 1

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
