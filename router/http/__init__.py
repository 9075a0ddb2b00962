"""The router's OpenAI-compatible HTTP front end (the router's I/O layer).

Boundary: HTTP parsing, validation, branch resolution, tokenization, streaming and metrics. It decides
nothing about placement: every admitted request goes to a `RouterBackend` (`backend.py`), the narrow
async interface the routing core implements. `FakeBackend` (`fake.py`) stands in for it in tests and
demos. See docs/router-http.md for the endpoints, headers and error mapping.
"""

from evolving_infra.router.http.backend import (
    BranchRef,
    CompletionRequest,
    FinishOutcome,
    FinishReason,
    ModelCard,
    Readiness,
    RouterBackend,
    SamplingParams,
    ServingNodes,
    TokenChunk,
)
from evolving_infra.router.http.errors import (
    ApiError,
    BackendError,
    DeadlineExceeded,
    InvalidRequest,
    NoCapacity,
    NodeUnavailable,
)
from evolving_infra.router.http.fake import FakeBackend
from evolving_infra.router.http.server import RunningServer, create_admin_app, create_app, start_server
from evolving_infra.router.http.settings import RouterHttpSettings, TokenizerKind

__all__ = [
    "ApiError",
    "BackendError",
    "BranchRef",
    "CompletionRequest",
    "DeadlineExceeded",
    "FakeBackend",
    "FinishOutcome",
    "FinishReason",
    "InvalidRequest",
    "ModelCard",
    "NoCapacity",
    "NodeUnavailable",
    "Readiness",
    "RouterBackend",
    "RouterHttpSettings",
    "RunningServer",
    "SamplingParams",
    "ServingNodes",
    "TokenChunk",
    "TokenizerKind",
    "create_admin_app",
    "create_app",
    "start_server",
]
