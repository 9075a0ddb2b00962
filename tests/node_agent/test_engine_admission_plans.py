"""Admission plans built once per request against the per-attempt computations they replaced.

- `received_pages` (decode admission) equals the plain filter over the prompt for any resident subset
  (empty, a leading run of either length, scattered, everything).
- `fetch_table` (host admission) names the same peer and the same parent for every planned page as the
  page -> peer table and the prompt index of before.
- On random engines (both data planes, tiny tiers so that the host walk's capacity cut, evictions, failed
  fetches and L2 loads all happen): every host admission's fetch pages, their parents and the fetches started,
  and every GPU admission's (page, parent) loads, equal the old walks computed from the state the admission
  saw.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, RequestId, Tier
from evolving_infra.node_agent.engine import DataPlane, EngineCore, FetchRun, PrefillRequest
from evolving_infra.node_agent.engine.walks import received_pages
from evolving_infra.node_agent.engine.outputs import FetchStarted
from evolving_infra.node_agent.engine.chainrun import ChainRun
from evolving_infra.node_agent.engine.prefill import Admission, PrefillJob, PrefillScheduler, fetch_table
from evolving_infra.node_agent.profile import DecodeModel, HardwareProfile, PrefillModel

PAGE = 4
CHAIN_PAGES = 24
CHAINS = [chain_hashes(f"{c}:{i}".encode() for i in range(CHAIN_PAGES)) for c in range(3)]
# chains 0 and 1 share their first 8 pages
CHAINS[1] = CHAINS[0][:8] + chain_hashes((f"1:{i}".encode() for i in range(8, CHAIN_PAGES)), CHAINS[0][7])
PEERS = [NodeId("peer-a"), NodeId("peer-b")]


def _old_received(prompt: tuple[PageHash, ...], resident: set[PageHash]) -> list[tuple[PageHash, PageHash | None]]:
    return [(page, parent) for page, parent in zip(prompt, (None, *prompt)) if page not in resident]


@st.composite
def prompts_and_resident(draw: st.DrawFn) -> tuple[tuple[PageHash, ...], set[PageHash]]:
    n = draw(st.integers(0, 30))
    prompt = tuple(chain_hashes(f"p{i}".encode() for i in range(n)))
    kind = draw(st.sampled_from(["leading", "subset", "all", "none"]))
    if kind == "leading":
        resident = set(prompt[: draw(st.integers(0, n))])
    elif kind == "subset":
        resident = {p for p in prompt if draw(st.booleans())}
    elif kind == "all":
        resident = set(prompt)
    else:
        resident = set()
    return prompt, resident


@given(prompts_and_resident())
def test_received_pages_equal_the_filter_over_the_prompt(case: tuple[tuple[PageHash, ...], set[PageHash]]) -> None:
    prompt, resident = case
    assert received_pages(prompt, resident) == _old_received(prompt, resident)


@st.composite
def fetch_plans(draw: st.DrawFn) -> tuple[tuple[PageHash, ...], tuple[FetchRun, ...]]:
    """A prompt and non-overlapping fetch runs over it, each from one of two peers."""
    n = draw(st.integers(1, CHAIN_PAGES))
    prompt = tuple(CHAINS[draw(st.integers(0, 2))][:n])
    cuts = sorted(draw(st.sets(st.integers(0, n), max_size=6)))
    runs = []
    for start, end in zip(cuts, cuts[1:]):
        if draw(st.booleans()):
            runs.append(FetchRun(start, end, frozenset({draw(st.sampled_from(PEERS))}), prompt))
    return prompt, tuple(draw(st.permutations(runs)))


@given(fetch_plans())
def test_the_fetch_table_names_each_planned_page_s_peer_and_parent(case: tuple[tuple[PageHash, ...], tuple[FetchRun, ...]]) -> None:  # fmt: skip
    prompt, runs = case
    req = PrefillRequest(RequestId("r"), BranchId("b"), prompt, len(prompt) * PAGE + 1, fetch=runs)
    peer_of = {p: run.peer for run in runs for p in run.pages}
    index = {p: i for i, p in enumerate(prompt)}
    table = fetch_table(req)
    assert table == {p: (peer, prompt[index[p] - 1] if index[p] else None) for p, peer in peer_of.items()}
    job = PrefillJob(req)
    assert job.fetch_table() is job.fetch_table()  # once per request


# --- the old walks, from the state an admission sees -------------------------------------------------


def _old_host_walk(sched: PrefillScheduler, job: PrefillJob) -> tuple[bool, list[PageHash], list[PageHash | None], dict[NodeId, tuple[PageHash, ...]]]:  # fmt: skip
    req, l1, l2 = job.req, sched.pool.l1, sched.pool.l2
    peer_of = {p: run.peer for run in req.fetch for p in run.pages}
    pins: list[PageHash] = []
    fetch: list[PageHash] = []
    for page in req.prompt_pages[: sched._max_prefix(req)]:
        if len(pins) + len(fetch) >= l2.capacity:
            break
        if page in l2.resident_set():
            pins.append(page)
        elif page in l1.resident_set() or page in l2.writing_set():
            continue
        elif page in peer_of:
            fetch.append(page)
        else:
            break
    index = {p: i for i, p in enumerate(req.prompt_pages)}
    parents = [job.parent(index[p]) for p in fetch]
    groups = {peer: tuple(p for p in fetch if peer_of[p] == peer) for peer in dict.fromkeys(peer_of[p] for p in fetch)}
    fits = not (fetch and l2.lacks_room(len(fetch), pins))
    return fits, fetch, parents, groups


def _old_gpu_walk(sched: PrefillScheduler, job: PrefillJob, local: bool) -> tuple[Admission, list[tuple[PageHash, PageHash | None]]]:  # fmt: skip
    req, l1, l2 = job.req, sched.pool.l1, sched.pool.l2
    if not l1.writing_set().isdisjoint(req.prompt_pages):
        return Admission.NOT_YET, []
    if sched.data_plane is DataPlane.ASYNC_FETCH and not l2.writing_set().isdisjoint(req.prompt_pages):
        return Admission.NOT_YET, []
    in_l1: list[PageHash] = []
    from_l2: list[tuple[int, PageHash]] = []
    for i, page in enumerate(req.prompt_pages[: sched._max_prefix(req)]):
        if page in l1.resident_set():
            in_l1.append(page)
        elif page in l2.resident_set():
            from_l2.append((i, page))
        else:
            break
    total = -(-(req.prompt_tokens + (req.output_tokens if local else 0)) // sched.pt)
    if l1.lacks_room(total - len(in_l1), in_l1):
        return Admission.NO_ROOM, []
    return Admission.ADMITTED, [(page, job.parent(i)) for i, page in from_l2]


class _Checked:
    """Wraps a scheduler's admissions: each one's plan is compared with the old walk's from the same state."""

    def __init__(self, sched: PrefillScheduler) -> None:
        self.sched = sched
        self.host_admitted = self.capped = self.fetched = self.gpu_admitted = self.loaded = 0
        self._host, self._gpu = sched._admit_host, sched._admit_gpu
        sched._admit_host = self.admit_host  # type: ignore[method-assign]
        sched._admit_gpu = self.admit_gpu  # type: ignore[method-assign]

    def admit_host(self, job: PrefillJob, now: float) -> tuple[bool, list[FetchStarted]]:
        fits, fetch, parents, groups = _old_host_walk(self.sched, job)
        if len(job.req.prompt_pages) > self.sched.pool.l2.capacity:
            self.capped += 1
        admitted, started = self._host(job, now)
        assert admitted == fits
        if admitted:
            self.host_admitted += 1
            self.fetched += bool(fetch)
            assert job.fetching == tuple(fetch)
            assert job.fetch_parents == (tuple(parents) if fetch else ())
            assert {f.peer: f.pages for f in started} == groups
            assert [f.peer for f in started] == list(groups)
        return admitted, started

    def admit_gpu(self, job: PrefillJob, now: float, local_ok: bool) -> Admission:
        old, loads = _old_gpu_walk(self.sched, job, local_ok)
        outcome = self._gpu(job, now, local_ok)
        assert outcome is old
        if outcome is Admission.ADMITTED:
            self.gpu_admitted += 1
            self.loaded += bool(loads)
            assert job.loading == loads
        return outcome


