"""Agent clients: a trace replayed through the router's HTTP API, as agent harnesses would send it.

The pure `AgentReplayer` decides what to issue when; this module does the I/O. Each issued request becomes a
streaming `POST /v1/completions` whose prompt is token ids (`PromptBuilder`: prompts share exactly the prefixes
the trace says), `max_tokens` = the trace's output tokens, with the branch header and, for a fork or sub-agent
branch, the parent-branch header. A branch that ends is finished with `POST /v1/branches/{id}/finish`.

Time: the replay clock is emulated seconds, `speed_up` x the wall seconds since the replay began, the nodes' clock
rate, so the trace's pauses (`delay_s`) and the records are in the same seconds as the node agents' times.

Connections: like an agent framework's HTTP client, the agents share one pool of persistent (keep-alive)
connections, and `warm_connections` of them are opened before the replay clock starts (one `GET /v1/models`
each, at once), so the first requests do not pay for connection set-up and the client's first use of its HTTP
stack. A request's latency is measured by the client: from its issue (the request leaves the client) to the
first token and the last one read from the stream.

Bounds: at most `max_in_flight` requests are open at once (the rest wait; their latency counts from when they were
due); each request has a wall-clock deadline; an overload answer (503 with `x-should-retry: true`) is retried a
few times before its first byte; a request that still fails is counted as failed and completed for the replayer,
so its agent goes on. `stop` ends issuing; requests in flight then get `drain_s` to finish.

Every finished request is recorded as a `RequestRecord`: the serving nodes and the prefill's queue wait come from
the usage chunk's `evolving` extension (router seconds, scaled by `speed_up`; the prefill start is the issue time
plus that wait); a router that sends none leaves the node names empty and the prefill start at the issue time.

Boundary: HTTP client and replay loop; what to issue is the replayer's, how requests are served is the cluster's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

from evolving_infra.local.prompts import PromptBuilder
from evolving_infra.sim.records import RequestRecord
from evolving_infra.sim.replay import (
    AgentFinished,
    AgentReplayer,
    AgentStarted,
    BranchEnded,
    Effect,
    IssueRequest,
    ReplayMode,
    RequestSpec,
)
from evolving_infra.traces.records import Trace

log = logging.getLogger(__name__)

BRANCH_HEADER = "x-evolving-branch-id"
PARENT_HEADER = "x-evolving-parent-branch-id"


@dataclass(frozen=True)
class ClientSettings:
    speed_up: float = 1.0
    max_in_flight: int = 64
    request_timeout_s: float = 120.0
    """Wall seconds per request, retries included."""
    retries: int = 5
    drain_s: float = 20.0
    """Wall seconds requests in flight may take to finish once issuing stops."""
    text_prompts: bool = False
    """Send each prompt as text, one word `t<id>` per token id (a gateway that takes no token ids, e.g. SGLang's:
    its workers make one token per word, so word prefixes are the same token prefixes)."""
    finish_branches: bool = True
    """Call `POST /v1/branches/{id}/finish` when a branch ends (our router's API; other gateways have none)."""
    model: str | None = None
    """The `model` field of each request (None: not sent; SGLang's gateway requires one)."""
    warm_connections: int = 16
    """Connections opened before the replay starts: at most this many, one per agent of the trace (0: none)."""
    keepalive_s: float = 8.0
    """Wall seconds an idle pooled connection is kept (shorter than the router's idle limit, 10 s by default, so
    the client, not the server, closes it: no request is sent on a connection the server is closing)."""


@dataclass
class ReplayProgress:
    """Counters the CLI shows while the replay runs (times in emulated seconds)."""

    issued: int = 0
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    agents_started: int = 0
    agents_finished: int = 0
    branches_finished: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft_sum: float = 0.0
    now: float = 0.0
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=5))

    @property
    def mean_ttft(self) -> float | None:
        return self.ttft_sum / self.done if self.done else None

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


@dataclass
class ReplayResult:
    records: list[RequestRecord]
    progress: ReplayProgress
    completed: bool
    """Every agent of the trace finished (the replay ran to its end)."""
    stopped_by: str
    wall_s: float
    emulated_s: float


