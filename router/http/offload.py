"""Parsing and tokenizing large request bodies away from the event loop.

A thread is not enough: `json.loads` of a 10 MB body and the tokenizer's C-level splitting hold the GIL for
hundreds of milliseconds, which stalls every other request (health checks included). So bodies of
`offload_bytes` or more go to a small process pool (`tokenize_processes` workers, started with `spawn`, never
`fork`: the router process runs gRPC threads). Each worker holds its own copy of the tokenizer (`_init`).
A worker returns the parsed request and either the token ids (packed as 64-bit integers) or the fields of
the `ApiError` tokenization raised, so the caller keeps the order of its checks (model, branch, then the
prompt). With `tokenize_processes` 0 (or a broken pool) a worker thread does the same work. On Linux a worker
asks the kernel to end it when the thread that started it ends (`PR_SET_PDEATHSIG`), so a router that is killed
(SIGKILL, a crash) leaves no idle workers behind.

Boundary: moving work off the loop; parsing rules are api.py's, tokenization rules completion.py's caller's.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing
import os
import signal
import sys
from array import array
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from evolving_infra.router.http.api import Endpoint, ParsedRequest, parse_chat, parse_completion
from evolving_infra.router.http.errors import ApiError, ErrorCode, ErrorType
from evolving_infra.router.http.tokenizer import Tokenizer

Tokenize = Callable[[Tokenizer, ParsedRequest], tuple[int, ...]]
Outcome = tuple[ParsedRequest, tuple[int, ...] | ApiError]

_WORKER: dict[str, Any] = {}
"""In a worker process: its tokenizer and tokenize function (set once by `_init`)."""


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In a worker on Linux: be sent SIGTERM when the router's thread that started this worker ends (and end
    now if the router already ended while this worker was starting)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(0)  # the router is gone: nobody will ever send work


def _init(tokenizer: Tokenizer, tokenize: Tokenize) -> None:
    _die_with_parent()
    _WORKER["tokenizer"], _WORKER["tokenize"] = tokenizer, tokenize


def _error_fields(exc: ApiError) -> tuple[Any, ...]:
    return (exc.status, exc.message, exc.type.value, exc.code.value, exc.param)


def _error(fields: tuple[Any, ...]) -> ApiError:
    status, message, kind, code, param = fields
    return ApiError(status, message, ErrorType(kind), ErrorCode(code), param=param)


def _parse(endpoint: Endpoint, raw: bytes) -> ParsedRequest:
    return parse_chat(raw) if endpoint is Endpoint.CHAT_COMPLETIONS else parse_completion(raw)


def _work(endpoint: str, raw: bytes) -> tuple[str, Any, Any]:
    """In a worker: ("parse-error", fields, None) or ("ok", parsed, ids bytes | error fields)."""
    try:
        parsed = _parse(Endpoint(endpoint), raw)
    except ApiError as exc:
        return "parse-error", _error_fields(exc), None
    try:
        ids = _WORKER["tokenize"](_WORKER["tokenizer"], parsed)
    except ApiError as exc:
        return "ok", parsed, _error_fields(exc)
    return "ok", parsed, array("q", ids).tobytes()


def _local(tokenizer: Tokenizer, tokenize: Tokenize, endpoint: Endpoint, raw: bytes) -> Outcome:
    parsed = _parse(endpoint, raw)
    try:
        return parsed, tokenize(tokenizer, parsed)
    except ApiError as exc:
        return parsed, exc


class Offloader:
    """Runs `parse + tokenize` for large bodies in worker processes (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, tokenize: Tokenize, processes: int) -> None:
        self.tokenizer, self.tokenize = tokenizer, tokenize
        self.pool: ProcessPoolExecutor | None = None
        if processes > 0:
            self.pool = ProcessPoolExecutor(
                max_workers=processes, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                initargs=(tokenizer, tokenize),
            )  # fmt: skip

    def warm(self) -> None:
        """Start the workers now (in the background) rather than on the first large body."""
        if self.pool is not None:
            for _ in range(self.pool._max_workers):  # type: ignore[attr-defined]  # noqa: SLF001 - one no-op per worker
                self.pool.submit(int)

    async def run(self, endpoint: Endpoint, raw: bytes) -> Outcome:
        """The parsed request and its prompt ids (or the tokenization error); raises the parse error."""
        if self.pool is not None:
            try:
                status, first, second = await asyncio.get_running_loop().run_in_executor(self.pool, _work, endpoint.value, raw)
            except BrokenProcessPool:
                self.pool = None
            else:
                if status == "parse-error":
                    raise _error(first)
                ids: tuple[int, ...] | ApiError
                if isinstance(second, bytes):
                    packed = array("q")
                    packed.frombytes(second)
                    ids = tuple(packed)
                else:
                    ids = _error(second)
                return first, ids
        return await asyncio.to_thread(_local, self.tokenizer, self.tokenize, endpoint, raw)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