def _profile(l1: int, l2: int) -> HardwareProfile:
    return HardwareProfile(
        name="tiny",
        gpu="test",
        gpus_per_node=1,
        model="test",
        parallelism="TP1",
        prefill=PrefillModel(c0=0.01, c1=1e-4, c2=1e-6, c3=1e-5),
        decode=DecodeModel(d0=0.005, d1=0.01, d2=1e-3, k=2, experts=8, t_fwd=2.0, t_acc=1.5),
        kv_bytes_per_token=100,
        l1_tokens=l1 * PAGE,
        l2_tokens=l2 * PAGE,
        page_tokens=PAGE,
        chunk_tokens=24,
        fetch_bandwidth=1e5,
        fetch_latency=0.002,
        transfer_bandwidth=1e6,
        load_bandwidth=2e4,
    )


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 2), st.integers(1, CHAIN_PAGES), st.integers(0, 3),
                  st.lists(st.tuples(st.sampled_from([0, 0, 4, 8, 12, 16]), st.integers(1, 10), st.integers(0, 1)),
                           max_size=3)),
        st.tuples(st.just("step"), st.integers(0, 3)),
        st.tuples(st.just("land"), st.integers(0, 5), st.sets(st.integers(0, CHAIN_PAGES - 1), max_size=3)),
        st.tuples(st.just("evict"), st.sampled_from([Tier.GPU, Tier.HOST]), st.integers(1, 30)),
    ),
    max_size=40,
)  # fmt: skip


