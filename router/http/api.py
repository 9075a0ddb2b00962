"""Request bodies of `/v1/chat/completions` and `/v1/completions`: pydantic models, parsing and the
normalized `ParsedRequest` the server works with.

Rules:
- JSON types are strict (`"max_tokens": "5"` and `"stream": 1` are errors, not coerced).
- Unknown top-level fields are ignored, as OpenAI-compatible servers do; inside our own extension
  object `evolving` unknown keys are errors (they are typos of ours to catch).
- Anything that would silently change the answer's shape is rejected with `unsupported_parameter`:
  `n` > 1, `best_of` > 1, `echo`, `logprobs`, `suffix`, batched prompts.
- Every error is an `ApiError` (400) whose `param` names the offending field, e.g.
  `messages[2].content` or `stream_options`.

The agent extension (docs/router-http.md): `"evolving": {"branch_id", "parent_branch_id", "tenant",
"branch_finished"}`; the aliases `prompt_cache_key` (branch) and `cache_salt` (tenant) are read too.
Branch ids are checked in branch.py, which also reads the headers.

Boundary: pure parsing; no tokenization, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from evolving_infra.router.http.backend import SamplingParams
from evolving_infra.router.http.errors import ApiError, ErrorCode, invalid
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_STOP_SEQUENCES = 4


class Endpoint(enum.Enum):
    """The API endpoints, also the `endpoint` label of the metrics."""

    CHAT_COMPLETIONS = "chat_completions"
    COMPLETIONS = "completions"
    MODELS = "models"
    BRANCH_FINISH = "branch_finish"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class EvolvingExtension(BaseModel):
    """The `evolving` body object: branch identity and lifecycle of an agent request."""

    model_config = ConfigDict(extra="forbid", strict=True)

    branch_id: str | None = None
    parent_branch_id: str | None = None
    tenant: str | None = None
    branch_finished: bool = False


class _CommonBody(_Body):
    model: str | None = Field(default=None, min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: Any = Field(default=None, validate_default=True)
    user: str | None = None
    prompt_cache_key: str | None = None
    cache_salt: str | None = None
    evolving: EvolvingExtension | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            if len(value) > MAX_STOP_SEQUENCES:
                raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(value)}")
            return tuple(value)
        raise ValueError("must be a string, a list of strings, or null")


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("must be a string, an array of content parts, or null")
        texts: list[str] = []
        for i, part in enumerate(value):
            if not isinstance(part, dict):
                raise ValueError(f"content part {i} must be an object with 'type' and 'text'")
            if part.get("type") != "text":
                raise ValueError(
                    f"content part {i} has type {part.get('type')!r}; only 'text' parts are supported"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError(f"content part {i} needs a string 'text'")
            texts.append(part["text"])
        return "\n".join(texts)


class ChatCompletionBody(_CommonBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    logprobs: bool | None = None


class CompletionBody(_CommonBody):
    prompt: Any = Field()
    echo: bool = False
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> str | tuple[int, ...]:
        return _normalize_prompt(value)


def _normalize_prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, str):
        if not value:
            raise ValueError("must not be empty")
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty string, a token array, or a list with one of these")
    if all(_is_token(t) for t in value):
        return tuple(value)
    if all(isinstance(p, str) for p in value) or all(isinstance(p, list) for p in value):
        if len(value) > 1:
            raise ValueError(
                f"batched prompts are not supported ({len(value)} given); send one prompt per request"
            )
        inner = value[0]
        if isinstance(inner, list) and not (inner and all(_is_token(t) for t in inner)):
            raise ValueError("a list of token arrays must hold one non-empty array of non-negative integers")
        return _normalize_prompt(inner)
    raise ValueError(
        "must be a string, a token array (non-negative integers), or a list with exactly one of these"
    )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class BodyHints:
    """Branch and tenant hints found in the body (resolved together with the headers in branch.py)."""

    branch_id: str | None = None
    parent_branch_id: str | None = None
    tenant: str | None = None
    branch_finished: bool = False
    prompt_cache_key: str | None = None
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated request. Exactly one of `prompt` (completions: text or token ids) and `messages`
    (chat: role/content mappings with text content) is set."""

    endpoint: Endpoint
    model: str | None
    prompt: str | tuple[int, ...] | None
    messages: tuple[dict[str, Any], ...] | None
    tools: tuple[dict[str, Any], ...] | None
    max_tokens: int | None
    stream: bool
    include_usage: bool
    sampling: SamplingParams
    hints: BodyHints


