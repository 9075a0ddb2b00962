"""The prefill side of the engine core: the prefill queue, host/GPU admission, peer fetches, loads and
chunked prefill iterations.

A queued prefill request moves through stages (see `PrefillStage`):
WAIT_HOST -> (FETCHING) -> WAIT_GPU -> (LOADING) -> READY -> RUNNING -> finished, with ASYNC_FETCH; with
HICACHE_LOADBACK it is READY right after host admission (its fetch may still run) and does its GPU
admission, the landing of its fetch and the load of its prefix when its first chunk is scheduled.

- **Host admission** pins the request's reusable prefix in L2 (pages in L2 up to the first page that is
  neither local nor in the fetch plan) and takes in-use L2 slots for the pages to fetch, all at once or
  not at all. Planned pages that are already local, being fetched by another request, or past that
  first gap, are not fetched.
- Both admissions are first come, first served: a request that does not fit holds up the admissions
  behind it (no starvation of large requests), while a request waiting for a fetch or a load never does.
- **GPU admission** takes the whole L1 footprint at once or not at all: pins on the prefix pages in L1,
  in-use slots for the prefix pages to load from L2 (restored tokens, charged to eq. 1's c3 once), and
  reserved slots for every page the request will write (uncached prompt pages, the partial last page
  and, when it decodes here, its output pages). A request whose footprint is taken always runs to the
  end, so admission can wait but never deadlocks. The prefix stops one token short of the prompt, so a
  prefill always computes at least one token.
- **Chunked prefill**: a budget of `chunk_tokens` per iteration, filled with running requests first and
  then ready ones, each in arrival order; a request waiting for a fetch or a load never blocks the
  requests behind it. Each chunk is a `PrefillItem(t_uc=chunk, t_c=tokens before it, t_rst)`.

Boundary: owns the prefill jobs; the pool, the profile and the clock come from the engine core.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import repeat

from evolving_infra.core.itermodel import PrefillItem
from evolving_infra.core.pages import PageHash
from evolving_infra.core.types import NodeId, RequestId, Tier
from evolving_infra.node_agent.engine.chainrun import ChainRun
from evolving_infra.node_agent.engine.errors import PoolInvariantError
from evolving_infra.node_agent.engine.idpages import Ids
from evolving_infra.node_agent.engine.kvpool import KvPool
from evolving_infra.node_agent.engine.outputs import DataPlane, FetchStarted, PrefillFinished, PrefillStarted
from evolving_infra.node_agent.engine.requests import PrefillRequest, pages_needed
from evolving_infra.node_agent.engine.walks import Resolved, gpu_walk, host_walk, pin_walked
from evolving_infra.node_agent.profile import HardwareProfile


class Admission(enum.Enum):
    ADMITTED = "admitted"
    NO_ROOM = "no-room"
    NOT_YET = "not-yet"  # waiting for pages another request is bringing in


class PrefillStage(enum.Enum):
    WAIT_HOST = "wait-host"
    FETCHING = "fetching"
    WAIT_GPU = "wait-gpu"
    LOADING = "loading"
    READY = "ready"
    RUNNING = "running"


def fetch_table(req: PrefillRequest) -> dict[PageHash, tuple[NodeId, PageHash | None]]:
    """(peer, parent) of every page that `req`'s fetch plan names (its runs do not overlap)."""
    prompt = req.prompt_pages
    table: dict[PageHash, tuple[NodeId, PageHash | None]] = {}
    for run in req.fetch:
        start, end, peer = run.start, run.end, run.peer
        parents = prompt[start - 1 : end - 1] if start else (None, *prompt[: end - 1])
        table.update(zip(prompt[start:end], zip(repeat(peer), parents)))
    return table


@dataclass(eq=False)
class PrefillJob:
    """Mutable state of one prefill request on this node."""

    req: PrefillRequest
    stage: PrefillStage = PrefillStage.WAIT_HOST
    fetching: tuple[PageHash, ...] = ()
    fetch_due: float = 0.0  # when the fetch is expected to land (profile.fetch_time), for HiCache stalls
    fetch_pending: bool = False
    gpu_admitted: bool = False
    fetch_parents: tuple[PageHash | None, ...] = ()  # the parent of each page of `fetching`
    loading: list[tuple[PageHash, PageHash | None]] = field(default_factory=list)  # (page, parent) loaded from L2
    loading_ids: Ids | None = None  # (id tables) their ids, from the walk (current while L2 pins them)
    resolved: Resolved | None = None  # (id tables) the prefix's ids as the last walk resolved them
    ready_at: float = 0.0
    prefix_pages: int = 0
    restored_tokens: int = 0
    local_decode: bool = False
    footprint_output: bool = False  # whether the GPU footprint taken includes the output pages
    done: int = 0  # uncached tokens computed so far
    rst_charged: bool = False
    next_page: int = 0
    started_at: float | None = None
    _fetch_table: dict[PageHash, tuple[NodeId, PageHash | None]] | None = field(default=None, repr=False)

    @property
    def rid(self) -> RequestId:
        return self.req.request

    def parent(self, i: int) -> PageHash | None:
        return self.req.prompt_pages[i - 1] if i > 0 else None

    def fetch_table(self) -> dict[PageHash, tuple[NodeId, PageHash | None]]:
        """(peer, parent) of every page of the request's fetch plan, built once per request."""
        table = self._fetch_table
        if table is None:
            table = self._fetch_table = fetch_table(self.req)
        return table


