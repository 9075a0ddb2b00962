"""The subset of SGLang's worker HTTP API that the SGLang Model Gateway (`smg` 1.13) uses, served in front of
an engine of ours, so that the real gateway can route to our workers.

What `smg launch --worker-urls ...` calls on a worker (observed on smg 1.13.0, shapes from SGLang's
`http_server.py` and smg's worker types): `GET /health` (readiness and periodic health), `GET /v1/models`
(the served model id), `GET /version`, `GET /server_info` (or `/get_server_info`: server arguments such as
`page_size`, `disaggregation_mode`, `disaggregation_bootstrap_port`), `GET /model_info` (or `/get_model_info`),
`GET /loads` and `GET /v1/loads` (load snapshots, `WorkerLoadResponse`), `GET /metrics` (Prometheus text),
then `POST /generate` (SGLang's native generation, streamed as server-sent events with `stream: true`) and
`POST /v1/completions` (OpenAI completions, streamed likewise).

Tokens: our engines work on token counts and page hashes, not text. `input_ids` are used as given; `text`
(or an OpenAI `prompt` string) is split on whitespace and each word becomes one token id (a stable hash), so
two prompts share a token prefix exactly when they share a word prefix. Generated tokens are placeholders
(`output_ids` counting up, text " t0 t1 ...") since the emulated engine produces no real tokens.

PD mode (`disaggregation_mode` prefill/decode): the gateway sends one request to a prefill worker and to a
decode worker with the same `bootstrap_room`, and the prefill worker's `bootstrap_host` and
`disaggregation_bootstrap_port`; the backend receives them in `GenerateJob.bootstrap` and decides how the
decode side finds the prompt's KV (see docs/peers.md).

Boundary: HTTP shapes and their validation; the work is a `SglangBackend`'s. Bad input gets a 400 with an
OpenAI-style error body naming the field.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import xxhash
from aiohttp import web

from evolving_infra.core.pages import token_page_hashes

SGLANG_API_VERSION = "0.5.23"
"""The SGLang release whose worker API these shapes follow."""

MAX_NEW_TOKENS_DEFAULT = 128
MAX_PROMPT_TOKENS = 4_000_000
MAX_NEW_TOKENS_LIMIT = 1_000_000


class SglangRole(enum.Enum):
    """SGLang's `--disaggregation-mode`."""

    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class RequestError(ValueError):
    """A request body breaks the API (answered 400)."""


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """Where a PD pair meets: the prefill worker's host and bootstrap port, and the pair's room id."""

    host: str
    port: int
    room: int


@dataclass(frozen=True, slots=True)
class GenerateJob:
    rid: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    stream: bool
    bootstrap: Bootstrap | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """Progress of one job: tokens generated so far; `finished` on the last step."""

    completion_tokens: int
    cached_tokens: int = 0
    finished: bool = False


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    running: int
    waiting: int
    used_tokens: int
    max_total_tokens: int
    gen_throughput: float = 0.0
    cache_hit_rate: float = 0.0


class SglangBackend(Protocol):
    """The engine behind the API."""

    role: SglangRole

    def load(self) -> LoadSnapshot: ...

    def run(self, job: GenerateJob) -> AsyncIterator[Step]:
        """Steps of `job` (at least one, the last `finished`); raises RequestError for a job it refuses."""
        ...


@dataclass(frozen=True)
class ServerIdentity:
    """What the worker reports about itself."""

    model: str = "evolving-infra/emulated"
    page_size: int = 64
    context_length: int = 262_144
    max_running_requests: int = 1024
    chunked_prefill_size: int = 8192
    bootstrap_port: int | None = None
    host: str = "127.0.0.1"
    port: int = 0
    tp_size: int = 4
    extra: Mapping[str, Any] = field(default_factory=dict)


def word_tokens(text: str) -> tuple[int, ...]:
    """Token ids of `text`: one per whitespace-separated word, a stable 31-bit hash of the word."""
    return tuple(xxhash.xxh32_intdigest(w.encode("utf-8")) & 0x7FFFFFFF for w in text.split())


