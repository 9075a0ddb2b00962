"""One completion exchange: validated request in, backend stream out, as JSON or server-sent events.

Order of events for a request: body read (408 past `body_read_timeout_s`) -> parse (400s) -> model
check (404) -> branch resolution (400s) -> tokenization (400s) -> length limits (400 naming the limit:
prompt tokens, `max_tokens` cap, prompt + `max_tokens` within the context) -> `backend.complete` under the
request's deadline. Bodies of `offload_bytes` or more are parsed and tokenized in worker processes
(offload.py), so a huge prompt never stalls the event loop (health checks, other streams). The HTTP status is committed only
when the backend yields its first chunk, so every failure before that (no capacity, node down, deadline,
rejected by the backend) still gets its own status code and retry headers. The serving nodes the backend
names by then go into the headers `x-evolving-prefill-node` / `x-evolving-decode-node`; the last ones it
names go into the usage's extension field `evolving`. A failure after that ends the
stream with an `{"error": ...}` event and `data: [DONE]`.

The backend's iterator is always closed (`aclose`) when the exchange ends early: client gone (the
handler task is cancelled, or a write fails), deadline passed, or error. Branches marked finished, and
ephemeral ones, are finished through the backend after the exchange, whatever its outcome.

Boundary: aiohttp request/response handling for the two completion endpoints.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from evolving_infra.router.http.api import Endpoint, ParsedRequest, parse_chat, parse_completion
from evolving_infra.router.http.backend import CompletionRequest, FinishReason, ServingNodes, TokenChunk
from evolving_infra.router.http.branch import BRANCH_HEADER, SOURCE_HEADER, ResolvedBranch, resolve_branch
from evolving_infra.router.http.errors import (
    ApiError,
    BackendError,
    ErrorCode,
    ErrorType,
    api_error_for,
    deadline_error,
    internal_error,
    invalid,
)
from evolving_infra.router.http.metrics import CLIENT_CLOSED, FinishTrigger
from evolving_infra.router.http.responses import DONE, ResponseHead, serving_headers, sse, usage
from evolving_infra.router.http.state import AppState, RequestContext, error_response, json_response
from evolving_infra.router.http.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger(__name__)
_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def trace_context(headers: Any) -> tuple[str | None, str | None]:
    """W3C `traceparent` and `tracestate` to pass on; an invalid traceparent is dropped (with its state)."""
    parent = headers.get("traceparent")
    if parent is None or not _TRACEPARENT.fullmatch(parent.strip().lower()):
        return None, None
    return parent.strip().lower(), headers.get("tracestate")


def prompt_ids(tok: Tokenizer, parsed: ParsedRequest) -> tuple[int, ...]:
    """The prompt's token ids (400 for ids outside the vocabulary or an empty prompt)."""
    if parsed.messages is not None:
        ids = tok.apply_chat_template(parsed.messages, parsed.tools)
        param = "messages"
    elif isinstance(parsed.prompt, tuple):
        vocab = tok.vocab_size
        for i, t in enumerate(parsed.prompt):
            if t >= vocab:
                raise invalid(
                    f"prompt[{i}]: token id {t} is outside the tokenizer's vocabulary [0, {vocab})", "prompt"
                )
        return parsed.prompt
    else:
        ids = tok.encode(str(parsed.prompt))
        param = "prompt"
    if not ids:
        raise invalid(f"{param}: the prompt has no tokens", param)
    return tuple(ids)


def check_lengths(
    max_prompt: int, cap: int, context: int | None, prompt: int, max_tokens: int | None, param: str = "messages"
) -> None:
    """400 naming the limit when the prompt or `max_tokens` can never be served (`param`: the prompt's field)."""
    if prompt > max_prompt:
        raise invalid(f"the prompt has {prompt} tokens; the limit is {max_prompt}", param)
    if max_tokens is not None and max_tokens > cap:
        raise invalid(f"max_tokens: {max_tokens} is above the limit of {cap}", "max_tokens")
    if context is not None:
        total = prompt + (max_tokens or 0)
        if total > context:
            raise invalid(
                f"the prompt ({prompt} tokens) and max_tokens ({max_tokens or 0}) need {total} tokens; "
                f"the limit is {context}",
                "max_tokens" if max_tokens else param,
            )


