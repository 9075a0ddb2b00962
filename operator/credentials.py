"""The operator's own credentials toward a cluster's node agents, read from the cluster's Secrets.

The router and the node agents read the cluster token (and the mutual TLS files) from the Secrets their pods
mount (`rendered.credential_mounts`); the operator calls the same node agents (`SwitchPhase`, `GetState`), so
it reads the same Secrets through the API and presents what they hold (`agents.GrpcNodeAgentClient.
use_credentials`). A missing Secret, a missing key or a malformed token is a `CredentialsUnavailable` naming
the Secret and the key: temporary (the Secret may be created, or cert-manager may issue it, at any time).

Boundary: reading and checking Secrets; no gRPC.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Protocol

from evolving_infra.node_agent.api.auth import ClusterCredentials, CredentialsError, TlsFiles, parse_token
from evolving_infra.operator import kube
from evolving_infra.operator.meta import ClusterRef
from evolving_infra.operator.rendered import TOKEN_KEY, CredentialMount, credential_mounts, node_agent_service_host
from evolving_infra.operator.spec import AgentServingClusterSpec

MAX_SECRET_VALUE_BYTES = 1 << 20


class CredentialsUnavailable(Exception):
    """A credential Secret of the cluster is missing or unusable (the message names it and the key)."""


class SecretReader(Protocol):
    async def get(self, kind: kube.Kind, namespace: str | None, name: str) -> dict[str, Any] | None: ...


def _value(secret: Mapping[str, Any], mount: CredentialMount, key: str, namespace: str) -> bytes:
    where = f"Secret {namespace}/{mount.secret}"
    data = secret.get("data") or {}
    if not isinstance(data, Mapping) or key not in data:
        raise CredentialsUnavailable(f"{where} has no key {key!r}")
    encoded = data[key]
    if not isinstance(encoded, str) or len(encoded) > MAX_SECRET_VALUE_BYTES * 4 // 3 + 4:
        raise CredentialsUnavailable(f"{where}: key {key!r} is not a base64 value of at most {MAX_SECRET_VALUE_BYTES} bytes")
    try:
        value = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise CredentialsUnavailable(f"{where}: key {key!r} is not valid base64") from None
    if not value.strip():
        raise CredentialsUnavailable(f"{where}: key {key!r} is empty")
    return value


async def _secret(api: SecretReader, namespace: str, mount: CredentialMount) -> Mapping[str, Any]:
    secret = await api.get(kube.SECRET, namespace, mount.secret)
    if secret is None:
        raise CredentialsUnavailable(f"Secret {namespace}/{mount.secret} does not exist")
    return secret


async def cluster_credentials(api: SecretReader, cluster: ClusterRef, spec: AgentServingClusterSpec) -> ClusterCredentials | None:
    """What the operator presents to this cluster's node agents: None when the cluster is insecure."""
    mounts = credential_mounts(cluster, spec)
    if not mounts:
        return None
    ns = cluster.namespace
    token_mount = mounts["token"]
    raw = _value(await _secret(api, ns, token_mount), token_mount, TOKEN_KEY, ns)
    try:
        token = parse_token(raw, f"Secret {ns}/{token_mount.secret} key {TOKEN_KEY!r}")
    except CredentialsError as error:
        raise CredentialsUnavailable(str(error)) from None
    tls = None
    tls_mount = mounts.get("tls")
    if tls_mount is not None:
        secret = await _secret(api, ns, tls_mount)
        cert, key, ca = (_value(secret, tls_mount, k, ns) for k in tls_mount.keys)
        tls = TlsFiles(cert, key, ca)
    return ClusterCredentials(token, tls, server_name=node_agent_service_host(cluster) if tls is not None else None)