# ---- request parsing (pure) ----------------------------------------------------------------------------


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise RequestError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def _ids(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise RequestError(f"{name} must be a list of integers")
    if len(value) > MAX_PROMPT_TOKENS:
        raise RequestError(f"{name} has {len(value)} tokens; at most {MAX_PROMPT_TOKENS}")
    return tuple(value)


def _bootstrap(body: Mapping[str, Any]) -> Bootstrap | None:
    host, port, room = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
    if host is None and port is None and room is None:
        return None
    if not isinstance(host, str) or not host:
        raise RequestError(f"bootstrap_host must be a non-empty string, got {host!r}")
    return Bootstrap(host, _int(port, "bootstrap_port", 1, 65535), _int(room, "bootstrap_room", 0, 2**64 - 1))


def parse_generate(body: Any) -> GenerateJob:
    """A `/generate` body (one prompt: `text` or `input_ids`; batches are not supported)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError("give exactly one of text or input_ids")
    if text is not None:
        if not isinstance(text, str):
            raise RequestError("text must be one string (batched requests are not supported)")
        tokens = word_tokens(text)
    else:
        tokens = _ids(ids, "input_ids")
    if not tokens:
        raise RequestError("the prompt is empty")
    params = body.get("sampling_params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise RequestError("sampling_params must be an object")
    max_new = _int(params.get("max_new_tokens", MAX_NEW_TOKENS_DEFAULT), "sampling_params.max_new_tokens", 1,
                   MAX_NEW_TOKENS_LIMIT)  # fmt: skip
    rid = body.get("rid") or f"gen-{uuid.uuid4().hex}"
    if not isinstance(rid, str):
        raise RequestError("rid must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false")
    return GenerateJob(rid, tokens, max_new, stream, _bootstrap(body))


def parse_completion(body: Any, model: str) -> GenerateJob:
    """An OpenAI `/v1/completions` body (one prompt: a string or a list of token ids)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    if body.get("model") not in (None, model):
        raise RequestError(f"model {body.get('model')!r} is not served here; this worker serves {model!r}")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        tokens = word_tokens(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        tokens = _ids(prompt, "prompt")
    else:
        raise RequestError("prompt must be a string or a list of token ids (batched prompts are not supported)")
    if not tokens:
        raise RequestError("the prompt is empty")
    max_new = _int(body.get("max_tokens", 16), "max_tokens", 1, MAX_NEW_TOKENS_LIMIT)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream must be true or false")
    return GenerateJob(f"cmpl-{uuid.uuid4().hex}", tokens, max_new, stream, _bootstrap(body))


def placeholder_text(start: int, end: int) -> str:
    return "".join(f" t{i}" for i in range(start, end))


def generate_body(job: GenerateJob, step: Step, start: float, text_from: int = 0) -> dict[str, Any]:
    """SGLang's `/generate` response (or one streamed chunk, cumulative as SGLang streams it)."""
    meta: dict[str, Any] = {
        "id": job.rid, "prompt_tokens": len(job.input_ids), "completion_tokens": step.completion_tokens,
        "cached_tokens": step.cached_tokens, "e2e_latency": time.monotonic() - start,
        "finish_reason": {"type": "length", "length": step.completion_tokens} if step.finished else None,
    }  # fmt: skip
    return {
        "text": placeholder_text(text_from, step.completion_tokens),
        "output_ids": list(range(step.completion_tokens)),
        "meta_info": meta,
    }


def completion_body(job: GenerateJob, step: Step, model: str, created: int, delta_from: int | None) -> dict[str, Any]:
    """An OpenAI completion (delta_from None) or one streamed chunk with the tokens after `delta_from`."""
    text = placeholder_text(delta_from or 0, step.completion_tokens)
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if step.finished else None}
    body: dict[str, Any] = {
        "id": job.rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
    }
    if delta_from is None or step.finished:
        body["usage"] = {
            "prompt_tokens": len(job.input_ids), "completion_tokens": step.completion_tokens,
            "total_tokens": len(job.input_ids) + step.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": step.cached_tokens},
        }  # fmt: skip
    return body


def load_response(snap: LoadSnapshot, role: SglangRole, max_running: int) -> dict[str, Any]:
    """SGLang's `/v1/loads` body (`WorkerLoadResponse`: one data-parallel rank)."""
    usage = snap.used_tokens / snap.max_total_tokens if snap.max_total_tokens else 0.0
    rank = {
        "dp_rank": 0, "num_running_reqs": snap.running, "num_waiting_reqs": snap.waiting,
        "num_total_reqs": snap.running + snap.waiting, "num_used_tokens": snap.used_tokens,
        "max_total_num_tokens": snap.max_total_tokens, "token_usage": usage, "active_token_usage": usage,
        "gen_throughput": snap.gen_throughput, "cache_hit_rate": snap.cache_hit_rate,
        "utilization": snap.running / max_running if max_running else 0.0, "max_running_requests": max_running,
        "queues": {"waiting": snap.waiting, "retracted": 0},
        "disagg": {"disagg_mode": role.value, "prefill_queue_reqs": snap.waiting if role is SglangRole.PREFILL else 0,
                   "decode_queue_reqs": snap.waiting if role is SglangRole.DECODE else 0},
    }  # fmt: skip
    aggregate = {
        "total_running_reqs": snap.running, "total_waiting_reqs": snap.waiting,
        "total_reqs": snap.running + snap.waiting, "avg_token_usage": usage, "avg_throughput": snap.gen_throughput,
        "avg_utilization": rank["utilization"],
    }  # fmt: skip
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"timestamp": stamp, "version": SGLANG_API_VERSION, "dp_rank_count": 1, "loads": [rank],
            "aggregate": aggregate}


