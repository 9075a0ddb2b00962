"""The decode side of the engine core: admission of transferred requests and continuous decode batching.

- **Admission** (first come, first served; at submission and before every iteration) takes a
  request's whole L1 footprint at once: its prompt's full pages (received by the KV transfer, pinned;
  pages already in L1 are reused) and reserved slots for the partial last page and every page its output
  will fill. The received pages are written through to L2. A decode node never loads from its own L2 for
  a running batch. A request that does not fit waits in the decode queue.
- **Iteration**: every running request advances by `t_acc` tokens per iteration, accumulated
  fractionally and deterministically: after `i` iterations it has produced `min(t_out, floor(i * t_acc))`
  tokens, so it finishes exactly at its output length. The full pages its generation filled are cached
  when it finishes (written to L1 from its reserved slots, through to L2, published as KV events, all
  stamped with the finish time), as an SGLang decode server caches a request's KV in its radix tree only
  at the request's end (`SchedulerOutputProcessorMixin.process_batch_result_decode` ->
  `release_kv_cache`); until then the slots are reserved, so GPU memory is charged the same. A request
  cancelled while running caches the pages it filled so far (an abort releases the same way). No later
  request can use a running request's output before it ends (the next step of its branch, or a fork
  from it, is issued after it), so only the time of the writes moves (and with it when L2 makes room
  for them).
  Since a request's progress is a function of its iteration count, an iteration only touches the requests
  that finish in it (and, when the driver wants tokens per step, reads every request's count): each
  running request waits in a heap keyed by the iteration it finishes in, then arrival order, so the pool
  sees the same writes and finishes in the same order as if every request were advanced every iteration.
- Collocated mode: a prefill finished on this node is *adopted* with the pins and reserved slots its
  prefill admission already took (no transfer).

Boundary: owns the decode jobs; the pool, the profile and the clock come from the engine core.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import BranchId, NodeId, RequestId, Tier
from evolving_infra.node_agent.engine.chainrun import ChainRun
from evolving_infra.node_agent.engine.kvpool import KvPool
from evolving_infra.node_agent.engine.outputs import DecodeFinished
from evolving_infra.node_agent.engine.requests import (
    DecodeRequest,
    PrefillRequest,
    generated_pages,
    pages_needed,
)
from evolving_infra.node_agent.engine.walks import admit_prompt
from evolving_infra.node_agent.profile import HardwareProfile

_EPS = 1e-9


@dataclass(eq=False)
class DecodeJob:
    """Mutable state of one decode request on this node."""

    rid: RequestId
    branch: BranchId
    pages: tuple[PageHash, ...]  # prompt pages, then generated pages
    prompt_pages: int
    prompt_tokens: int
    output_tokens: int
    t_acc: float
    origin: DecodeRequest | None  # None when adopted from a local prefill
    seq: int  # arrival order on this node
    admitted: bool = False
    produced: int = 0  # tokens produced, set when it finishes or is cancelled (its pages are written then)
    start: int = 0  # the scheduler's iteration count when the job was admitted

    def produced_after(self, iterations: int) -> int:
        """Tokens produced after `iterations` iterations of this job."""
        return min(self.output_tokens, math.floor(iterations * self.t_acc + _EPS))

    def finish_iteration(self) -> int:
        """The iteration count (>= 1) at which the job finishes (its pages are written then)."""
        target = self.output_tokens
        t_acc, floor = self.t_acc, math.floor
        i = max(1, math.ceil((target - _EPS) / t_acc))  # then correct the estimate's rounding
        while i > 1 and floor((i - 1) * t_acc + _EPS) >= target:
            i -= 1
        while floor(i * t_acc + _EPS) < target:
            i += 1
        return i

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
        self._iteration = 0  # decode iterations run on this node
        self._due: list[tuple[int, int, DecodeJob]] = []  # (iteration of the next event, seq, job) per running job
        self._seq = 0
        # context of the running batch, carried so an iteration needs no pass over it: sum of prompt tokens,
        # of t_acc and of t_acc * start over the admitted jobs (produced tokens ~ t_acc * iterations run)
        self._ctx_prompt = 0
        self._ctx_acc = 0.0
        self._ctx_acc_start = 0.0

    def _job(self, req: DecodeRequest | PrefillRequest, origin: DecodeRequest | None) -> DecodeJob:
        gen = generated_pages(req, self.pt)
        self._seq += 1
        return DecodeJob(
            req.request,
            req.branch,
            tuple(req.prompt_pages) + tuple(gen),
            len(req.prompt_pages),
            req.prompt_tokens,
            req.output_tokens,
            req.t_acc,
            origin,
            self._seq,
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

    def context_tokens(self) -> float:
        """Tokens the running batch attends to at its next iteration: prompts plus tokens produced so far
        (`t_acc` per iteration run, without the rounding to whole tokens)."""
        if not self.has_running():
            return 0.0
        return self.context_at(self._iteration)

    def context_at(self, iteration: int) -> float:
        """`context_tokens` at the iteration that starts after `iteration` iterations, for the batch running now."""
        return self._ctx_prompt + iteration * self._ctx_acc - self._ctx_acc_start

    def _track(self, job: DecodeJob, sign: int) -> None:
        self._ctx_prompt += sign * job.prompt_tokens
        self._ctx_acc += sign * job.t_acc
        self._ctx_acc_start += sign * job.t_acc * job.start
        if not self.has_running():
            self._ctx_prompt, self._ctx_acc, self._ctx_acc_start = 0, 0.0, 0.0

    # --- admission -----------------------------------------------------------------------------------
    def submit(self, req: DecodeRequest) -> None:
        job = self.jobs[req.request] = self._job(req, req)
        self._queue[job.rid] = job

    def adopt(self, req: PrefillRequest) -> None:
        """Continue a prefill finished on this node; its pins and reserved slots carry over."""
        job = self._job(req, None)
        self.jobs[job.rid] = job
        self._start(job)

    def admit(self, now: float) -> None:
        if not self._queue:
            return
        l1 = self.pool.l1
        for job in list(self._queue.values()):
            prompt = job.pages[: job.prompt_pages]
            if l1.writing and not l1.writing_set().isdisjoint(prompt):
                continue  # a load into L1 is bringing some of these pages: reuse them once it lands
            footprint = pages_needed(job.prompt_tokens + job.output_tokens, self.pt)
            if not admit_prompt(self.pool, job.rid, prompt, footprint, now):
                break  # first come, first served: later requests do not overtake it
            del self._queue[job.rid]
            self._start(job)

    def _start(self, job: DecodeJob) -> None:
        job.admitted = True
        job.start = self._iteration
        self._running = None
        self._track(job, 1)
        if job.output_tokens > 0:  # an adopted job without output finishes at once (`finish_empty`)
            heapq.heappush(self._due, (self._iteration + job.finish_iteration(), job.seq, job))

    # --- iterations ----------------------------------------------------------------------------------
    def quiet_next(self) -> bool:
        """Whether the next iteration would only advance the running jobs: some run, none waits for admission,
        and no job finishes in it (`advance_quiet` is then that iteration)."""
        due = self._due
        return not self._queue and bool(due) and due[0][0] > self._iteration + 1 and self.has_running()

    def quiet_count(self) -> int:
        """How many quiet iterations follow one another from now if nothing comes in (0 if the next is not)."""
        return self._due[0][0] - self._iteration - 1 if self.quiet_next() else 0

    def advance_quiet(self, iterations: int = 1) -> None:
        """Quiet iterations (`quiet_count`): `apply` without tokens, when nothing is due in them."""
        self._iteration += iterations

    @property
    def iteration(self) -> int:
        """Decode iterations run on this node."""
        return self._iteration

    def apply(self, end: float, report_tokens: bool = True) -> tuple[dict[RequestId, int], list[DecodeFinished]]:
        """One decode iteration ending at `end`: tokens per running request (only if `report_tokens`), and
        those that finished."""
        self._iteration = now = self._iteration + 1
        tokens: dict[RequestId, int] = {}
        if report_tokens:
            for job in self.running():
                i = now - job.start
                tokens[job.rid] = job.produced_after(i) - job.produced_after(i - 1)
        finished: list[DecodeFinished] = []
        due = self._due
        while due and due[0][0] <= now:
            job = heapq.heappop(due)[2]
            if self.jobs.get(job.rid) is not job:
                continue  # left the node
            job.produced = job.produced_after(now - job.start)  # its output: due when it finishes
            self._write_pages(job, end)
            finished.append(self._finish(job, end))
        return tokens, finished

    def _write_pages(self, job: DecodeJob, end: float) -> None:
        """Cache the full pages `job.produced` tokens filled (once: at its finish or cancellation)."""
        full = min((job.prompt_tokens + job.produced) // self.pt, len(job.pages))
        first = job.prompt_pages
        if full - first == 1:
            self.pool.store(Tier.GPU, job.pages[first], job.parent(first), end, owner=job.rid)
        elif full > first:
            self.pool.store_chain(ChainRun.of(job.pages, first, full), end, owner=job.rid)

    def _finish(self, job: DecodeJob, end: float) -> DecodeFinished:
        del self.jobs[job.rid]
        self._running = None
        self._track(job, -1)
        self.pool.release(job.rid, end)
        return DecodeFinished(job.rid, job.branch, end, job.produced)

    def finish_empty(self, rid: str, end: float) -> DecodeFinished:
        """An adopted request with no output finishes at once."""
        return self._finish(self.jobs[rid], end)

    def cancel(self, rid: str, now: float) -> bool:
        """Drop one job, queued or running (its client went away): the full pages a running job filled are
        cached (as at its end), then its pins and reserved slots are released. False when the node holds no
        such job."""
        job = self.jobs.pop(rid, None)
        if job is None:
            return False
        if self._queue.pop(rid, None) is None:
            self._track(job, -1)  # it was running: the pages it filled are cached, as at its end
            job.produced = job.produced_after(self._iteration - job.start)
            self._write_pages(job, now)
        self._running = None  # its heap entry is skipped as "left the node"
        self.pool.release(rid, now)
        return True

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