def _runs(prompt: tuple[PageHash, ...], wanted: list[tuple[int, int, int]]) -> tuple[FetchRun, ...]:
    runs: list[FetchRun] = []
    taken: set[int] = set()
    for start, length, peer in wanted:
        span = set(range(start, min(start + length, len(prompt))))
        if span and not span & taken:
            taken |= span
            runs.append(FetchRun(min(span), max(span) + 1, frozenset({PEERS[peer]}), prompt))
    return tuple(runs)


def _drive(e: EngineCore, ops: list[Any]) -> Iterator[None]:
    now, n = 0.0, 0
    pending: list[str] = []
    for op in ops:
        now = max(now, e.busy_until)
        if op[0] == "submit":
            _, chain, pages, extra, wanted = op
            prompt = tuple(CHAINS[chain][:pages])
            tokens = pages * PAGE + extra
            if -(-tokens // PAGE) > e.profile.l1_pages:
                continue
            n += 1
            req = PrefillRequest(RequestId(f"r{n}"), BranchId("b"), prompt, tokens, 0, 1.0, _runs(prompt, wanted))
            pending += [f.request for f in e.submit_prefill(req, now).fetches]
        elif op[0] == "step":
            for _ in range(op[1] + 1):
                now = max(now, e.busy_until)
                out = e.step(now)
                pending += [f.request for f in out.fetches_started]
                if out.wake_at is not None:
                    now = max(now, out.wake_at)
        elif op[0] == "land" and pending:
            rid = pending.pop(op[1] % len(pending))
            chain_pages = {p for chain in CHAINS for p in (chain[i] for i in op[2])}
            pending += [f.request for f in e.fetch_completed(rid, now + 0.01, chain_pages).fetches]
            now += 0.01
        elif op[0] == "evict":
            pending += [f.request for f in e.evict(op[1], op[2], now).fetches]
        yield


def _random_ops(rng: random.Random, count: int) -> list[Any]:
    """The same kinds of operations as `_OPS`, drawn from a seeded generator."""
    ops: list[Any] = []
    for _ in range(count):
        kind = rng.choice(["submit", "submit", "step", "step", "land", "evict"])
        if kind == "submit":
            wanted = [(rng.choice([0, 0, 4, 8, 12, 16]), rng.randint(1, 10), rng.randint(0, 1)) for _ in range(rng.randint(0, 3))]
            ops.append((kind, rng.randint(0, 2), rng.randint(1, CHAIN_PAGES), rng.randint(0, 3), wanted))
        elif kind == "step":
            ops.append((kind, rng.randint(0, 3)))
        elif kind == "land":
            ops.append((kind, rng.randint(0, 5), set(rng.sample(range(CHAIN_PAGES), rng.randint(0, 2)))))
        else:
            ops.append((kind, rng.choice([Tier.GPU, Tier.HOST]), rng.randint(1, 30)))
    return ops


def _checked_run(l1: int, l2: int, plane: DataPlane, ops: list[Any]) -> _Checked:
    e = EngineCore(NodeId("p"), _profile(l1, l2), NodeMode.PREFILL, BranchCountEviction(), plane,
                   check_invariants=True)  # fmt: skip
    checked = _Checked(e._prefill)
    for _ in _drive(e, ops):
        pass
    return checked


@settings(max_examples=150, deadline=None)
@given(
    st.integers(6, 30),
    st.integers(4, 40),
    st.sampled_from([DataPlane.ASYNC_FETCH, DataPlane.HICACHE_LOADBACK]),
    _OPS,
)
def test_admissions_plan_what_the_old_walks_planned(l1: int, l2: int, plane: DataPlane, ops: list[Any]) -> None:
    _checked_run(l1, l2, plane, ops)


def test_seeded_engines_take_every_admission_path_and_plan_what_the_old_walks_planned() -> None:
    totals = dict.fromkeys(("host_admitted", "capped", "fetched", "gpu_admitted", "loaded"), 0)
    for seed in range(40):
        rng = random.Random(seed)
        plane = (DataPlane.ASYNC_FETCH, DataPlane.HICACHE_LOADBACK)[seed % 2]
        checked = _checked_run(rng.randint(6, 30), rng.randint(4, 40), plane, _random_ops(rng, 60))
        for key in totals:
            totals[key] += getattr(checked, key)
    assert all(totals.values()), totals


@given(st.integers(1, 30), st.data())
def test_a_chunk_s_chain_run_names_each_page_s_parent_in_the_prompt(n: int, data: st.DataObject) -> None:
    prompt = tuple(chain_hashes(f"q{i}".encode() for i in range(n)))
    start = data.draw(st.integers(0, n - 1))
    end = data.draw(st.integers(start + 1, n))
    job = PrefillJob(PrefillRequest(RequestId("r"), BranchId("b"), prompt, n * PAGE))
    assert ChainRun.of(prompt, start, end).pairs() == [(prompt[i], job.parent(i)) for i in range(start, end)]
