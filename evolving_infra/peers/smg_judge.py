"""The SGLang Model Gateway (`smg`) as the judge of our cache-aware baseline: one request stream goes through
the real gateway in front of workers that speak SGLang's API (`node_agent.service.sglang_http`), and for each
request our `CacheAwareRouter` decides too, from the same history; the decisions are compared.

The comparison is teacher-forced: after each request our router records the worker the gateway chose
(tree insert and load count), and our load counts drop when the gateway's response ends, so every decision
of ours is made from the gateway's own state as far as we can observe it. Prompts are words: token j of a
trace request's context is one 16-hex-digit word naming its identity in the content model, so two prompts
share a word prefix exactly when they share tokens (the gateway matches characters; our router matches
64-token pages of the same token ids).

Every disagreement gets a cause (`Cause`), computed from both sides' state at the decision:
- `TIE`: the gateway's and our least-loaded choice differ only by which of equally loaded workers comes
  first (the gateway takes the first in its registry order, we take the smallest worker id);
- `PAGE_ROUNDING`: the match rate is above `cache_threshold` at the gateway's character level but not at our
  64-token page level (or the reverse), so one side routes by cache and the other by load;
- `HOLDER`: both route by cache but pick different workers among those holding the longest match (the
  gateway's character match reaches into a partial page that only one holds, or the trees order holders
  differently);
- `LOAD_RACE`: the sides saw different in-flight counts (a response ended between the gateway's decision
  and ours);
- `OTHER`: none of these.

Boundary: processes (the gateway, bounded in time, loopback only) and HTTP on 127.0.0.1; the decision logic
is our router's.
"""

from __future__ import annotations

import asyncio
import enum
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import xxhash
from aiohttp import web

from evolving_infra.core.pages import token_page_hashes
from evolving_infra.core.types import BranchId, NodeId, RequestId
from evolving_infra.local.smg import SmgUnavailable, find_smg, free_port
from evolving_infra.node_agent.service.sglang_http import ServerIdentity, TimedBackend, make_app, word_tokens
from evolving_infra.router.routing.base import RouteReason
from evolving_infra.router.routing.cache_aware import CacheAwareRouter, CacheAwareSettings
from evolving_infra.router.routing.inputs import PrefillNodeView, RouteRequest
from evolving_infra.traces.content import ContentModel
from evolving_infra.traces.mooncake_export import arrival_estimates
from evolving_infra.traces.records import Trace

__all__ = [
    "PAGE_TOKENS", "Cause", "Decision", "DifferentialReport", "SmgUnavailable", "char_match_rate", "classify",
    "common_prefix", "find_smg", "free_port", "prompt_words", "run_differential",
]  # fmt: skip
PAGE_TOKENS = 64


class Cause(enum.Enum):
    TIE = "tie"
    PAGE_ROUNDING = "page-rounding"
    HOLDER = "holder"
    LOAD_RACE = "load-race"
    OTHER = "other"


def prompt_words(model: ContentModel, rid: str) -> str:
    """The prompt of `rid` as words, one per token (see the module docstring)."""
    r = model.trace.request(rid)
    words: list[str] = []
    for kind, oid, lo, hi in model.context_spans(rid, 0, r.prompt_tokens):
        words.extend(f"{xxhash.xxh64_intdigest(f'{int(kind)}:{oid}:{i}'.encode()):016x}" for i in range(lo, hi))
    return " ".join(words)


@dataclass
class Decision:
    request: str
    gateway: str
    ours: str
    reason: str
    loads: dict[str, int]
    gateway_loads: dict[str, int]
    char_rate: float
    page_rate: float
    cause: Cause | None = None
    page_matches: dict[str, int] = field(default_factory=dict)
    char_matches: dict[str, int] = field(default_factory=dict)