def format_loc(loc: tuple[int | str, ...]) -> str | None:
    """`('messages', 0, 'content')` -> `messages[0].content`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _error_from(exc: ValidationError) -> ApiError:
    err = exc.errors(include_url=False)[0]
    kind, loc = err["type"], tuple(err["loc"])
    if kind == "json_invalid":
        detail = err.get("ctx", {}).get("error", "")
        return invalid(f"request body is not valid JSON ({detail})", None, ErrorCode.INVALID_JSON)
    if not loc:
        return invalid("request body must be a JSON object", None)
    param = format_loc(loc)
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = f"unknown field; allowed: {', '.join(sorted(EvolvingExtension.model_fields))}"
    got = err.get("input")
    if kind != "missing" and isinstance(got, int | float | str | bool) and len(repr(got)) <= 80:
        message += f" (got {got!r})"
    return invalid(f"{param}: {message}", param)


def _unsupported(param: str, message: str) -> ApiError:
    return invalid(f"{param}: {message}", param, ErrorCode.UNSUPPORTED)


def _common(body: _CommonBody) -> tuple[bool, SamplingParams, BodyHints]:
    if body.n != 1:
        raise _unsupported("n", f"only n=1 is supported, got {body.n}; send one request per choice")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options: only allowed when stream is true", "stream_options")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    sampling = SamplingParams(
        temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=tuple(body.stop)
    )
    ext = body.evolving or EvolvingExtension()
    hints = BodyHints(
        branch_id=ext.branch_id,
        parent_branch_id=ext.parent_branch_id,
        tenant=ext.tenant,
        branch_finished=ext.branch_finished,
        prompt_cache_key=body.prompt_cache_key,
        cache_salt=body.cache_salt,
    )
    return include_usage, sampling, hints


def parse_chat(raw: bytes) -> ParsedRequest:
    """Validate a `/v1/chat/completions` body. Raises ApiError (400)."""
    try:
        body = ChatCompletionBody.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _error_from(exc) from None
    if body.logprobs:
        raise _unsupported("logprobs", "log probabilities are not supported")
    if (
        body.max_tokens is not None
        and body.max_completion_tokens is not None
        and body.max_tokens != body.max_completion_tokens
    ):
        raise invalid(
            f"max_completion_tokens: conflicts with max_tokens ({body.max_completion_tokens} != "
            f"{body.max_tokens}); send one of them",
            "max_completion_tokens",
            ErrorCode.CONFLICT,
        )
    for i, message in enumerate(body.messages):
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            raise invalid(
                f"messages[{i}].content: required (only an assistant message with tool_calls may omit it)",
                f"messages[{i}].content",
            )
    include_usage, sampling, hints = _common(body)
    messages = tuple(m.model_dump(exclude_none=True) for m in body.messages)
    return ParsedRequest(
        endpoint=Endpoint.CHAT_COMPLETIONS,
        model=body.model,
        prompt=None,
        messages=messages,
        tools=tuple(body.tools) if body.tools else None,
        max_tokens=body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
        stream=body.stream,
        include_usage=include_usage,
        sampling=sampling,
        hints=hints,
    )


def parse_completion(raw: bytes) -> ParsedRequest:
    """Validate a `/v1/completions` body. Raises ApiError (400)."""
    try:
        body = CompletionBody.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _error_from(exc) from None
    if body.echo:
        raise _unsupported("echo", "echoing the prompt is not supported")
    if body.best_of is not None and body.best_of != 1:
        raise _unsupported("best_of", f"only best_of=1 is supported, got {body.best_of}")
    if body.logprobs is not None:
        raise _unsupported("logprobs", "log probabilities are not supported")
    if body.suffix is not None:
        raise _unsupported("suffix", "suffixes (insertion) are not supported")
    include_usage, sampling, hints = _common(body)
    return ParsedRequest(
        endpoint=Endpoint.COMPLETIONS,
        model=body.model,
        prompt=body.prompt,
        messages=None,
        tools=None,
        max_tokens=body.max_tokens,
        stream=body.stream,
        include_usage=include_usage,
        sampling=sampling,
        hints=hints,
    )
