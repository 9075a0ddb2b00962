"""Prefill on the engine core: iteration times (eq. 1), chunked prefill, peer fetches that overlap the
queue (ours) or delay the prefill (HiCache load-back), admission waits, and input validation."""

from __future__ import annotations

import random

import pytest

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.itermodel import PrefillCoefficients, PrefillItem, prefill_iteration_time
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, RequestId, Tier
from evolving_infra.node_agent.engine import (
    DataPlane,
    DuplicateRequest,
    EngineBusy,
    EngineCore,
    FetchRun,
    IterationKind,
    PrefillRequest,
    RequestTooLarge,
    StepOutput,
    TimeWentBackwards,
    UnknownRequest,
    WrongPhase,
)
from evolving_infra.node_agent.profile import DecodeModel, HardwareProfile, PrefillModel

PAGE = 64
CHAIN = chain_hashes(f"tok{i}".encode() for i in range(1024))


def profile(l1_pages: int = 4096, l2_pages: int = 16384, chunk: int = 8192) -> HardwareProfile:
    return HardwareProfile(
        name="unit",
        gpu="test",
        gpus_per_node=4,
        model="test",
        parallelism="TP4",
        prefill=PrefillModel(c0=0.01, c1=2e-5, c2=1e-10, c3=1e-6),
        decode=DecodeModel(d0=0.005, d1=0.01, d2=1e-4, k=8, experts=256, t_fwd=1.0, t_acc=1.0),
        kv_bytes_per_token=1000,
        l1_tokens=l1_pages * PAGE,
        l2_tokens=l2_pages * PAGE,
        page_tokens=PAGE,
        chunk_tokens=chunk,
        fetch_bandwidth=1e9,
        fetch_latency=0.001,
        transfer_bandwidth=1e10,
        load_bandwidth=5e8,
    )


def engine(prof: HardwareProfile | None = None, plane: DataPlane = DataPlane.ASYNC_FETCH, **kw: object) -> EngineCore:
    return EngineCore(
        NodeId("p0"), prof or profile(), NodeMode.PREFILL, BranchCountEviction(), plane, check_invariants=True, **kw
    )  # type: ignore[arg-type]


