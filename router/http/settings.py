"""The HTTP front end's settings: `HttpFrontFields`, declared once, and `RouterHttpSettings`, what the front end takes.

The fields are declared once, here. The live router's one settings object (`RouterSettings`, which alone reads
`EVOLVING_ROUTER_*` variables and settings files) inherits them and hands the front end its `RouterHttpSettings`
(`RouterSettings.http()`); tests, benchmarks and the fake-backend demo build `RouterHttpSettings` directly in code.
Every field has bounds, and a bad value is an error naming the field.

Boundary: configuration values only; nothing is read at import time, and nothing here reads the environment.
"""

from __future__ import annotations

import enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TokenizerKind(enum.Enum):
    """Which tokenizer turns prompts into token ids."""

    BUILTIN = "builtin"
    """Deterministic, file-free tokenizer for the emulated engine."""
    HUGGINGFACE = "huggingface"
    """A local `tokenizer.json` or model folder (needs the optional `tokenizers`/`transformers`)."""


class HttpFrontFields(BaseModel):
    """The fields of the router's OpenAI-compatible HTTP server (inherited by `RouterSettings`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="Address to bind. Loopback by default; set 0.0.0.0 inside a pod.",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to bind (0: any free port).")
    model_name: str = Field(
        default="evolving-emulated",
        min_length=1,
        max_length=256,
        description="Model used when a request names none; it must be one the backend serves.",
    )
    request_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=86_400,
        description="Deadline of one request from arrival to its last token, seconds (504 when passed).",
    )
    retry_after_s: float = Field(
        default=1.0,
        ge=0,
        le=3600,
        description="Retry-After sent with a 503 when the backend gives no delay of its own, seconds.",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="Largest accepted request body, bytes (413 above).",
    )
    shutdown_grace_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="On shutdown, how long in-flight requests may run on before they are cancelled.",
    )
    tokenizer: TokenizerKind = Field(
        default=TokenizerKind.BUILTIN, description="Which tokenizer to use (builtin or huggingface)."
    )
    tokenizer_path: Path | None = Field(
        default=None,
        description="For the huggingface tokenizer: a tokenizer.json file or a local model folder.",
    )

    api_key_file: Path | None = Field(
        default=None,
        description="File of API keys (one `key` or `name:key` per line, '#' comments); every route but "
        "/healthz and /readyz then needs `Authorization: Bearer <key>`. None: no keys checked.",
    )
    max_concurrent_per_key: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Completions one API key may have in flight (429 above)."
    )
    max_prompt_tokens: int = Field(
        default=1_000_000, ge=1, le=1 << 24, description="Largest prompt in tokens (400 above)."
    )
    max_tokens_cap: int = Field(
        default=32_768, ge=1, le=1 << 24, description="Largest max_tokens a request may ask for (400 above)."
    )
    context_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1 << 26,
        description="Tokens one request may hold in all (prompt + max_tokens; 400 above). None: not checked.",
    )
    body_read_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="Time a client has to send a request's body, seconds (408 after)."
    )
    header_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Time a connection has to send a complete request head, and longest idle keep-alive, seconds.",
    )
    offload_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        le=1 << 30,
        description="Bodies at least this large are parsed and tokenized in worker processes, never on the event loop.",
    )
    tokenize_processes: int = Field(
        default=2,
        ge=0,
        le=64,
        description="Worker processes that parse and tokenize bodies of offload_bytes or more (0: a worker thread).",
    )

    @model_validator(mode="after")
    def _tokenizer_path_matches_kind(self) -> HttpFrontFields:
        if self.tokenizer is TokenizerKind.HUGGINGFACE and self.tokenizer_path is None:
            raise ValueError("tokenizer 'huggingface' needs tokenizer_path (EVOLVING_ROUTER_TOKENIZER_PATH)")
        if self.tokenizer is TokenizerKind.BUILTIN and self.tokenizer_path is not None:
            raise ValueError("tokenizer_path is set but tokenizer is 'builtin'; set tokenizer=huggingface")
        return self


class RouterHttpSettings(HttpFrontFields):
    """What the HTTP server takes: the front end's fields and where its admin server listens."""

    admin_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the admin server (/metrics, /healthz, /readyz); 0: any free port. None: no admin "
        "server. /metrics is never served on the API port.",
    )