class _Failed(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AgentClients:
    """Replays `trace` against the router at `base_url` (see the module docstring)."""

    def __init__(self, trace: Trace, base_url: str, mode: ReplayMode, settings: ClientSettings) -> None:
        self.trace = trace
        self.base_url = base_url.rstrip("/")
        self.settings = settings
        self.replayer = AgentReplayer(trace, mode)
        self.prompts = PromptBuilder(trace)
        self.progress = ReplayProgress()
        self.records: list[RequestRecord] = []
        self._completions: asyncio.Queue[str] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._t0 = 0.0
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._session: aiohttp.ClientSession | None = None
        self.warmed = 0
        """Connections opened before the replay (`_open_connections`)."""

    def now(self) -> float:
        """Replay time: emulated seconds since the replay began."""
        return (asyncio.get_running_loop().time() - self._t0) * self.settings.speed_up

    async def run(self, stop: asyncio.Event, on_tick: Callable[[ReplayProgress], None] | None = None) -> ReplayResult:
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        stopped_by = "completed"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        connector = aiohttp.TCPConnector(limit=self.settings.max_in_flight + 8, keepalive_timeout=self.settings.keepalive_s)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            self._session = session
            self.warmed = await self._open_connections(session)
            self._t0 = loop.time()
            self._apply(self.replayer.start(0.0))
            while not self.replayer.done:
                if stop.is_set():
                    stopped_by = "stopped"
                    break
                wake = self.replayer.next_wakeup()
                wait = 0.5 if wake is None else max(0.0, min(0.5, (wake - self.now()) / self.settings.speed_up))
                try:
                    rid = await asyncio.wait_for(self._completions.get(), timeout=wait)
                    self._apply(self.replayer.completed(rid, self.now()))
                    while not self._completions.empty():
                        self._apply(self.replayer.completed(self._completions.get_nowait(), self.now()))
                except asyncio.TimeoutError:
                    pass
                self._apply(self.replayer.due(self.now()))
                self.progress.now = self.now()
                if on_tick is not None:
                    on_tick(self.progress)
            await self._drain(on_tick)
            self._session = None
        wall = loop.time() - self._t0
        return ReplayResult(self.records, self.progress, self.replayer.done, stopped_by, wall, wall * self.settings.speed_up)

    async def _open_connections(self, session: aiohttp.ClientSession) -> int:
        """Open the pool's first connections (module docstring); returns how many answered. Best effort: a
        server without `/v1/models` leaves the pool to open connections on demand."""
        count = min(self.settings.warm_connections, self.settings.max_in_flight, len(self.trace.agents))

        async def one() -> bool:
            try:
                async with session.get(f"{self.base_url}/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as answer:
                    await answer.read()
                    return answer.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
                log.debug("opening a connection failed: %s", error)
                return False

        return sum(await asyncio.gather(*(one() for _ in range(max(0, count)))))

    async def _drain(self, on_tick: Callable[[ReplayProgress], None] | None) -> None:
        """Let requests in flight finish (at most `drain_s`), then cancel what is left."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        while self._tasks and loop.time() < began + self.settings.drain_s:  # drain_s may shrink meanwhile
            await asyncio.wait(set(self._tasks), timeout=min(0.5, max(0.0, began + self.settings.drain_s - loop.time())))
            self.progress.now = self.now()
            if on_tick is not None:
                on_tick(self.progress)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- effects ----------------------------------------------------------------------------------------
    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, IssueRequest):
                self._spawn(self._request(effect))
            elif isinstance(effect, BranchEnded):
                if self.settings.finish_branches:
                    self._spawn(self._finish_branch(effect.branch))
            elif isinstance(effect, AgentStarted):
                self.progress.agents_started += 1
            elif isinstance(effect, AgentFinished):
                self.progress.agents_finished += 1

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish_branch(self, branch: str) -> None:
        assert self._session is not None
        url = f"{self.base_url}/v1/branches/{quote(branch, safe='')}/finish"
        for _ in range(3):
            try:
                async with self._session.post(url, timeout=aiohttp.ClientTimeout(total=10)) as answer:
                    if answer.status == 200:
                        self.progress.branches_finished += 1
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                log.debug("finish of branch %s failed: %s", branch, error)
            await asyncio.sleep(0.2)
        self.progress.errors.append(f"branch {branch}: finish call failed")

    async def _request(self, issue: IssueRequest) -> None:
        spec = issue.request
        progress = self.progress
        completed = False
        try:
            async with self._slots:
                progress.issued += 1
                progress.in_flight += 1
                try:
                    record = await asyncio.wait_for(self._send(spec, issue), timeout=self.settings.request_timeout_s)
                except (_Failed, aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
                    progress.failed += 1
                    text = str(error) or type(error).__name__
                    progress.errors.append(f"request {spec.id}: {text}"[:300])
                    log.warning("request %s failed: %s", spec.id, text)
                else:
                    self.records.append(record)
                    progress.done += 1
                    progress.prompt_tokens += record.prompt_tokens
                    progress.cached_tokens += record.cached_tokens
                    progress.output_tokens += record.output_tokens
                    progress.ttft_sum += record.ttft_s
                finally:
                    progress.in_flight -= 1
            completed = True
        finally:
            if completed:
                self._completions.put_nowait(spec.id)

    async def _send(self, spec: RequestSpec, issue: IssueRequest) -> RequestRecord:
        assert self._session is not None
        ids = self.prompts.token_ids(spec.id)
        body = json.dumps({
            "prompt": " ".join(f"t{i}" for i in ids) if self.settings.text_prompts else ids, "max_tokens": spec.output_tokens, "stream": True,
            "stream_options": {"include_usage": True},
            **({"model": self.settings.model} if self.settings.model else {}),
        })  # fmt: skip
        headers = {"content-type": "application/json", BRANCH_HEADER: spec.branch, "x-request-id": _request_id(spec.id)}
        parent = self.prompts.parent_branch(spec.branch)
        if parent is not None:
            headers[PARENT_HEADER] = parent
        for attempt in range(self.settings.retries + 1):
            issued = max(self.now(), issue.at)
            try:
                return await self._stream(spec, issue, issued, body, headers, len(ids))
            except _Failed as failure:
                if failure.retry_after is None or attempt == self.settings.retries:
                    raise
                await asyncio.sleep(min(1.0, failure.retry_after))
        raise AssertionError("unreachable")

    async def _stream(
        self, spec: RequestSpec, issue: IssueRequest, issued: float, body: str, headers: dict[str, str], prompt: int
    ) -> RequestRecord:
        assert self._session is not None
        first: float | None = None
        used: dict[str, object] | None = None
        async with self._session.post(f"{self.base_url}/v1/completions", data=body, headers=headers) as answer:
            if answer.status != 200:
                text = (await answer.read())[:500].decode("utf-8", "replace")
                retry = answer.headers.get("x-should-retry") == "true" and answer.status in (429, 503)
                delay = _float(answer.headers.get("retry-after")) if retry else None
                raise _Failed(f"HTTP {answer.status}: {text}", (delay or 0.5) if retry else None)
            async for raw in answer.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise _Failed(f"stream error: {event['error'].get('message', event['error'])}")
                if first is None and any(c.get("text") for c in event.get("choices") or ()):
                    first = self.now()
                if event.get("usage"):
                    used = event["usage"]
        finish = self.now()
        if used is None:
            raise _Failed("the stream ended without a usage chunk")
        details = used.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens", 0)) if isinstance(details, dict) else 0
        output = int(used.get("completion_tokens", 0))  # type: ignore[call-overload]  # usage values are JSON, typed object
        prompt_tokens = int(used.get("prompt_tokens", prompt))  # type: ignore[call-overload]  # usage values are JSON, typed object
        first = finish if first is None else first
        serving = used.get("evolving")
        serving = serving if isinstance(serving, dict) else {}
        wait = _float(str(serving.get("queue_s"))) if serving.get("queue_s") is not None else None
        start = min(max(first, issued), issued + wait * self.settings.speed_up) if wait is not None else issued
        return RequestRecord(
            request_id=spec.id, agent=spec.agent, workload=spec.workload, branch=spec.branch, issued=issued,
            prefill_node=str(serving.get("prefill_node") or ""), decode_node=str(serving.get("decode_node") or ""),
            queued=issued, prefill_start=start, first_token=max(first, issued),
            finish=max(finish, first, issued), prompt_tokens=prompt_tokens, cached_tokens=min(cached, prompt_tokens),
            fetched_tokens=0, output_tokens=max(1, output), since=min(issue.since, issued), pause_s=spec.delay_s,
        )  # fmt: skip


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _request_id(rid: str) -> str:
    """The trace's request id when it is a valid X-Request-Id (1-128 printable ASCII), else a safe stand-in."""
    if 1 <= len(rid) <= 128 and all(33 <= ord(c) < 127 for c in rid):
        return rid
    return "req-" + "".join(c if 33 <= ord(c) < 127 else "_" for c in rid)[:120]