def request(rid: str, tokens: int, fetch: tuple[FetchRun, ...] = (), chain: list[PageHash] = CHAIN) -> PrefillRequest:
    prompt = tuple(chain[: tokens // PAGE])
    return PrefillRequest(RequestId(rid), BranchId("b"), prompt, tokens, 16, 1.0, tuple(r.bound(prompt) for r in fetch))


def run_until_idle(e: EngineCore, now: float) -> tuple[list[StepOutput], float]:
    outs = []
    for _ in range(1000):
        out = e.step(now)
        if out.kind is IterationKind.IDLE:
            return outs, now
        outs.append(out)
        now = out.end
    raise AssertionError("engine never went idle")


def coef(e: EngineCore) -> PrefillCoefficients:
    return e.profile.prefill.coefficients()


def test_prefill_with_a_cached_prefix_takes_the_modelled_time() -> None:
    e = engine()
    e.submit_prefill(request("warm", 4096), 0.0)
    _, now = run_until_idle(e, 0.0)
    assert set(CHAIN[:64]) <= e.resident(Tier.GPU)
    e.submit_prefill(request("r", 6000), now)
    out = e.step(now)
    t_uc, t_c = 6000 - 4096, 4096
    assert out.record is not None and out.record.prefill == (PrefillItem(t_uc, t_c, 0),)
    c = e.profile.prefill
    pairs = t_uc * t_c + t_uc * (t_uc + 1) // 2
    assert out.duration == pytest.approx(c.c0 + c.c1 * t_uc + c.c2 * pairs, rel=1e-12)
    assert out.prefills_started[0].cached_tokens == 4096
    assert out.prefills_finished[0].pages == tuple(CHAIN[: 6000 // PAGE])
    assert out.prefills_finished[0].tokens == 6000


def test_a_fully_cached_prompt_still_computes_its_last_page() -> None:
    e = engine()
    e.submit_prefill(request("warm", 4096), 0.0)
    _, now = run_until_idle(e, 0.0)
    e.submit_prefill(request("again", 4096), now)
    out = e.step(now)
    assert out.record is not None and out.record.prefill == (PrefillItem(PAGE, 4096 - PAGE, 0),)


def test_chunking_splits_a_long_prompt_at_the_token_budget() -> None:
    e = engine()
    e.submit_prefill(request("long", 20000), 0.0)
    outs, _ = run_until_idle(e, 0.0)
    items = [o.record.prefill for o in outs if o.record is not None]
    assert items == [(PrefillItem(8192, 0),), (PrefillItem(8192, 8192),), (PrefillItem(3616, 16384),)]
    assert [len(o.prefills_started) for o in outs] == [1, 0, 0]
    assert [len(o.prefills_finished) for o in outs] == [0, 0, 1]
    for o in outs:
        assert o.record is not None
        assert o.duration == pytest.approx(prefill_iteration_time(coef(e), o.record.prefill))


def test_a_chunk_budget_is_shared_in_arrival_order() -> None:
    e = engine()
    e.submit_prefill(request("a", 10000), 0.0)
    e.submit_prefill(request("b", 3000, chain=chain_hashes(f"other{i}".encode() for i in range(64))), 0.0)
    outs, _ = run_until_idle(e, 0.0)
    assert outs[0].record.prefill == (PrefillItem(8192, 0),)  # type: ignore[union-attr]
    # The last partial chunk of `a` is followed by the first chunk of `b` in one iteration.
    assert outs[1].record.prefill == (PrefillItem(1808, 8192), PrefillItem(3000, 0))  # type: ignore[union-attr]
    assert [s.request for s in outs[1].prefills_started] == ["b"]


def _peer_plan(pages: int) -> tuple[FetchRun, ...]:
    return (FetchRun(0, pages, frozenset({NodeId("peer")})),)


def test_a_request_waiting_on_a_fetch_does_not_block_the_runnable_one_behind_it() -> None:
    e = engine()
    fx = e.submit_prefill(request("fetching", 5000, _peer_plan(64)), 0.0)
    (fetch,) = fx.fetches
    assert (fetch.peer, fetch.pages, fetch.tokens, fetch.bytes) == ("peer", tuple(CHAIN[:64]), 4096, 4096 * 1000)
    other = chain_hashes(f"x{i}".encode() for i in range(64))
    e.submit_prefill(request("behind", 1000, chain=other), 0.0)
    out = e.step(0.0)
    assert [s.request for s in out.prefills_started] == ["behind"]
    _, now = run_until_idle(e, out.end)
    assert e.gauges().prefill_queued == 1  # still waiting for its fetch
    assert not set(CHAIN[:64]) & e.resident(Tier.GPU)
    done = e.fetch_completed(RequestId("fetching"), now)
    assert done.applied
    host = [ev for ev in done.events if ev.tier is Tier.HOST]
    assert [ev.pages for ev in host] == [tuple(CHAIN[:64])]
    idle = e.step(now)  # loading into GPU memory while queued
    assert idle.kind is IterationKind.IDLE
    assert idle.wake_at == pytest.approx(now + e.profile.load_time(4096))
    assert idle.gauges is not None and idle.gauges.pool.l1.in_use > 0
    out = e.step(idle.wake_at)  # type: ignore[arg-type]
    assert set(CHAIN[:64]) <= e.resident(Tier.GPU)
    assert [s.request for s in out.prefills_started] == ["fetching"]
    assert out.prefills_started[0].restored_tokens == 4096
    assert out.record is not None and out.record.prefill == (PrefillItem(5000 - 4096, 4096, 4096),)


def test_a_queued_request_keeps_its_host_prefix_pinned() -> None:
    e = engine()
    e.submit_prefill(request("warm", 2048), 0.0)
    _, now = run_until_idle(e, 0.0)
    e.evict(Tier.GPU, 10_000, now)  # the prefix now lives only in host memory
    plan = (FetchRun(32, 48, frozenset({NodeId("peer")})),)
    e.submit_prefill(request("r", 4000, plan), now)
    e.evict(Tier.HOST, 10_000, now)
    assert set(CHAIN[:32]) <= e.resident(Tier.HOST)  # pinned while its fetch runs
    e.fetch_completed(RequestId("r"), now + 0.01)
    out = e.step(now + 1.0)
    assert out.prefills_started[0].cached_tokens == 48 * PAGE
    assert out.prefills_started[0].restored_tokens == 48 * PAGE


def _fetch_scenario(plane: DataPlane, load_bandwidth: float | None = None) -> StepOutput:
    """Own-host restore of 16 pages plus a 16-page peer fetch, then the prefill."""
    e = engine(plane=plane)
    if load_bandwidth is not None:
        e.set_load_bandwidth(load_bandwidth)
    e.submit_prefill(request("warm", 1024), 0.0)
    _, now = run_until_idle(e, 0.0)
    e.evict(Tier.GPU, 10_000, now)
    e.submit_prefill(request("r", 3000, (FetchRun(16, 32, frozenset({NodeId("peer")})),)), now)
    fetched_at = now + e.profile.fetch_time(1024)
    e.fetch_completed(RequestId("r"), fetched_at)
    start = fetched_at + 1.0  # long after any load could finish
    out = e.step(start)
    assert out.kind is IterationKind.PREFILL
    return out


def test_hicache_loadback_delays_the_prefill_by_the_load_time() -> None:
    ours = _fetch_scenario(DataPlane.ASYNC_FETCH)
    base = _fetch_scenario(DataPlane.HICACHE_LOADBACK)
    assert ours.record is not None and base.record is not None
    assert ours.record.prefill == base.record.prefill == (PrefillItem(3000 - 2048, 2048, 2048),)
    assert ours.load_stall == 0.0
    load = profile().load_time(2048)
    assert base.load_stall == pytest.approx(load)
    assert base.duration - ours.duration == pytest.approx(load, rel=1e-9)


def test_hicache_prefill_also_waits_for_an_unfinished_fetch() -> None:
    e = engine(plane=DataPlane.HICACHE_LOADBACK)
    fx = e.submit_prefill(request("r", 5000, _peer_plan(64)), 0.0)
    assert len(fx.fetches) == 1
    out = e.step(0.0)  # runnable at once, before the fetch completed
    fetch = e.profile.fetch_time(4096)
    assert out.load_stall == pytest.approx(fetch + e.profile.load_time(4096))
    assert out.record is not None
    assert out.duration == pytest.approx(prefill_iteration_time(coef(e), out.record.prefill) + out.load_stall)
    late = e.fetch_completed(RequestId("r"), out.end)
    assert not late.applied


def test_admission_waits_while_gpu_memory_is_pinned_or_in_use() -> None:
    e = engine(profile(l1_pages=100, chunk=2048))
    e.submit_prefill(request("big", 6000), 0.0)  # footprint 94 pages, over three iterations
    e.submit_prefill(request("next", 1000, chain=chain_hashes(f"y{i}".encode() for i in range(64))), 0.0)
    outs, _ = run_until_idle(e, 0.0)
    finished = [[f.request for f in o.prefills_finished] for o in outs]
    started = [[s.request for s in o.prefills_started] for o in outs]
    big_done = finished.index(["big"])
    assert started.index(["next"]) == big_done + 1  # 94 + 16 pages do not fit in 100 until big ends
    for o in outs[: big_done + 1]:
        assert o.gauges is not None and o.gauges.prefill_waiting == 1
        g = o.gauges.pool.l1
        assert g.free + g.cached + g.pinned + g.in_use == 100


def test_bad_input_is_refused_with_specific_errors() -> None:
    e = engine()
    with pytest.raises(ValueError, match="make 1 full page"):
        e.submit_prefill(PrefillRequest(RequestId("r"), BranchId("b"), (), 100, 0), 0.0)
    with pytest.raises(ValueError, match="is not in the prompt"):
        FetchRun.of(NodeId("x"), (CHAIN[5],), (CHAIN[0],))
    other_prompt = tuple(CHAIN[:8])
    with pytest.raises(ValueError, match="not bound to this request's prompt pages"):
        PrefillRequest(
            RequestId("r"), BranchId("b"), (CHAIN[0],), 64, 0, 1.0, (FetchRun.of(NodeId("x"), (CHAIN[5],), other_prompt),)
        )
    twice = FetchRun(0, 1, frozenset({NodeId("x")}), (CHAIN[0],))
    with pytest.raises(ValueError, match="planned twice"):
        PrefillRequest(RequestId("r"), BranchId("b"), (CHAIN[0],), 64, 0, 1.0, (twice, twice))
    with pytest.raises(RequestTooLarge, match="needs 5 GPU pages"):
        engine(profile(l1_pages=4)).submit_prefill(request("r", 300), 0.0)
    e.submit_prefill(request("r", 100), 1.0)
    with pytest.raises(DuplicateRequest):
        e.submit_prefill(request("r", 100), 1.0)
    with pytest.raises(UnknownRequest):
        e.fetch_completed(RequestId("nope"), 1.0)
    with pytest.raises(TimeWentBackwards):
        e.submit_prefill(request("s", 100), 0.5)
    out = e.step(1.0)
    with pytest.raises(EngineBusy):
        e.step(out.end - 1e-3)
    from evolving_infra.node_agent.engine import DecodeRequest

    with pytest.raises(WrongPhase, match="serves prefill"):
        e.submit_decode(DecodeRequest(RequestId("d"), BranchId("b"), (), 10, 5), out.end)
    with pytest.raises(ValueError, match="seeded random.Random"):
        engine(noise=0.1)


def test_noise_is_seeded_and_multiplicative() -> None:
    durations = []
    for _ in range(2):
        e = engine(noise=0.05, rng=random.Random(7))
        e.submit_prefill(request("r", 20000), 0.0)
        outs, _ = run_until_idle(e, 0.0)
        durations.append([o.duration for o in outs])
    assert durations[0] == durations[1]
    exact = [prefill_iteration_time(coef(engine()), items) for items in ((PrefillItem(8192, 0),),)]
    assert durations[0][0] != exact[0]
    assert 0.7 < durations[0][0] / exact[0] < 1.3


def test_restored_tokens_are_charged_once_in_the_first_chunk() -> None:
    e = engine()
    e.submit_prefill(request("warm", 2048), 0.0)
    _, now = run_until_idle(e, 0.0)
    e.evict(Tier.GPU, 10_000, now)  # the prefix is restored from host memory
    e.submit_prefill(request("long", 20000), now)
    outs, _ = run_until_idle(e, now + 1.0)
    items = [o.record.prefill for o in outs if o.record is not None]
    assert items == [
        (PrefillItem(8192, 2048, 2048),),
        (PrefillItem(8192, 2048 + 8192, 0),),
        (PrefillItem(20000 - 2048 - 2 * 8192, 2048 + 2 * 8192, 0),),
    ]


def test_hicache_prefill_waits_for_the_fetch_as_the_driver_now_expects_it_under_shared_bandwidth() -> None:
    e = engine(plane=DataPlane.HICACHE_LOADBACK)
    e.submit_prefill(request("r", 5000, _peer_plan(64)), 0.0)
    shared = 3 * e.profile.fetch_time(4096)  # the fetch shares its peer's NIC with two others
    e.fetch_expected(RequestId("r"), shared)
    out = e.step(0.0)
    assert out.load_stall == pytest.approx(shared + e.profile.load_time(4096))
    e.fetch_expected(RequestId("r"), 99.0)  # no longer waited for: ignored
    assert not e.fetch_completed(RequestId("r"), out.end).applied


def test_a_hicache_load_back_takes_the_host_to_gpu_bandwidth_the_driver_gives() -> None:
    full = _fetch_scenario(DataPlane.HICACHE_LOADBACK)
    shared = _fetch_scenario(DataPlane.HICACHE_LOADBACK, load_bandwidth=profile().load_bandwidth / 4)
    assert shared.load_stall == pytest.approx(4 * full.load_stall)  # host memory shared with fetches
    capped = _fetch_scenario(DataPlane.HICACHE_LOADBACK, load_bandwidth=1e18)
    assert capped.load_stall == pytest.approx(full.load_stall)  # never above the profile's load bandwidth
    with pytest.raises(ValueError, match="load bandwidth"):
        engine().set_load_bandwidth(0.0)