@dataclass
class DifferentialReport:
    requests: int
    agreements: int
    causes: dict[str, int]
    settings: dict[str, Any]
    decisions: list[Decision] = field(default_factory=list, repr=False)
    wall_s: float = 0.0

    @property
    def agreement_rate(self) -> float:
        return self.agreements / self.requests if self.requests else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "agreements": self.agreements, "agreement_rate": self.agreement_rate,
                "causes": self.causes, "settings": self.settings, "wall_s": self.wall_s}  # fmt: skip


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (binary search over slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def char_match_rate(text: str, sent: Sequence[str]) -> float:
    """Longest common prefix of `text` with any earlier prompt sent, in characters / len(text)."""
    best = max((common_prefix(text, other) for other in sent), default=0)
    return best / len(text) if text else 0.0


def classify(d: Decision, threshold: float) -> Cause:
    """The cause of one disagreement (module docstring)."""
    if d.loads != d.gateway_loads:
        return Cause.LOAD_RACE
    by_cache_gateway = d.char_rate > threshold
    by_cache_ours = d.reason == RouteReason.CACHE_MATCH.value
    if by_cache_gateway != by_cache_ours and d.reason != RouteReason.IMBALANCED_LEAST_LOADED.value:
        return Cause.PAGE_ROUNDING
    if by_cache_gateway and by_cache_ours:
        return Cause.HOLDER
    low = min(d.loads.values())
    if d.loads.get(d.gateway) == low and d.loads.get(d.ours) == low:
        return Cause.TIE
    return Cause.OTHER


async def _start_workers(n: int, decode_s: float) -> tuple[list[web.AppRunner], list[str], list[TimedBackend]]:
    runners, urls, backends = [], [], []
    for _ in range(n):
        backend = TimedBackend(page_tokens=PAGE_TOKENS, decode_s_per_token=decode_s)
        port = free_port()
        runner = web.AppRunner(make_app(backend, ServerIdentity(port=port)), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
        backends.append(backend)
    return runners, urls, backends


async def _wait_workers(session: aiohttp.ClientSession, url: str, n: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            async with session.get(f"{url}/workers") as resp:
                if resp.status == 200 and len((await resp.json()).get("workers", [])) >= n:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.25)
    raise TimeoutError(f"smg did not register {n} workers in time")


async def run_differential(
    trace: Trace, *, workers: int = 3, concurrency: int = 8, max_requests: int = 200, output_cap: int = 32,
    decode_s: float = 0.002, settings: CacheAwareSettings = CacheAwareSettings(), timeout_s: float = 120.0,
    smg: Path | None = None, log_path: Path | None = None, warmup_slice: bool = False,
    backend_loads: bool = False,
) -> DifferentialReport:
    """Replay up to `max_requests` of `trace` (in order of open-loop arrival estimates, agents interleaved, at most
    `concurrency` in flight) through `smg` and through our cache-aware router; see the module docstring."""
    exe = smg or find_smg()
    start = time.monotonic()
    deadline = start + timeout_s
    model = ContentModel(trace, PAGE_TOKENS)
    runners, urls, backends = await _start_workers(workers, decode_s)
    node_of = {u: NodeId(f"w{i}") for i, u in enumerate(urls)}
    port, metrics_port = free_port(), free_port()
    cmd = [
        str(exe), "launch", "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(metrics_port), "--worker-urls", *urls, "--policy", "cache_aware",
        "--cache-threshold", str(settings.cache_threshold),
        "--balance-abs-threshold", str(settings.balance_abs_threshold),
        "--balance-rel-threshold", str(settings.balance_rel_threshold),
        "--eviction-interval-secs", str(int(settings.eviction_interval_s)),
        "--worker-startup-check-interval", "1", "--disable-retries", "--disable-circuit-breaker",
        "--shutdown-grace-period-secs", "1", "--log-level", "warn",
    ]  # fmt: skip
    if not warmup_slice:  # smg >= 1.13 offers cache misses (and 1 in 8 hits) to new or thin workers
        cmd += ["--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0", "--worker-warmup-thin-ratio", "0"]
    if not backend_loads:  # newer smg ranks workers by the backlog they report (/v1/loads, polled every 10 s)
        cmd += ["--disable-load-monitoring"]
    log = log_path.open("wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
    ours = CacheAwareRouter(settings)
    decisions: list[Decision] = []
    sent_by: dict[str, list[str]] = {}
    gate = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            await _wait_workers(session, gate, workers, deadline)
            slots = asyncio.Semaphore(concurrency)
            tasks: list[asyncio.Task[None]] = []
            try:

                async def send(rid: str, text: str, max_new: int, done: asyncio.Event) -> None:
                    try:
                        body = {"text": text, "rid": rid, "sampling_params": {"max_new_tokens": max_new}}
                        async with session.post(f"{gate}/generate", json=body) as resp:
                            await resp.read()
                            if resp.status != 200:
                                raise RuntimeError(f"smg answered {resp.status} for {rid}")
                    finally:
                        ours.on_finished(RequestId(rid), time.monotonic() - start)
                        done.set()
                        slots.release()

                arrival = arrival_estimates(trace, service_s=1.0)
                order = sorted(trace.requests, key=lambda q: (arrival[q.index], q.index))[:max_requests]
                for r in order:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the differential replay ran out of time")
                    await slots.acquire()
                    text = prompt_words(model, r.id)
                    tokens = word_tokens(text)
                    pages = tuple(token_page_hashes(list(tokens), PAGE_TOKENS))
                    req = RouteRequest(RequestId(r.id), BranchId(r.branch), pages, len(tokens), r.output_tokens,
                                       page_tokens=PAGE_TOKENS)  # fmt: skip
                    gateway_loads = await _gateway_loads(session, gate, node_of)
                    now = time.monotonic() - start
                    views = [PrefillNodeView(node=n) for n in node_of.values()]
                    decision = ours.route(req, views, now)
                    loads = {str(n): ours.loads.load(n) for n in node_of.values()}
                    page_matches = {str(n): ours.tree.match(n, pages) for n in node_of.values()}
                    char_matches = {w: max((common_prefix(text, t) for t in ts), default=0)
                                    for w, ts in sent_by.items()}  # fmt: skip
                    char_rate = max(char_matches.values(), default=0) / len(text)
                    longest = max(ours.tree.match(n, pages) for n in node_of.values())
                    page_rate = longest * PAGE_TOKENS / len(tokens)
                    served_before = [len(b.served) for b in backends]
                    done = asyncio.Event()
                    tasks.append(asyncio.create_task(send(r.id, text, max(1, min(r.output_tokens, output_cap)), done)))
                    chosen = await _which_worker(backends, served_before, r.id, deadline)
                    gateway = node_of[urls[chosen]]
                    ours.on_routed(req, _forced(decision, gateway), now)
                    sent_by.setdefault(str(gateway), []).append(text)
                    decisions.append(Decision(r.id, str(gateway), str(decision.node), decision.reason.value, loads,
                                              gateway_loads, char_rate, page_rate, None, page_matches,
                                              char_matches))  # fmt: skip
                await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if log_path and not isinstance(log, int):
            log.close()
        for runner in runners:
            await runner.cleanup()
    causes: Counter[str] = Counter()
    for d in decisions:
        if d.gateway != d.ours:
            d.cause = classify(d, settings.cache_threshold)
            causes[d.cause.value] += 1
    agreements = sum(d.gateway == d.ours for d in decisions)
    return DifferentialReport(
        requests=len(decisions), agreements=agreements, causes=dict(causes),
        settings={"workers": workers, "concurrency": concurrency, "cache_threshold": settings.cache_threshold,
                  "balance_abs_threshold": settings.balance_abs_threshold,
                  "balance_rel_threshold": settings.balance_rel_threshold, "page_tokens": PAGE_TOKENS,
                  "warmup_slice": warmup_slice, "backend_loads": backend_loads},
        decisions=decisions, wall_s=time.monotonic() - start,
    )  # fmt: skip


async def _gateway_loads(session: aiohttp.ClientSession, gate: str, node_of: dict[str, NodeId]) -> dict[str, int]:
    """The gateway's own in-flight count per worker (`GET /workers`, field `load`)."""
    async with session.get(f"{gate}/workers") as resp:
        workers = (await resp.json())["workers"]
    return {str(node_of[w["url"]]): int(w.get("load", 0)) for w in workers if w.get("url") in node_of}


async def _which_worker(backends: Sequence[TimedBackend], before: Sequence[int], rid: str, deadline: float) -> int:
    """Index of the worker that received `rid` (smg forwards the body's `rid`)."""
    while time.monotonic() < deadline:
        for i, b in enumerate(backends):
            if rid in b.served[before[i]:]:
                return i
        await asyncio.sleep(0.001)
    raise TimeoutError(f"no worker received {rid}")


def _forced(decision: Any, node: NodeId) -> Any:
    """`decision` with its node replaced by the gateway's choice (teacher forcing)."""
    from dataclasses import replace

    return replace(decision, node=node)
