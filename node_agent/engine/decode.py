"""The decode side of the engine core: admission of transferred requests and continuous decode batching.

- **Admission** (first come, first served; at submission and before every iteration) takes a
  request's whole L1 footprint at once: its prompt's full pages (received by the KV transfer, pinned;
  pages already in L1 are reused) and reserved slots for the partial last page and every page its output
  will fill. The received pages are written through to L2. A decode node never loads from its own L2 for
  a running batch. A request that does not fit waits in the decode queue.
- **Iteration**: every running request advances by `t_acc` tokens per iteration, accumulated
  fractionally and deterministically: after `i` iterations it has produced `min(t_out, floor(i * t_acc))`
  tokens, so it finishes exactly at its output length. Each full page that generation completes is
  written to L1 and through to L2; a finished request's pages stay cached in both tiers.
- Collocated mode: a prefill finished on this node is *adopted* with the pins and reserved slots its
  prefill admission already took (no transfer).

Boundary: owns the decode jobs; the pool, the profile and the clock come from the engine core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, Tier
from evolving_infra.node_agent.engine.kvpool import KvPool
from evolving_infra.node_agent.engine.outputs import DecodeFinished
from evolving_infra.node_agent.engine.requests import (
    DecodeRequest,
    PrefillRequest,
    generated_pages,
    pages_needed,
)
from evolving_infra.node_agent.profile import HardwareProfile

_EPS = 1e-9


@dataclass(eq=False)
class DecodeJob:
    """Mutable state of one decode request on this node."""

    rid: str
    branch: BranchId
    pages: tuple[PageHash, ...]  # prompt pages, then generated pages
    prompt_pages: int
    prompt_tokens: int
    output_tokens: int
    t_acc: float
    origin: DecodeRequest | None  # None when adopted from a local prefill
    admitted: bool = False
    produced: int = 0
    iterations: int = 0
    next_page: int = 0

    def parent(self, i: int) -> PageHash | None:
        return self.pages[i - 1] if i > 0 else None


class DecodeScheduler:
    """Decode jobs of one node (rules in the module docstring)."""

    def __init__(self, node: NodeId, profile: HardwareProfile, pool: KvPool) -> None:
        self.node = node
        self.profile = profile
        self.pool = pool
        self.pt = profile.page_tokens
        self.jobs: dict[str, DecodeJob] = {}  # insertion order is arrival order

    def _job(self, req: DecodeRequest | PrefillRequest, origin: DecodeRequest | None) -> DecodeJob:
        gen = generated_pages(req, self.pt)
        return DecodeJob(
            req.request,
            req.branch,
            tuple(req.prompt_pages) + tuple(gen),
            len(req.prompt_pages),
            req.prompt_tokens,
            req.output_tokens,
            req.t_acc,
            origin,
        )

    # --- queries -------------------------------------------------------------------------------------
    def running(self) -> list[DecodeJob]:
        return [j for j in self.jobs.values() if j.admitted]

    def queued(self) -> int:
        return sum(1 for j in self.jobs.values() if not j.admitted)

    def has_running(self) -> bool:
        return any(j.admitted for j in self.jobs.values())

    # --- admission -----------------------------------------------------------------------------------
    def submit(self, req: DecodeRequest) -> None:
        self.jobs[req.request] = self._job(req, req)

    def adopt(self, req: PrefillRequest) -> None:
        """Continue a prefill finished on this node; its pins and reserved slots carry over."""
        job = self._job(req, None)
        job.admitted = True
        job.next_page = job.prompt_pages
        self.jobs[job.rid] = job

    def admit(self, now: float) -> None:
        l1 = self.pool.l1
        for job in list(self.jobs.values()):
            if job.admitted:
                continue
            prompt = job.pages[: job.prompt_pages]
            if l1.writing and any(l1.is_writing(p) for p in prompt):
                continue  # a load into L1 is bringing some of these pages: reuse them once it lands
            resident = [p for p in prompt if l1.contains(p)]
            total = pages_needed(job.prompt_tokens + job.output_tokens, self.pt)
            if not self.pool.make_room(Tier.GPU, total - len(resident), now, exclude=resident):
                break  # first come, first served: later requests do not overtake it
            for page in resident:
                l1.pin(job.rid, page, now)
            l1.reserve(job.rid, total - len(resident))
            for i, page in enumerate(prompt):
                if page not in resident:
                    self.pool.store(Tier.GPU, page, job.parent(i), now, owner=job.rid)
            job.admitted = True
            job.next_page = job.prompt_pages

    # --- iterations ----------------------------------------------------------------------------------
    def apply(self, end: float) -> tuple[dict[str, int], list[DecodeFinished]]:
        """One decode iteration ending at `end`: tokens per running request, and those that finished."""
        tokens: dict[str, int] = {}
        finished: list[DecodeFinished] = []
        for job in self.running():
            job.iterations += 1
            total = min(job.output_tokens, math.floor(job.iterations * job.t_acc + _EPS))
            tokens[job.rid] = total - job.produced
            job.produced = total
            self._write_pages(job, end)
            if job.produced >= job.output_tokens:
                finished.append(self._finish(job, end))
        return tokens, finished

    def _write_pages(self, job: DecodeJob, end: float) -> None:
        full = (job.prompt_tokens + job.produced) // self.pt
        while job.next_page < min(full, len(job.pages)):
            i = job.next_page
            self.pool.store(Tier.GPU, job.pages[i], job.parent(i), end, owner=job.rid)
            job.next_page += 1

    def _finish(self, job: DecodeJob, end: float) -> DecodeFinished:
        del self.jobs[job.rid]
        self.pool.release(job.rid, end)
        return DecodeFinished(job.rid, job.branch, end, job.produced)

    def finish_empty(self, rid: str, end: float) -> DecodeFinished:
        """An adopted request with no output finishes at once."""
        return self._finish(self.jobs[rid], end)

    def hand_back(self, now: float) -> list[DecodeRequest]:
        """Drop every queued (not admitted) request, in arrival order."""
        out: list[DecodeRequest] = []
        for job in list(self.jobs.values()):
            if job.admitted or job.origin is None:
                continue
            self.pool.release(job.rid, now)
            del self.jobs[job.rid]
            out.append(job.origin)
        return out
