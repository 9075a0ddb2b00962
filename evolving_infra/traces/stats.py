"""Trace statistics: counts per workload and the ideal KV hit rate h*.

h* = (prompt tokens in full pages whose KV an earlier request, in file order, produced) / (all prompt tokens),
with an unlimited cache. A request produces KV for the full pages of its prompt and output except the last
output token (`ContentModel.produced_pages`). `ideal_hit_tokens` computes it from the trace's structure in
O(requests); `ideal_hit_tokens_from_pages` from the content model's page hashes, as a cross-check.
Counts are carried (never averaged averages); rates and means are derived from them.

Boundary: pure computation over a `Trace` and its `ContentModel`; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from evolving_infra.core.pages import DEFAULT_PAGE_TOKENS, validate_page_tokens
from evolving_infra.traces.content import ContentModel, ProgressFn
from evolving_infra.traces.records import Relation, Trace


@dataclass(frozen=True)
class Counts:
    """Additive counts over a set of requests (a workload, or the whole trace)."""

    agents: int = 0
    branches: int = 0
    requests: int = 0
    roots: int = 0
    appends: int = 0
    forks: int = 0
    sub_agents: int = 0
    compactions: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    ideal_hit_tokens: int = 0
    delay_s_total: float = 0.0

    @property
    def ideal_hit_rate(self) -> float:
        return self.ideal_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def mean_prompt_tokens(self) -> float:
        return self.prompt_tokens / self.requests if self.requests else 0.0

    @property
    def mean_output_tokens(self) -> float:
        return self.output_tokens / self.requests if self.requests else 0.0

    @property
    def mean_delay_s(self) -> float:
        """Mean `delay_s` over all requests (first requests of agents count with their delay, usually 0)."""
        return self.delay_s_total / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            ideal_hit_rate=self.ideal_hit_rate,
            mean_prompt_tokens=self.mean_prompt_tokens,
            mean_output_tokens=self.mean_output_tokens,
            mean_delay_s=self.mean_delay_s,
        )
        return out


@dataclass(frozen=True)
class TraceStats(Counts):
    """Counts of the whole trace, with the same counts per workload label."""

    name: str | None = None
    page_tokens: int = DEFAULT_PAGE_TOKENS
    prefixes: int = 0
    prefix_tokens: int = 0
    last_start_s: float = 0.0
    by_workload: Mapping[str, Counts] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["by_workload"] = {name: counts.to_dict() for name, counts in self.by_workload.items()}
        return out


_RELATION_FIELD = {
    Relation.ROOT: "roots",
    Relation.APPEND: "appends",
    Relation.FORK: "forks",
    Relation.SUB_AGENT: "sub_agents",
    Relation.REWRITE: "compactions",
}


def ideal_hit_tokens(trace: Trace, page_tokens: int = DEFAULT_PAGE_TOKENS) -> npt.NDArray[np.int64]:
    """Per request (file order): prompt tokens in full pages whose KV an earlier request produced.

    Computed from the structure alone, in O(requests), with the content model's invariant: page j of a
    request's prompt is page j of its source for j < keep // P and holds the request's own fresh tokens
    after that (so it was never produced before). Page j of a base b was produced by b itself unless it is
    the page holding b's last output token (j = len(context(b)) / P - 1, when P divides the context); that
    page is first produced by the first request that keeps it from b. The produced pages of a prefix grow
    as a leading run: the most any request starting from it has kept. `ideal_hit_tokens_from_pages`
    computes the same numbers from page hashes.
    """
    validate_page_tokens(page_tokens)
    size = page_tokens
    hits = np.zeros(len(trace.requests), dtype=np.int64)
    last_page_made = np.zeros(len(trace.requests), dtype=bool)
    prefix_run: dict[str, int] = {}
    for r in trace.requests:
        kept = r.keep // size
        if r.base is not None:
            b = trace.request(r.base)
            made = (b.context_tokens - 1) // size
            pages = min(kept, made)
            if kept > made:  # kept == len(context(b)) / P: the page with b's last output token
                pages += int(last_page_made[b.index])
                last_page_made[b.index] = True
        elif r.shared is not None:
            run = prefix_run.get(r.shared, 0)
            pages = min(kept, run)
            prefix_run[r.shared] = max(run, kept)
        else:
            pages = 0
        hits[r.index] = pages * size
    return hits


def ideal_hit_tokens_from_pages(model: ContentModel, progress: ProgressFn | None = None) -> npt.NDArray[np.int64]:
    """`ideal_hit_tokens` computed from the content model's page hashes (a cross-check of both).

    Every produced page hash is listed with its producer; a stable sort by hash puts each hash's first
    producer first; a prompt page is a hit when that first producer is an earlier request.
    """
    reqs = model.trace.requests
    size = model.page_tokens
    n = len(reqs)
    made = np.array([(r.context_tokens - 1) // size for r in reqs], dtype=np.int64)
    asked = np.array([r.prompt_tokens // size for r in reqs], dtype=np.int64)
    total = int(made.sum())
    hashes = np.empty(total, dtype=np.uint64)
    in_prompt = np.zeros(total, dtype=bool)
    owner = np.repeat(np.arange(n, dtype=np.int32), made)
    step = max(1, n // 100)
    at = 0
    for r in reqs:
        count = int(made[r.index])
        hashes[at : at + count] = model.context_pages(r.id)[:count]
        in_prompt[at : at + int(asked[r.index])] = True
        at += count
        if progress is not None and (r.index + 1 == n or (r.index + 1) % step == 0):
            progress(r.index + 1, n)
    order = np.argsort(hashes, kind="stable")
    hashes, owner, in_prompt = hashes[order], owner[order], in_prompt[order]
    del order
    starts = np.ones(total, dtype=bool)
    starts[1:] = hashes[1:] != hashes[:-1]
    first = owner[starts][np.cumsum(starts) - 1]
    hit = in_prompt & (first < owner)
    return np.bincount(owner[hit], minlength=n).astype(np.int64) * size


def trace_stats(trace: Trace, page_tokens: int = DEFAULT_PAGE_TOKENS) -> TraceStats:
    """Statistics of `trace` for pages of `page_tokens` tokens."""
    hits = ideal_hit_tokens(trace, page_tokens)
    per: dict[str, dict[str, Any]] = {}
    for agent in trace.agents.values():
        per.setdefault(agent.workload, dict(Counts().__dict__))["agents"] += 1
    for branch in trace.branches.values():
        per[trace.agents[branch.agent].workload]["branches"] += 1
    for r in trace.requests:
        acc = per[trace.agents[r.agent].workload]
        acc["requests"] += 1
        acc[_RELATION_FIELD[r.relation]] += 1
        acc["prompt_tokens"] += r.prompt_tokens
        acc["output_tokens"] += r.output_tokens
        acc["ideal_hit_tokens"] += int(hits[r.index])
        acc["delay_s_total"] += r.delay_s
    by_workload = {name: Counts(**acc) for name, acc in per.items()}
    total = {key: sum(acc[key] for acc in per.values()) for key in Counts().__dict__}
    return TraceStats(
        **total,
        name=trace.name,
        page_tokens=page_tokens,
        prefixes=len(trace.prefixes),
        prefix_tokens=sum(p.tokens for p in trace.prefixes.values()),
        last_start_s=max((a.start_s for a in trace.agents.values()), default=0.0),
        by_workload=by_workload,
    )
