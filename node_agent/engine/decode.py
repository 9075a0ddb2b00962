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
from evolving_infra.node_agent.engine.errors import PoolInvariantError
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
        self._queue: dict[str, DecodeJob] = {}  # the jobs not admitted yet, in arrival order
        self._running: list[DecodeJob] | None = None  # admitted jobs in arrival order; None: recompute

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
        """Admitted jobs in arrival order (a cached list: do not change it)."""
        if self._running is None:
            self._running = [j for j in self.jobs.values() if j.admitted]
        return self._running

    def queued(self) -> int:
        return len(self._queue)

    def has_running(self) -> bool:
        return len(self.jobs) > len(self._queue)

    # --- admission -----------------------------------------------------------------------------------
    def submit(self, req: DecodeRequest) -> None:
        job = self.jobs[req.request] = self._job(req, req)
        self._queue[job.rid] = job

    def adopt(self, req: PrefillRequest) -> None:
        """Continue a prefill finished on this node; its pins and reserved slots carry over."""
        job = self._job(req, None)
        job.admitted = True
        job.next_page = job.prompt_pages
        self.jobs[job.rid] = job
        self._running = None

    def admit(self, now: float) -> None:
        if not self._queue:
            return
        l1 = self.pool.l1
        for job in list(self._queue.values()):
            prompt = job.pages[: job.prompt_pages]
            if l1.writing and not l1.writing_set().isdisjoint(prompt):
                continue  # a load into L1 is bringing some of these pages: reuse them once it lands
            resident = l1.resident_set() & prompt
            need = pages_needed(job.prompt_tokens + job.output_tokens, self.pt) - len(resident)
            if need > l1.free and l1.room(resident) < need:
                break  # first come, first served: later requests do not overtake it
            # Pinning first keeps the reused pages out of the eviction that makes room (as excluding them would).
            l1.pin_all(job.rid, resident, now)
            if not self.pool.make_room(Tier.GPU, need, now):
                raise PoolInvariantError(f"gpu: room for {job.rid} vanished while making it")
            l1.reserve(job.rid, need)
            received = [(page, job.parent(i)) for i, page in enumerate(prompt) if page not in resident]
            self.pool.store_all(Tier.GPU, received, now, owner=job.rid)
            job.admitted = True
            job.next_page = job.prompt_pages
            del self._queue[job.rid]
            self._running = None

    # --- iterations ----------------------------------------------------------------------------------
    def apply(self, end: float) -> tuple[dict[str, int], list[DecodeFinished]]:
        """One decode iteration ending at `end`: tokens per running request, and those that finished."""
        tokens: dict[str, int] = {}
        finished: list[DecodeFinished] = []
        pt, floor = self.pt, math.floor
        for job in self.running():
            job.iterations = i = job.iterations + 1
            total = min(job.output_tokens, floor(i * job.t_acc + _EPS))
            tokens[job.rid] = total - job.produced
            job.produced = total
            if (job.prompt_tokens + total) // pt > job.next_page < len(job.pages):
                self._write_pages(job, end)
            if total >= job.output_tokens:
                finished.append(self._finish(job, end))
        return tokens, finished

    def _write_pages(self, job: DecodeJob, end: float) -> None:
        full = min((job.prompt_tokens + job.produced) // self.pt, len(job.pages))
        first = job.next_page
        if full - first == 1:
            self.pool.store(Tier.GPU, job.pages[first], job.parent(first), end, owner=job.rid)
        elif full > first:
            self.pool.store_all(Tier.GPU, [(job.pages[i], job.parent(i)) for i in range(first, full)], end, owner=job.rid)
        job.next_page = max(first, full)

    def _finish(self, job: DecodeJob, end: float) -> DecodeFinished:
        del self.jobs[job.rid]
        self._running = None
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
            del self._queue[job.rid]
            out.append(job.origin)
        return out
