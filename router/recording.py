"""Record served traffic as an agent trace (format version 1): lengths, page hashes and times, never text.

The HTTP layer feeds a `TraceRecorder` three events per request (`begin` with the prompt's token ids, `end`
with the output's token ids) and one per finished branch. The recorder keeps, per request, only lengths, the
chained page hashes of its context (`core.pages`, as the router computes them) and two whole-sequence hashes;
token ids of a partial page live only until the request ends. Each prompt's structure is decided at `begin`:

1. The candidate base is the latest completed request of the request's branch, else of its parent branch.
   The prompt keeps the candidate's whole context when it starts with exactly that context (an append), else
   its whole prompt when it starts with exactly that prompt (a retry, or an answer not sent back as
   generated), else the leading full pages it shares with the candidate's context (a compaction or rewrite
   keeps a multiple of the page size: a lower bound).
2. Otherwise (no candidate, or nothing shared with it) the longest run of leading pages seen in any completed
   context or any prompt handed over (a request in flight holds its prompt's KV) decides: produced by a
   completed request of the same agent, that request is the base (a fork); otherwise (another agent, or only
   prompts in flight), the run becomes a shared prefix `recorded:<hash of its last page>` of that many tokens
   (requests that held those pages from nothing are given the longest such prefix too, so the producer
   counts). Else the prompt is fresh. Different runs are different prefixes, so a shorter run common to two
   of them is not shared in the trace (conservative).

Agents are the branches without a known parent; a branch with a parent belongs to its parent's agent. A
request waits (`after`) for the latest completed request of its branch (or, for a branch's first request, of
its parent branch) and for the last requests of its child branches that ended since; `delay_s` is its arrival
minus the latest of those ends. Times are multiplied by `time_scale` (a local run's router runs on wall time,
its nodes `speed_up` times faster). A request that ends with no output token is dropped (counted).

Boundary: pure (no I/O, no clock: times are passed in); `router/http/recording.py` feeds it from the HTTP layer.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from evolving_infra.core.pages import PageHash, chain_hashes, token_page_hashes
from evolving_infra.core.types import NodeId
from evolving_infra.router.fitting import FittedNodeModel

RECORDER_NOTES = (
    "Recorded by the evolving-infra router: lengths, page hashes and times only (no text, no token ids). "
    "keep is exact for appends and retries and a whole number of pages otherwise; shared prefixes are runs "
    "of leading pages that requests of different agents had in common."
)


def _hasher(tokens: Sequence[int]) -> Any:
    """A running hash of a token sequence (extend it with `.update(_pack(more))`)."""
    return hashlib.blake2b(_pack(tokens), digest_size=16)


def _pack(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}i", *tokens)


def _whole(tokens: Sequence[int]) -> bytes:
    return _hasher(tokens).digest()


@dataclass
class _Done:
    """A completed request, as later requests see it."""

    index: int
    rid: str
    agent: str
    branch: str
    prompt: int
    output: int
    end_s: float
    prompt_hash: bytes
    context_hash: bytes
    pages: list[PageHash]

    @property
    def context(self) -> int:
        return self.prompt + self.output


@dataclass
class _Open:
    """A request between `begin` and `end`."""

    rid: str
    agent: str
    branch: str
    arrival_s: float
    prompt: int
    prompt_hash: bytes
    running: Any  # running hash of the prompt, extended by the output at `end`
    prompt_pages: list[PageHash]
    tail: tuple[int, ...]
    spec: dict[str, Any]
    after: list[str]
    wait_end_s: float | None
    fresh_pages: list[PageHash] | None


@dataclass
class _Branch:
    tid: str
    agent: str
    parent: _Branch | None
    latest: _Done | None = None
    ended_children: list[str] = field(default_factory=list)
    last_rid: str | None = None
    finished: bool = False
    open: int = 0
    finish_pending: bool = False


@dataclass
class RecorderReport:
    requests: int = 0
    agents: int = 0
    branches: int = 0
    appends: int = 0
    retries: int = 0
    page_keeps: int = 0
    forks: int = 0
    prefix_starts: int = 0
    fresh_starts: int = 0
    dropped: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class TraceRecorder:
    """Turns served requests into trace records (see the module docstring)."""

    def __init__(self, page_tokens: int, *, workload: str = "recorded", time_scale: float = 1.0, name: str = "recorded") -> None:
        if page_tokens < 1 or time_scale <= 0:
            raise ValueError(f"page_tokens must be >= 1 and time_scale > 0, got {page_tokens} and {time_scale}")
        self.page_tokens = page_tokens
        self.workload = workload
        self.time_scale = time_scale
        self.name = name
        self.report = RecorderReport()
        self._origin: float | None = None
        self._branches: dict[str, _Branch] = {}
        self._open: dict[str, _Open] = {}
        self._producer: dict[PageHash, _Done] = {}
        self._prompted: set[PageHash] = set()  # pages of every prompt handed over (in flight or done)
        self._prefixes: dict[str, int] = {}
        self._fresh: list[tuple[int, list[PageHash]]] = []  # (body position, prompt pages) of fresh starts
        self._body: list[dict[str, Any]] = []
        self._agents: set[str] = set()
        self._count = 0
        self._rid_count = 0
        self._ends: dict[str, float] = {}
        self._open_branch: dict[str, _Branch] = {}
        self._all_branches: list[_Branch] = []

    # -- events ----------------------------------------------------------------------------------------
    def begin(self, rid: str, branch: str, parent: str | None, prompt: Sequence[int], now: float) -> None:
        """A request was handed to the backend at `now` (seconds, any origin)."""
        t = self._time(now)
        b = self._branch(branch, parent)
        pages = token_page_hashes(prompt, self.page_tokens)
        full = len(pages) * self.page_tokens
        candidate = b.latest or (b.parent.latest if b.parent is not None else None)
        spec: dict[str, Any] = {"new": len(prompt)}
        fresh: list[PageHash] | None = None
        keep = 0
        if candidate is not None:
            keep = self._keep(prompt, pages, candidate)
            if keep:
                spec = {"base": candidate.rid, "keep": keep, "new": len(prompt) - keep}
                if candidate.branch != b.tid:
                    self.report.forks += 1
        if not keep:
            run = self._run(pages)
            if run:
                producer = self._producer.get(pages[run - 1])
                if producer is not None and producer.agent == b.agent:
                    spec = {"base": producer.rid, "keep": run * self.page_tokens, "new": len(prompt) - run * self.page_tokens}
                    self.report.forks += 1
                else:
                    name = f"recorded:{pages[run - 1]:016x}"
                    spec = {"shared": name, "keep": run * self.page_tokens, "new": len(prompt) - run * self.page_tokens}
                    self.report.prefix_starts += 1
            else:
                fresh = pages
                self.report.fresh_starts += 1
        waits: list[_Done] = [candidate] if candidate is not None and candidate.agent == b.agent else []
        after = [d.rid for d in waits] + b.ended_children
        ends = [d.end_s for d in waits] + [self._ends[r] for r in b.ended_children]
        b.ended_children = []
        for page in pages:
            self._prompted.add(page)
        running = _hasher(prompt)
        self._open[rid] = _Open(
            rid=self._new_rid(), agent=b.agent, branch=b.tid, arrival_s=t, prompt=len(prompt),
            prompt_hash=running.copy().digest(), running=running, prompt_pages=pages, tail=tuple(prompt[full:]), spec=spec, after=after,
            wait_end_s=max(ends) if ends else None, fresh_pages=fresh,
        )  # fmt: skip
        self._open_branch[rid] = b
        b.open += 1

    def end(self, rid: str, output: Sequence[int], now: float, *, first_token_s: float | None = None,
            cached_tokens: int | None = None, queue_s: float | None = None) -> None:  # fmt: skip
        """The request `rid` ended at `now` having produced `output` (however it ended)."""
        o = self._open.pop(rid, None)
        b = self._open_branch.pop(rid, None)
        if o is None or b is None:
            return
        b.open -= 1
        if not output:
            self.report.dropped += 1
            self._maybe_end(b)
            return
        t = self._time(now)
        if o.agent not in self._agents:
            self._agents.add(o.agent)
            self._body.append({"kind": "agent", "agent": o.agent, "workload": self.workload, "start_s": round(o.arrival_s, 6)})
        record: dict[str, Any] = {
            "kind": "request", "id": o.rid, "agent": o.agent, "branch": o.branch, "after": o.after,
            "delay_s": round(max(0.0, o.arrival_s - o.wait_end_s) if o.wait_end_s is not None else 0.0, 6),
            "input": o.spec, "output_tokens": len(output), "recorded_arrival_s": round(o.arrival_s, 6),
            "recorded_e2e_s": round(t - o.arrival_s, 6),
        }  # fmt: skip
        if first_token_s is not None:
            record["recorded_ttft_s"] = round(self._time(first_token_s) - o.arrival_s, 6)
        if cached_tokens is not None:
            record["recorded_cached_tokens"] = cached_tokens
        if queue_s is not None:
            record["recorded_queue_s"] = round(queue_s * self.time_scale, 6)
        if o.fresh_pages:
            self._fresh.append((len(self._body), o.fresh_pages))
        if "shared" in o.spec:
            self._prefixes.setdefault(o.spec["shared"], o.spec["keep"])
        self._body.append(record)
        self.report.requests += 1
        context = [*o.tail, *output]
        more = chain_hashes(
            (struct.pack(f"<{self.page_tokens}i", *context[i : i + self.page_tokens])
             for i in range(0, len(context) - self.page_tokens + 1, self.page_tokens)),
            o.prompt_pages[-1] if o.prompt_pages else 0,
        )  # fmt: skip
        o.running.update(_pack(output))
        done = _Done(self._count, o.rid, o.agent, o.branch, o.prompt, len(output), t, o.prompt_hash,
                     o.running.digest(), [*o.prompt_pages, *more])  # fmt: skip
        self._count += 1
        self._ends[o.rid] = t
        for page in done.pages:
            self._producer[page] = done
        if b.latest is None or b.latest.end_s <= t:
            b.latest = done
        b.last_rid = o.rid
        self._maybe_end(b)

    def finish_branch(self, branch: str) -> None:
        """The harness (or the HTTP layer, for an ephemeral branch) ended `branch`."""
        b = self._branches.get(branch)
        if b is None or b.finished:
            return
        b.finished = True
        b.finish_pending = True
        self._maybe_end(b)

    def _maybe_end(self, b: _Branch) -> None:
        """Write a finished branch's end once none of its requests is in flight."""
        if not b.finish_pending or b.open > 0:
            return
        b.finish_pending = False
        if b.last_rid is not None:
            self._body.append({"kind": "branch_end", "branch": b.tid, "after": b.last_rid})
            if b.parent is not None:
                b.parent.ended_children.append(b.last_rid)

    # -- output ----------------------------------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        """The trace so far: header, prefixes, then agents, requests and branch ends in completion order."""
        body = [dict(r) for r in self._body]
        by_last = {int(name.split(":")[1], 16): (name, tokens) for name, tokens in self._prefixes.items()}
        for position, pages in self._fresh:  # fresh starts that turned out to hold a shared run: the longest
            for index in range(len(pages) - 1, -1, -1):
                found = by_last.get(pages[index])
                if found is not None and found[1] == (index + 1) * self.page_tokens:
                    name, tokens = found
                    record = body[position]
                    record["input"] = {"shared": name, "keep": tokens, "new": record["input"]["new"] - tokens}
                    break
        header = {"kind": "header", "version": 1, "name": self.name, "source": "evolving-infra router --record-trace",
                  "notes": RECORDER_NOTES}  # fmt: skip
        prefixes = [{"kind": "prefix", "name": n, "tokens": t} for n, t in self._prefixes.items()]
        self.report.agents = len(self._agents)
        self.report.branches = sum(1 for b in self._branches.values() if b.last_rid is not None)
        return [header, *prefixes, *body]

    # -- helpers ---------------------------------------------------------------------------------------
    def _time(self, now: float) -> float:
        if self._origin is None:
            self._origin = now
        return (now - self._origin) * self.time_scale

    def _new_rid(self) -> str:
        self._rid_count += 1
        return f"r{self._rid_count}"

    def _branch(self, key: str, parent: str | None) -> _Branch:
        b = self._branches.get(key)
        if b is not None and not b.finished:
            return b
        p = self._branches.get(parent) if parent is not None else None
        tid = f"b{len(self._all_branches)}"
        agent = p.agent if p is not None else f"a{len(self._all_branches)}"
        b = _Branch(tid, agent, p)
        self._branches[key] = b
        self._all_branches.append(b)
        return b

    def _keep(self, prompt: Sequence[int], pages: Sequence[PageHash], c: _Done) -> int:
        if len(prompt) >= c.context and _whole(prompt[: c.context]) == c.context_hash:
            self.report.appends += 1
            return c.context
        if len(prompt) >= c.prompt and _whole(prompt[: c.prompt]) == c.prompt_hash:
            self.report.retries += 1
            return c.prompt
        shared = 0
        for mine, theirs in zip(pages, c.pages, strict=False):
            if mine != theirs:
                break
            shared += 1
        if shared:
            self.report.page_keeps += 1
        return min(shared * self.page_tokens, c.context)

    def _run(self, pages: Sequence[PageHash]) -> int:
        """Longest leading run of `pages` that some completed context or handed-over prompt holds (chained
        hashes: monotone)."""
        lo, hi = 0, len(pages)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if pages[mid - 1] in self._producer or pages[mid - 1] in self._prompted:
                lo = mid
            else:
                hi = mid - 1
        return lo


MODELS_KIND = "evolving-infra-node-models"


def models_document(fitted: Mapping[NodeId, FittedNodeModel], *, profile: str) -> dict[str, Any]:
    """The fitted node models as JSON data (`simulate --models-from` reads it): per node the prefill
    coefficients (eq. 1), the decode coefficients and MoE shape (eq. 2), and the measured t̄_n and f_n; a phase
    the warmup could not fit is null. Empty `nodes` when the router used the profile's models."""
    nodes: dict[str, Any] = {}
    for node, model in sorted(fitted.items()):
        p, d = model.prefill, model.decode
        nodes[str(node)] = {
            "prefill": None if p is None else {"c0": p.c0, "c1": p.c1, "c2": p.c2, "c3": p.c3},
            "decode": None if d is None else {"d0": d.d0, "d1": d.d1, "d2": d.d2, "k": d.k, "experts": d.experts,
                                              "t_fwd": d.t_fwd},
            "t_bar": model.usage.t_bar, "f_restore": model.usage.f_restore,
        }  # fmt: skip
    return {"kind": MODELS_KIND, "version": 1, "profile": profile, "nodes": nodes}