def server_info(identity: ServerIdentity, role: SglangRole, snap: LoadSnapshot) -> dict[str, Any]:
    """SGLang's `/server_info`: the server arguments the gateway reads, and internal state."""
    info: dict[str, Any] = {
        "model_path": identity.model, "served_model_name": identity.model, "tokenizer_path": identity.model,
        "host": identity.host, "port": identity.port, "page_size": identity.page_size,
        "context_length": identity.context_length, "max_model_len": identity.context_length,
        "max_running_requests": identity.max_running_requests,
        "chunked_prefill_size": identity.chunked_prefill_size, "tp_size": identity.tp_size, "dp_size": 1,
        "attn_tp_size": identity.tp_size, "attn_dp_size": 1, "enable_dp_attention": False,
        "load_balance_method": "round_robin", "is_embedding": False, "disaggregation_mode": role.value,
        "disaggregation_transfer_backend": "mooncake", "disaggregation_bootstrap_port": identity.bootstrap_port,
        "version": SGLANG_API_VERSION,
        "internal_states": [{"num_running_reqs": snap.running, "num_waiting_reqs": snap.waiting,
                             "token_usage": snap.used_tokens / max(1, snap.max_total_tokens)}],
    }  # fmt: skip
    info.update(identity.extra)
    return info


def model_info(identity: ServerIdentity) -> dict[str, Any]:
    return {
        "model_path": identity.model, "tokenizer_path": identity.model, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": None, "architectures": None,
        "max_context_length": identity.context_length,
    }  # fmt: skip


# ---- the application -----------------------------------------------------------------------------------


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError("the body is not valid JSON") from None