@dataclass
class PrefillPlan:
    """One prefill iteration chosen but not yet applied."""

    chunks: list[tuple[PrefillJob, int]] = field(default_factory=list)
    items: list[PrefillItem] = field(default_factory=list)
    started: list[PrefillStarted] = field(default_factory=list)
    stall: float = 0.0


class PrefillScheduler:
    """Prefill jobs of one node (stages and rules in the module docstring)."""

    def __init__(self, node: NodeId, profile: HardwareProfile, pool: KvPool, data_plane: DataPlane) -> None:
        self.node = node
        self.profile = profile
        self.pool = pool
        self.data_plane = data_plane
        self.pt = profile.page_tokens
        self.jobs: dict[str, PrefillJob] = {}  # insertion order is arrival order
        self.load_bandwidth = profile.load_bandwidth
        """Host-to-GPU bandwidth a load gets now (`EngineCore.set_load_bandwidth`; the profile's by default)."""

    def load_time(self, tokens: int) -> float:
        """Seconds to load `tokens` of KV from host memory into GPU memory at the current load bandwidth."""
        return max(0, tokens) * self.profile.kv_bytes_per_token / self.load_bandwidth

    # --- queries -------------------------------------------------------------------------------------
    def _max_prefix(self, req: PrefillRequest) -> int:
        return min(len(req.prompt_pages), (req.prompt_tokens - 1) // self.pt)

    def running(self) -> list[PrefillJob]:
        return [j for j in self.jobs.values() if j.stage is PrefillStage.RUNNING]

    def ready(self) -> list[PrefillJob]:
        return [j for j in self.jobs.values() if j.stage is PrefillStage.READY]

    def has_runnable(self) -> bool:
        return any(j.stage in (PrefillStage.RUNNING, PrefillStage.READY) for j in self.jobs.values())

    def stage_counts(self) -> tuple[int, int]:
        """(running, waiting): jobs running, and queued jobs not yet runnable."""
        running = waiting = 0
        for job in self.jobs.values():
            stage = job.stage
            if stage is PrefillStage.RUNNING:
                running += 1
            elif stage is not PrefillStage.READY:
                waiting += 1
        return running, waiting

    def waiting(self) -> int:
        return sum(1 for j in self.jobs.values() if j.stage not in (PrefillStage.READY, PrefillStage.RUNNING))

    def wake_at(self) -> float | None:
        times = [j.ready_at for j in self.jobs.values() if j.stage is PrefillStage.LOADING]
        return min(times) if times else None

    # --- submission, fetches, admission --------------------------------------------------------------
    def submit(self, req: PrefillRequest) -> None:
        self.jobs[req.request] = PrefillJob(req)

    def admit(self, now: float, local_ok: bool) -> list[FetchStarted]:
        """Host admissions, finished loads and (ASYNC_FETCH) GPU admissions, in arrival order. A request
        that does not fit stops the admissions of that tier behind it (first come, first served), while
        requests waiting for a fetch or a load never hold up the ones behind them."""
        fetches: list[FetchStarted] = []
        host_open = gpu_open = True
        for job in list(self.jobs.values()):
            if job.stage is PrefillStage.WAIT_HOST and host_open:
                admitted, started = self._admit_host(job, now)
                fetches.extend(started)
                host_open = admitted
            if job.stage is PrefillStage.LOADING and job.ready_at <= now:
                self._finish_load(job)
            if job.stage is PrefillStage.WAIT_GPU and gpu_open:
                outcome = self._admit_gpu(job, now, local_ok)
                gpu_open = outcome is not Admission.NO_ROOM
                if job.stage is PrefillStage.LOADING and job.ready_at <= now:  # type: ignore[comparison-overlap]  # set by _admit_gpu
                    self._finish_load(job)
        return fetches

    def _admit_host(self, job: PrefillJob, now: float) -> tuple[bool, list[FetchStarted]]:
        req, l2 = job.req, self.pool.l2
        # the table of the fetch plan is built when the walk first needs it
        pins, pin_ids, fetch, job.resolved = host_walk(
            self.pool, req.prompt_pages[: self._max_prefix(req)], job.fetch_table, job.resolved
        )
        if fetch and l2.lacks_room(len(fetch), pins):
            return False, []
        # Pinning first keeps the prefix out of the eviction that makes room (as excluding it would).
        pin_walked(self.pool, Tier.HOST, job.rid, pins, pin_ids, now)
        if not self.pool.make_room(Tier.HOST, len(fetch), now):
            raise PoolInvariantError(f"host: room for {job.rid} vanished while making it")
        self.pool.begin_writes(Tier.HOST, job.rid, fetch)
        job.fetching = tuple(fetch)
        async_fetch = self.data_plane is DataPlane.ASYNC_FETCH
        if not fetch:
            job.stage = PrefillStage.WAIT_GPU if async_fetch else PrefillStage.READY
            return True, []
        table = job.fetch_table()  # built by the walk (cached on the job)
        job.fetch_parents = tuple(table[p][1] for p in fetch)
        job.fetch_pending = True
        job.stage = PrefillStage.FETCHING if async_fetch else PrefillStage.READY
        out: list[FetchStarted] = []
        for peer in dict.fromkeys(table[p][0] for p in fetch):
            pages = tuple(p for p in fetch if table[p][0] == peer)
            tokens = len(pages) * self.pt
            out.append(FetchStarted(job.rid, peer, pages, tokens, tokens * self.profile.kv_bytes_per_token, now))
            job.fetch_due = max(job.fetch_due, now + self.profile.fetch_time(tokens))
        return True, out

    def fetch_completed(self, rid: str, now: float, failed: frozenset[PageHash] = frozenset()) -> bool:
        """The driver finished the fetch of `rid`; `failed` pages never arrived, so they are not landed and
        the prefill recomputes from the first of them (its prefix ends there). False if the engine no
        longer waits for the fetch."""
        job = self.jobs.get(rid)
        if job is None or not job.fetch_pending:
            return False
        self._land_fetch(job, now, failed)
        if job.stage is PrefillStage.FETCHING:
            job.stage = PrefillStage.WAIT_GPU
        return True

    def fetch_expected(self, rid: str, at: float) -> None:
        """The driver's estimate of when the fetch of `rid` lands (see `EngineCore.fetch_expected`)."""
        job = self.jobs.get(rid)
        if job is not None and job.fetch_pending:
            job.fetch_due = at

    def _land_fetch(self, job: PrefillJob, now: float, failed: frozenset[PageHash] = frozenset()) -> None:
        landed = list(zip(job.fetching, job.fetch_parents))
        if failed:
            landed = [pair for pair in landed if pair[0] not in failed]
            self.pool.cancel_writes(Tier.HOST, job.rid, [p for p in job.fetching if p in failed])
        self.pool.land_all(Tier.HOST, job.rid, landed, now)
        job.fetch_pending = False

    def _admit_gpu(self, job: PrefillJob, now: float, local_ok: bool) -> Admission:
        req, l1, l2 = job.req, self.pool.l1, self.pool.l2
        if l1.writing and not l1.writing_set().isdisjoint(req.prompt_pages):
            return Admission.NOT_YET  # another request is loading part of this prompt: reuse it once loaded
        async_fetch = self.data_plane is DataPlane.ASYNC_FETCH
        if async_fetch and l2.writing and not l2.writing_set().isdisjoint(req.prompt_pages):
            return Admission.NOT_YET  # part of the prefix is still arriving with another request's fetch
        walk = gpu_walk(self.pool, req.prompt_pages[: self._max_prefix(req)], job.resolved)
        job.resolved = walk.resolved
        in_l1, loads = walk.in_l1, walk.loads  # reused from L1; (page, parent) of the prefix pages to load from L2
        k = len(in_l1) + len(loads)
        local = local_ok
        total = pages_needed(req.prompt_tokens + (req.output_tokens if local else 0), self.pt)
        writes = total - k
        if l1.lacks_room(writes + len(loads), in_l1):
            return Admission.NO_ROOM
        if loads:  # keep the sources in L2 while L1 makes room (write-backs may evict)
            held = l2.pinned_by(job.rid)
            if not held:
                pin_walked(self.pool, Tier.HOST, job.rid, [page for page, _ in loads], walk.load_ids, now)
            else:
                l2.pin_all(job.rid, [page for page, _ in loads if page not in held], now)
        # Pinning first keeps the reused pages out of the eviction that makes room (as excluding them would).
        pin_walked(self.pool, Tier.GPU, job.rid, in_l1, walk.l1_ids, now)
        if not self.pool.make_room(Tier.GPU, writes + len(loads), now):
            raise PoolInvariantError(f"gpu: room for {job.rid} vanished while making it")
        l1.reserve(job.rid, writes)
        job.gpu_admitted = True
        job.prefix_pages = k
        job.next_page = k
        job.restored_tokens = len(loads) * self.pt
        job.local_decode = local
        job.footprint_output = local
        job.loading = loads
        job.loading_ids = walk.load_ids  # (the loads stay pinned in L2 until they land: their ids stay theirs)
        if self.data_plane is DataPlane.ASYNC_FETCH and loads:
            self.pool.begin_writes(Tier.GPU, job.rid, [page for page, _ in loads])
            job.ready_at = now + self.load_time(job.restored_tokens)
            job.stage = PrefillStage.LOADING
        else:
            self.pool.store_all(Tier.GPU, loads, now, owner=job.rid, from_reservation=False, ids=walk.load_ids)
            l2.unpin_all(job.rid, now)
            job.stage = PrefillStage.READY
        return Admission.ADMITTED

    def _finish_load(self, job: PrefillJob) -> None:
        self.pool.land_all(Tier.GPU, job.rid, job.loading, job.ready_at, ids=job.loading_ids)
        self.pool.l2.unpin_all(job.rid, job.ready_at)
        job.stage = PrefillStage.READY

    # --- iterations ----------------------------------------------------------------------------------
    def plan(self, now: float, local_ok: bool) -> PrefillPlan:
        """Choose this iteration's chunks; with HICACHE_LOADBACK, admit starters and price their loads."""
        plan = PrefillPlan()
        budget = self.profile.chunk_tokens
        fetch_wait = 0.0
        for job in self._in_order():
            if budget <= 0:
                break
            if job.stage is PrefillStage.READY and not job.gpu_admitted:
                pending = job.fetch_pending
                if pending:
                    self._land_fetch(job, now)  # the iteration waits for the rest of the fetch
                if self._admit_gpu(job, now, local_ok) is not Admission.ADMITTED:
                    break  # first come, first served: later requests do not overtake it
                if pending:
                    fetch_wait = max(fetch_wait, job.fetch_due - now)
                plan.stall += self.load_time(job.restored_tokens)
            if job.stage is PrefillStage.READY:
                job.local_decode = job.local_decode and local_ok
                job.stage = PrefillStage.RUNNING
                job.started_at = now
                plan.started.append(self._started(job, now))
            remaining = job.req.prompt_tokens - job.prefix_pages * self.pt - job.done
            chunk = min(remaining, budget)
            budget -= chunk
            t_rst = 0 if job.rst_charged else job.restored_tokens
            job.rst_charged = True
            plan.chunks.append((job, chunk))
            plan.items.append(PrefillItem(t_uc=chunk, t_c=job.prefix_pages * self.pt + job.done, t_rst=t_rst))
        plan.stall += max(0.0, fetch_wait)
        return plan

    def _in_order(self) -> Iterator[PrefillJob]:
        yield from self.running()
        yield from self.ready()

    def _started(self, job: PrefillJob, now: float) -> PrefillStarted:
        cached = job.prefix_pages * self.pt
        req = job.req
        return PrefillStarted(
            req.request, req.branch, now, req.prompt_tokens, cached, job.restored_tokens, job.local_decode
        )

    def apply(self, plan: PrefillPlan, end: float) -> list[tuple[PrefillJob, PrefillFinished]]:
        """Write the chunks' full pages (L1, through to L2); finish requests whose prompt is done."""
        finished: list[tuple[PrefillJob, PrefillFinished]] = []
        for job, chunk in plan.chunks:
            req = job.req
            job.done += chunk
            covered = job.prefix_pages * self.pt + job.done
            full = min(len(req.prompt_pages), covered // self.pt)
            if full > job.next_page:
                self.pool.store_chain(ChainRun.of(req.prompt_pages, job.next_page, full), end, owner=job.rid)
                job.next_page = full
            if covered < req.prompt_tokens:
                continue
            del self.jobs[job.rid]
            if not job.local_decode:
                self.pool.release(job.rid, end)
            done = PrefillFinished(req.request, req.branch, end, req.prompt_pages, req.prompt_tokens, job.local_decode)
            finished.append((job, done))
        return finished

    def cancel(self, rid: str, now: float) -> bool:
        """Drop one prefill, queued or running (its client went away): its pins, reserved slots and
        unfinished writes (a fetch or a load in flight) are released; pages it already wrote stay cached.
        False when the node holds no such prefill (finished, handed back, never here)."""
        job = self.jobs.pop(rid, None)
        if job is None:
            return False
        self.pool.release(rid, now)
        return True

    def hand_back(self, now: float) -> list[PrefillRequest]:
        """Drop every queued (not running) request, releasing its pins, slots and fetch; arrival order."""
        out: list[PrefillRequest] = []
        for job in list(self.jobs.values()):
            if job.stage is PrefillStage.RUNNING:
                continue
            self.pool.release(job.rid, now)
            del self.jobs[job.rid]
            out.append(job.req)
        return out