def _check_model(state: AppState, parsed: ParsedRequest) -> str:
    model = parsed.model or state.settings.model_name
    served = [m.id for m in state.backend.models()]
    if not served:
        raise ApiError(
            503,
            "no model is served yet; retry shortly",
            ErrorType.SERVER,
            ErrorCode.NO_CAPACITY,
            should_retry=True,
            retry_after_s=state.settings.retry_after_s,
        )
    if model not in served:
        raise ApiError(
            404,
            f"model: {model!r} is not served here; available: {', '.join(served)}",
            ErrorType.INVALID_REQUEST,
            ErrorCode.MODEL_NOT_FOUND,
            param="model",
        )
    return model


async def handle_completion(
    request: web.Request, state: AppState, endpoint: Endpoint, context: RequestContext
) -> tuple[web.StreamResponse, int]:
    """Answer one completion request; returns the response and the status to count in metrics."""
    loop = asyncio.get_running_loop()
    request_id, start = context.request_id, context.arrived_at
    deadline = start + state.settings.request_timeout_s
    settings = state.settings
    try:
        async with asyncio.timeout(settings.body_read_timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise ApiError(
            408, f"the request body was not received within {settings.body_read_timeout_s:g} s",
            ErrorType.INVALID_REQUEST, ErrorCode.BODY_TIMEOUT,
        ) from None  # fmt: skip
    tokenized: tuple[int, ...] | ApiError | None = None
    if len(raw) >= settings.offload_bytes and state.offloader is not None:
        parsed, tokenized = await state.offloader.run(endpoint, raw)
    else:
        parsed = parse_chat(raw) if endpoint is Endpoint.CHAT_COMPLETIONS else parse_completion(raw)
    model = _check_model(state, parsed)
    resolved = resolve_branch(request.headers, parsed.hints, request_id)
    state.metrics.branch_resolved(resolved.source)
    echo = {BRANCH_HEADER: resolved.branch.branch_id, SOURCE_HEADER: resolved.source.value}
    handed_over = False
    try:
        if isinstance(tokenized, ApiError):
            raise tokenized
        prompt = tokenized if tokenized is not None else prompt_ids(state.tokenizer, parsed)
        check_lengths(settings.max_prompt_tokens, settings.max_tokens_cap, settings.context_tokens, len(prompt), parsed.max_tokens,
                      "messages" if parsed.messages is not None else "prompt")  # fmt: skip
        traceparent, tracestate = trace_context(request.headers)
        backend_request = CompletionRequest(
            request_id=request_id,
            model=model,
            prompt_token_ids=prompt,
            branch=resolved.branch,
            parent=resolved.parent,
            ephemeral=resolved.ephemeral,
            finish_after=resolved.finish_after,
            max_tokens=parsed.max_tokens,
            sampling=parsed.sampling,
            timeout_s=max(0.0, deadline - loop.time()),
            traceparent=traceparent,
            tracestate=tracestate,
        )
        head = ResponseHead(endpoint, request_id, int(state.clock()), model)
        exchange = _Exchange(request, state, parsed, backend_request, head, echo, start, deadline)
        handed_over = True
        return await exchange.run()
    except ApiError as exc:
        return error_response(exc, echo), exc.status
    finally:
        _schedule_finish(state, resolved, handed_over)


def _schedule_finish(state: AppState, resolved: ResolvedBranch, handed_over: bool) -> None:
    """Ephemeral branches end with their request (if the backend saw it); a branch marked finished ends
    whatever became of its last request."""
    if resolved.ephemeral:
        if handed_over:
            state.spawn_finish(resolved.branch, FinishTrigger.EPHEMERAL)
    elif resolved.finish_after:
        state.spawn_finish(resolved.branch, FinishTrigger.FLAG)


async def _aclose(iterator: AsyncIterator[TokenChunk]) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


@dataclass
class _Exchange:
    request: web.Request
    state: AppState
    parsed: ParsedRequest
    backend_request: CompletionRequest
    head: ResponseHead
    echo: dict[str, str]
    start: float
    deadline: float
    response: web.StreamResponse | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: FinishReason | None = None
    text: list[str] = field(default_factory=list)
    last_token_at: float | None = None
    accepted: bool = False
    serving: ServingNodes | None = None

    @property
    def endpoint(self) -> Endpoint:
        return self.head.endpoint

    async def run(self) -> tuple[web.StreamResponse, int]:
        iterator: AsyncIterator[TokenChunk] | None = None
        try:
            try:
                async with asyncio.timeout_at(self.deadline):
                    iterator = self.state.backend.complete(self.backend_request)
                    await self._pump(iterator)
            except TimeoutError:
                raise deadline_error(self.state.settings.request_timeout_s) from None
            except BackendError as exc:
                raise api_error_for(exc, self.state.settings.retry_after_s) from None
            except (ApiError, ConnectionResetError):
                raise
            except Exception:
                log.exception("backend stream of request %s failed", self.backend_request.request_id)
                raise internal_error() from None
        except ApiError as exc:
            if self.response is None:
                return error_response(exc, self.echo), exc.status
            await self._write_error(exc)
            return self.response, exc.status
        except ConnectionResetError:
            return self.response or web.Response(status=CLIENT_CLOSED), CLIENT_CLOSED
        finally:
            if iterator is not None:
                await _aclose(iterator)
            if self.accepted:
                self.state.metrics.prompt(
                    self.endpoint, len(self.backend_request.prompt_token_ids), self.cached_tokens
                )
        return await self._finish()

    async def _pump(self, iterator: AsyncIterator[TokenChunk]) -> None:
        loop = asyncio.get_running_loop()
        detok = IncrementalDetokenizer(self.state.tokenizer)
        async for chunk in iterator:
            if self.finish_reason is not None:
                continue  # the stream is over; let the backend's generator run to its end
            if chunk.serving is not None:
                self.serving = chunk.serving
            if not self.accepted:
                self.accepted = True
                if self.parsed.stream:
                    await self._open_stream()
            if chunk.cached_tokens is not None:
                self.cached_tokens = chunk.cached_tokens
            if chunk.token_ids:
                now = loop.time()
                if self.last_token_at is None:
                    self.state.metrics.first_token(self.endpoint, now - self.start)
                    gap = None
                else:
                    gap = now - self.last_token_at
                self.last_token_at = now
                self.output_tokens += len(chunk.token_ids)
                self.state.metrics.tokens(self.endpoint, len(chunk.token_ids), gap)
                await self._emit(detok.push(chunk.token_ids))
            if chunk.finish_reason is not None:
                self.finish_reason = chunk.finish_reason
        await self._emit(detok.flush())

    async def _open_stream(self) -> None:
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **self.echo,
                **serving_headers(self.serving),
            },
        )
        await response.prepare(self.request)
        self.response = response
        if self.endpoint is Endpoint.CHAT_COMPLETIONS:
            await response.write(sse(self.head.chunk(role=True, include_usage=self.parsed.include_usage)))

    async def _emit(self, text: str) -> None:
        if not text:
            return
        if self.response is None:
            self.text.append(text)
            return
        await self.response.write(sse(self.head.chunk(text=text, include_usage=self.parsed.include_usage)))

    def _usage(self) -> dict[str, Any]:
        return usage(len(self.backend_request.prompt_token_ids), self.output_tokens, self.cached_tokens, self.serving)

    def _reason(self) -> FinishReason:
        if self.finish_reason is not None:
            return self.finish_reason
        limit = self.backend_request.max_tokens
        return FinishReason.LENGTH if limit is not None and self.output_tokens >= limit else FinishReason.STOP

    async def _finish(self) -> tuple[web.StreamResponse, int]:
        if not self.parsed.stream:
            body = self.head.full("".join(self.text), self._reason(), self._usage())
            return json_response(body, headers={**self.echo, **serving_headers(self.serving)}), 200
        if self.response is None:
            await self._open_stream()
        assert self.response is not None
        try:
            include_usage = self.parsed.include_usage
            await self.response.write(
                sse(self.head.chunk(finish_reason=self._reason(), include_usage=include_usage))
            )
            if include_usage:
                await self.response.write(sse(self.head.usage_chunk(self._usage())))
            await self.response.write(DONE)
            await self.response.write_eof()
        except ConnectionResetError:
            return self.response, CLIENT_CLOSED
        return self.response, 200

    async def _write_error(self, exc: ApiError) -> None:
        assert self.response is not None
        try:
            await self.response.write(sse(exc.body()))
            await self.response.write(DONE)
            await self.response.write_eof()
        except ConnectionResetError:
            pass