def make_app(backend: SglangBackend, identity: ServerIdentity = ServerIdentity()) -> web.Application:
    """The aiohttp application serving the API subset for `backend`."""
    app = web.Application(client_max_size=64 * 2**20)
    created = int(time.time())

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        card = {"id": identity.model, "object": "model", "created": created, "owned_by": "sglang",
                "root": identity.model, "max_model_len": identity.context_length}  # fmt: skip
        return web.json_response({"object": "list", "data": [card]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": SGLANG_API_VERSION})

    async def get_server_info(_: web.Request) -> web.Response:
        return web.json_response(server_info(identity, backend.role, backend.load()))

    async def get_model_info(_: web.Request) -> web.Response:
        return web.json_response(model_info(identity))

    async def loads(_: web.Request) -> web.Response:
        return web.json_response(load_response(backend.load(), backend.role, identity.max_running_requests))

    async def metrics(_: web.Request) -> web.Response:
        snap = backend.load()
        lines = [
            f'sglang:num_running_reqs{{model_name="{identity.model}"}} {snap.running}',
            f'sglang:num_queue_reqs{{model_name="{identity.model}"}} {snap.waiting}',
            f'sglang:token_usage{{model_name="{identity.model}"}} {snap.used_tokens / max(1, snap.max_total_tokens)}',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def run_job(request: web.Request, job: GenerateJob, openai: bool) -> web.StreamResponse:
        start = time.monotonic()
        steps = backend.run(job)
        if not job.stream:
            last = Step(0)
            async for step in steps:
                last = step
            body = completion_body(job, last, identity.model, created, None) if openai else generate_body(job, last, start)
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        sent = 0
        async for step in steps:
            if openai:
                chunk = completion_body(job, step, identity.model, created, sent)
            else:
                chunk = generate_body(job, step, start)
            sent = step.completion_tokens
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def generate(request: web.Request) -> web.StreamResponse:
        try:
            job = parse_generate(await _json(request))
            return await run_job(request, job, openai=False)
        except RequestError as exc:
            return _error(400, str(exc))

    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            job = parse_completion(await _json(request), identity.model)
            return await run_job(request, job, openai=True)
        except RequestError as exc:
            return _error(400, str(exc))

    for path, handler in (
        ("/health", health), ("/health_generate", health), ("/v1/models", models), ("/version", version),
        ("/server_info", get_server_info), ("/get_server_info", get_server_info), ("/model_info", get_model_info),
        ("/get_model_info", get_model_info), ("/loads", loads), ("/v1/loads", loads), ("/metrics", metrics),
    ):  # fmt: skip
        app.router.add_get(path, handler)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    return app


# ---- a timed stand-alone backend ------------------------------------------------------------------------


@dataclass
class TimedBackend:
    """A collocated worker that spends `prefill_s_per_token` per uncached prompt token and `decode_s_per_token`
    per generated token, keeping an exact prefix cache of whole pages (unbounded). For tests and for the
    gateway's differential check, where only routing and timing matter."""

    role: SglangRole = SglangRole.NULL
    page_tokens: int = 64
    prefill_s_per_token: float = 0.0
    decode_s_per_token: float = 0.0
    max_total_tokens: int = 1_000_000
    served: list[str] = field(default_factory=list)
    _pages: set[int] = field(default_factory=set)
    _running: int = 0
    _used: int = 0

    def load(self) -> LoadSnapshot:
        return LoadSnapshot(self._running, 0, self._used, self.max_total_tokens)

    async def run(self, job: GenerateJob) -> AsyncIterator[Step]:
        self.served.append(job.rid)
        pages = token_page_hashes(list(job.input_ids), self.page_tokens)
        hit = 0
        while hit < len(pages) and pages[hit] in self._pages:
            hit += 1
        self._pages.update(pages)
        cached = hit * self.page_tokens
        self._running += 1
        self._used += len(job.input_ids)
        try:
            await asyncio.sleep((len(job.input_ids) - cached) * self.prefill_s_per_token)
            if self.role is SglangRole.PREFILL:
                yield Step(0, cached, finished=True)
                return
            for n in range(1, job.max_new_tokens + 1):
                if self.decode_s_per_token:
                    await asyncio.sleep(self.decode_s_per_token)
                if job.stream or n == job.max_new_tokens:
                    yield Step(n, cached, finished=n == job.max_new_tokens)
        finally:
            self._running -= 1
            self._used -= len(job.input_ids)
