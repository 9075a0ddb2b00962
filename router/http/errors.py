"""Errors of the HTTP front end and the backend, and how each maps to an OpenAI-style error response.

Two families:
- `BackendError` subclasses are what a `RouterBackend` raises (`NoCapacity`, `NodeUnavailable`,
  `DeadlineExceeded`, `InvalidRequest`); each says whether a retry can help and after how long.
- `ApiError` is one HTTP error answer: status, the OpenAI error body fields (`message`, `type`, `param`,
  `code`) and the retry advice sent as `Retry-After` / `retry-after-ms` / `x-should-retry`.

Rule (OpenAI and Anthropic SDKs retry 408, 409, 429 and 5xx by default): a failure that a retry cannot
fix never gets one of those codes without `x-should-retry: false`; overload gets 503 with `Retry-After`.
The full table is in docs/router-http.md.

Boundary: plain values and pure mapping; no HTTP library here.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

DEFAULT_RETRY_AFTER_S = 1.0


class ErrorType(enum.Enum):
    """The `error.type` field of an error body."""

    INVALID_REQUEST = "invalid_request_error"
    SERVER = "server_error"
    OVERLOADED = "overloaded_error"
    TIMEOUT = "timeout_error"
    AUTHENTICATION = "authentication_error"
    RATE_LIMIT = "rate_limit_error"


class ErrorCode(enum.Enum):
    """The `error.code` field: a stable, machine-readable reason."""

    INVALID_JSON = "invalid_json"
    INVALID_VALUE = "invalid_value"
    UNSUPPORTED = "unsupported_parameter"
    CONFLICT = "conflicting_values"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    TOO_LARGE = "request_too_large"
    NO_CAPACITY = "no_capacity"
    NODE_UNAVAILABLE = "node_unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal_error"
    INVALID_API_KEY = "invalid_api_key"
    RATE_LIMITED = "rate_limit_exceeded"
    BODY_TIMEOUT = "request_timeout"


@dataclass(eq=False)
class ApiError(Exception):
    """One error answer. `retry_after_s` is sent only when set; `should_retry` always as a header.

    (Not frozen: the interpreter and test tools set attributes such as `__notes__` on exceptions.)
    """

    status: int
    message: str
    type: ErrorType
    code: ErrorCode
    param: str | None = None
    should_retry: bool = False
    retry_after_s: float | None = None

    def __post_init__(self) -> None:
        if not 400 <= self.status <= 599:
            raise ValueError(f"an error status must be 4xx or 5xx, got {self.status}")
        if self.retry_after_s is not None and self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")

    def __str__(self) -> str:
        return f"{self.status} {self.code.value}: {self.message}"

    def body(self) -> dict[str, Any]:
        """The JSON error body, `{"error": {"message", "type", "param", "code"}}`."""
        return {
            "error": {
                "message": self.message,
                "type": self.type.value,
                "param": self.param,
                "code": self.code.value,
            }
        }

    def headers(self) -> dict[str, str]:
        """Retry advice headers: `x-should-retry` always, `Retry-After` (whole seconds, rounded up,
        at least 1) and `retry-after-ms` when a delay is known."""
        out = {"x-should-retry": "true" if self.should_retry else "false"}
        if self.retry_after_s is not None:
            out["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
            out["retry-after-ms"] = str(max(0, round(self.retry_after_s * 1000)))
        return out


def invalid(message: str, param: str | None, code: ErrorCode = ErrorCode.INVALID_VALUE) -> ApiError:
    """A 400 for bad input: permanent, never retried."""
    return ApiError(400, message, ErrorType.INVALID_REQUEST, code, param=param)


class BackendError(Exception):
    """Base of the errors a `RouterBackend` raises, before or during a stream."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoCapacity(BackendError):
    """No node can take the request now (queues full, no KV room). Temporary: retry after a delay."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NodeUnavailable(BackendError):
    """The node serving the request failed or went away. Temporary: a retry is routed afresh.

    Inference has no side effects, so a retry is always safe before any token reached the client;
    after that the front end ends the stream with an error event instead (the status is already sent).
    """

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(BackendError):
    """The request ran past its deadline. Load-dependent, so a retry may succeed."""


class InvalidRequest(BackendError):
    """The backend rejects the request itself (e.g. prompt longer than the model's context). Permanent."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def deadline_error(timeout_s: float) -> ApiError:
    return ApiError(
        504,
        f"the request did not finish within the router's deadline of {timeout_s:g} s",
        ErrorType.TIMEOUT,
        ErrorCode.DEADLINE_EXCEEDED,
        should_retry=True,
    )


def api_error_for(exc: BackendError, default_retry_after_s: float = DEFAULT_RETRY_AFTER_S) -> ApiError:
    """Map a backend error to its answer (docs/router-http.md, "Errors")."""
    if isinstance(exc, NoCapacity):
        return ApiError(
            503,
            exc.message,
            ErrorType.OVERLOADED,
            ErrorCode.NO_CAPACITY,
            should_retry=True,
            retry_after_s=exc.retry_after_s if exc.retry_after_s is not None else default_retry_after_s,
        )
    if isinstance(exc, NodeUnavailable):
        return ApiError(
            503,
            exc.message,
            ErrorType.SERVER,
            ErrorCode.NODE_UNAVAILABLE,
            should_retry=True,
            retry_after_s=exc.retry_after_s if exc.retry_after_s is not None else default_retry_after_s,
        )
    if isinstance(exc, DeadlineExceeded):
        return ApiError(504, exc.message, ErrorType.TIMEOUT, ErrorCode.DEADLINE_EXCEEDED, should_retry=True)
    if isinstance(exc, InvalidRequest):
        return invalid(exc.message, exc.param)
    return internal_error(f"backend error: {exc.message}")


def internal_error(message: str = "internal error in the router") -> ApiError:
    """A bug or an unexpected failure: 500, and `x-should-retry: false` (a retry would hit it again)."""
    return ApiError(500, message, ErrorType.SERVER, ErrorCode.INTERNAL, should_retry=False)


def shutting_down(retry_after_s: float = DEFAULT_RETRY_AFTER_S) -> ApiError:
    """The router is draining: another replica (or this one, restarted) can take the request."""
    return ApiError(
        503,
        "the router is shutting down; retry the request",
        ErrorType.SERVER,
        ErrorCode.SHUTTING_DOWN,
        should_retry=True,
        retry_after_s=retry_after_s,
    )
