"""Cluster credentials of the node agent's gRPC API: who may call it.

Three modes (`AuthMode`), chosen by what is configured:
- **token**: a shared cluster token read from a file. Callers send `authorization: Bearer <token>` in the
  call's metadata; `TokenInterceptor` compares it in constant time (`hmac.compare_digest`) and answers
  every other call with UNAUTHENTICATED;
- **mTLS**: a certificate, its key and the cluster CA from files; the server requires a client certificate
  signed by that CA (a token may be added on top);
- **insecure**: neither, allowed only when asked for explicitly (`--insecure`, which local runs set).

A node agent with no credentials and without `insecure` refuses to start (`CredentialsError`).

Only the standard health service (`grpc.health.v1.Health`) is open without credentials, so kubelet probes
and load balancers keep working; server reflection is not.

Boundary: reading credential files and checking them on calls; what the calls do is the servicer's.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

AUTH_METADATA = "authorization"
"""Metadata key carrying `Bearer <cluster token>`."""
TOKEN_PREFIX = "Bearer "
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
MAX_CREDENTIAL_FILE_BYTES = 1 << 20
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
"""Methods answered without credentials."""


class CredentialsError(ValueError):
    """Credentials are missing, unreadable or malformed (the message names the file and the fault)."""


class AuthMode(enum.Enum):
    TOKEN = "token"
    TLS = "tls"
    TLS_AND_TOKEN = "tls+token"
    INSECURE = "insecure"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM bytes: this side's certificate chain and key, and the CA that signs every cluster member."""

    cert: bytes
    key: bytes
    ca: bytes


@dataclass(frozen=True, slots=True)
class ClusterCredentials:
    """What one process presents and checks on the cluster's gRPC calls."""

    token: str | None = None
    tls: TlsFiles | None = None
    insecure: bool = False
    server_name: str | None = None
    """With TLS: the name the peers' certificates must carry, checked instead of the address dialled."""

    @property
    def mode(self) -> AuthMode:
        if self.tls is not None:
            return AuthMode.TLS_AND_TOKEN if self.token else AuthMode.TLS
        return AuthMode.TOKEN if self.token else AuthMode.INSECURE

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata to send on every call."""
        return ((AUTH_METADATA, TOKEN_PREFIX + self.token),) if self.token else ()


def _read(path: Path, what: str) -> bytes:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CREDENTIAL_FILE_BYTES + 1)
    except OSError as error:
        raise CredentialsError(f"{what} {str(path)!r}: cannot read it ({error.strerror or error})") from error
    if len(data) > MAX_CREDENTIAL_FILE_BYTES:
        raise CredentialsError(f"{what} {str(path)!r}: larger than {MAX_CREDENTIAL_FILE_BYTES} bytes")
    if not data.strip():
        raise CredentialsError(f"{what} {str(path)!r}: the file is empty")
    return data


def parse_token(data: bytes, where: str) -> str:
    """The token in a token file: one line of printable ASCII without spaces, 16-4096 characters."""
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise CredentialsError(f"{where}: the token must be ASCII") from None
    if "\n" in token or not token.isprintable() or " " in token:
        raise CredentialsError(f"{where}: the token must be one line of printable ASCII without spaces")
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        raise CredentialsError(f"{where}: the token must have {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} characters, has {len(token)}")
    return token


def load_credentials(
    token_file: Path | None = None,
    tls_cert_file: Path | None = None,
    tls_key_file: Path | None = None,
    tls_ca_file: Path | None = None,
    insecure: bool = False,
    tls_server_name: str | None = None,
) -> ClusterCredentials:
    """Read the configured credential files; raises `CredentialsError` when none (and not `insecure`), when
    TLS files are given only in part, or when a file is unreadable or malformed."""
    token = parse_token(_read(token_file, "cluster token file"), f"cluster token file {str(token_file)!r}") if token_file else None
    tls_paths = (tls_cert_file, tls_key_file, tls_ca_file)
    tls: TlsFiles | None = None
    if any(p is not None for p in tls_paths):
        if not all(p is not None for p in tls_paths):
            raise CredentialsError("mutual TLS needs all three of the certificate, key and CA files")
        assert tls_cert_file and tls_key_file and tls_ca_file
        tls = TlsFiles(_read(tls_cert_file, "TLS certificate"), _read(tls_key_file, "TLS key"), _read(tls_ca_file, "TLS CA"))
    if token is None and tls is None and not insecure:
        raise CredentialsError(
            "no cluster credentials: give a cluster token file or mutual TLS files, "
            "or --insecure to serve without authentication (local runs only)"
        )
    return ClusterCredentials(token, tls, insecure and token is None and tls is None, tls_server_name if tls is not None else None)


def token_matches(given: str | bytes | None, token: str) -> bool:
    """Whether `given` is `Bearer <token>`, compared in constant time."""
    if given is None:
        return False
    raw = given.encode("utf-8", "replace") if isinstance(given, str) else given
    return hmac.compare_digest(raw, (TOKEN_PREFIX + token).encode("ascii"))


# --- server side ---------------------------------------------------------------------------------------
def _denied(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(unary, des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(streaming, des, ser)
    return grpc.stream_stream_rpc_method_handler(streaming, des, ser)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call but `OPEN_METHODS` that lacks `authorization: Bearer <token>`."""

    def __init__(self, token: str, on_denied: Callable[[str], None] | None = None) -> None:
        self._token = token
        self._on_denied = on_denied

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if method in OPEN_METHODS or handler is None:
            return handler
        given = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == AUTH_METADATA:
                given = value
                break
        if token_matches(given, self._token):
            return handler
        if self._on_denied is not None:
            self._on_denied(method)
        reason = "no cluster token" if given is None else "wrong cluster token"
        return _denied(handler, f"{reason}: send 'authorization: Bearer <cluster token>' metadata")


def server_interceptors(credentials: ClusterCredentials, on_denied: Callable[[str], None] | None = None) -> list[grpc.aio.ServerInterceptor]:
    return [TokenInterceptor(credentials.token, on_denied)] if credentials.token else []


def server_credentials(credentials: ClusterCredentials) -> grpc.ServerCredentials | None:
    """Mutual TLS server credentials (a client certificate from the cluster CA required), or None."""
    if credentials.tls is None:
        return None
    tls = credentials.tls
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True)


# --- client side (blocking channels: peer reads) --------------------------------------------------------
class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: Sequence[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = [*(base.metadata or ()), *metadata]
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _TokenClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_CallDetails(details, self._metadata), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_CallDetails(details, self._metadata), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(_CallDetails(details, self._metadata), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(_CallDetails(details, self._metadata), request_iterator)


def blocking_channel(address: str, credentials: ClusterCredentials | None, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A blocking channel to a cluster member presenting `credentials` (None: insecure, no token)."""
    if credentials is not None and credentials.tls is not None:
        tls = credentials.tls
        creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert)
        name = (("grpc.ssl_target_name_override", credentials.server_name),) if credentials.server_name else ()
        channel = grpc.secure_channel(address, creds, options=[*options, *name])
    else:
        channel = grpc.insecure_channel(address, options=list(options))
    if credentials is not None and credentials.token:
        channel = grpc.intercept_channel(channel, _TokenClientInterceptor(credentials.metadata()))
    return channel
