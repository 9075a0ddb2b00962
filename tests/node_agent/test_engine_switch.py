"""Phase switches of the engine core: queued work handed back, running work finished in place, host
memory kept, GPU memory released to host memory, refusals while draining, then the new phase served."""

from __future__ import annotations

import pytest

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.kv_events import KvRemoved
from evolving_infra.core.pages import PageHash, chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, Phase, RequestId, Tier
from evolving_infra.node_agent.engine import (
    DecodeRequest,
    EngineCore,
    FetchRun,
    IterationKind,
    PrefillRequest,
    SwitchInProgress,
    SwitchState,
    WrongPhase,
)
from evolving_infra.node_agent.profile import DecodeModel, HardwareProfile, PrefillModel

PAGE = 64


def profile() -> HardwareProfile:
    return HardwareProfile(
        name="unit",
        gpu="test",
        gpus_per_node=4,
        model="test",
        parallelism="TP4",
        prefill=PrefillModel(c0=0.01, c1=2e-5, c2=1e-10, c3=1e-6),
        decode=DecodeModel(d0=0.005, d1=0.02, d2=3e-4, k=8, experts=256, t_fwd=1.0, t_acc=1.0),
        kv_bytes_per_token=1000,
        l1_tokens=2048 * PAGE,
        l2_tokens=8192 * PAGE,
        page_tokens=PAGE,
        chunk_tokens=8192,
        fetch_bandwidth=1e9,
        fetch_latency=0.001,
        transfer_bandwidth=1e10,
        load_bandwidth=5e8,
        switch_latency=0.0,  # the drain logic on its own; test_switch_latency_* adds the latency
    )


def chain(name: str) -> list[PageHash]:
    return chain_hashes(f"{name}{i}".encode() for i in range(512))


def prefill(rid: str, tokens: int, fetch: tuple[FetchRun, ...] = ()) -> PrefillRequest:
    prompt = tuple(chain(rid)[: tokens // PAGE])
    return PrefillRequest(RequestId(rid), BranchId(rid), prompt, tokens, 8, 1.0, tuple(r.bound(prompt) for r in fetch))


def decode(rid: str, tokens: int, out: int) -> DecodeRequest:
    return DecodeRequest(RequestId(rid), BranchId(rid), tuple(chain(rid)[: tokens // PAGE]), tokens, out, 1.0)


def engine(mode: NodeMode) -> EngineCore:
    return EngineCore(NodeId("n"), profile(), mode, BranchCountEviction(), check_invariants=True)


def test_prefill_to_decode_hands_back_queued_finishes_running_and_keeps_host_memory() -> None:
    e = engine(NodeMode.PREFILL)
    e.submit_prefill(prefill("done", 3000), 0.0)
    now = e.step(0.0).end  # `done` finished: its pages are cached in both tiers
    e.submit_prefill(prefill("running", 20000), now)
    first = e.step(now)  # `running` has two chunks left
    assert [s.request for s in first.prefills_started] == ["running"]
    queued = [prefill("q1", 1000), prefill("q2", 500, (FetchRun(0, 4, frozenset({NodeId("peer")})),))]
    for req in queued:
        e.submit_prefill(req, first.end)
    host_before = e.resident(Tier.HOST)

    begun = e.begin_switch(Phase.DECODE, first.end)
    assert list(begun.handed_back) == queued
    assert begun.completed is None and e.switch_state is SwitchState.DRAINING
    assert not e.fetch_completed(RequestId("q2"), first.end).applied  # a late fetch is ignored
    with pytest.raises(WrongPhase, match="switching from prefill to decode"):
        e.submit_prefill(prefill("late", 100), first.end)
    with pytest.raises(SwitchInProgress, match="accepted once the switch completes"):
        e.submit_decode(decode("early", 100, 4), first.end)
    with pytest.raises(SwitchInProgress):
        e.begin_switch(Phase.PREFILL, first.end)

    now, outs = first.end, []
    while e.switch_state is SwitchState.DRAINING:
        out = e.step(now)
        outs.append(out)
        now = out.end
    assert [o.kind for o in outs] == [IterationKind.PREFILL, IterationKind.PREFILL]
    assert [f.request for f in outs[-1].prefills_finished] == ["running"]
    report = outs[-1].switch_completed
    assert report is not None and report == e.last_switch
    assert (report.source, report.target, report.handed_back) == (NodeMode.PREFILL, NodeMode.DECODE, 2)
    assert report.began == first.end and report.completed == now
    assert report.drain == pytest.approx(outs[0].duration + outs[1].duration)

    running_pages = set(chain("running")[: 20000 // PAGE])
    assert host_before <= e.resident(Tier.HOST)
    assert e.resident(Tier.HOST) == host_before | running_pages
    assert not any(isinstance(ev, KvRemoved) and ev.tier is Tier.HOST for o in outs for ev in o.events)
    assert e.resident(Tier.GPU) == frozenset()  # GPU memory released to host memory
    g = e.gauges()
    assert (g.pool.l1.cached, g.pool.l1.pinned, g.pool.l1.in_use) == (0, 0, 0)
    assert g.pool.l2.pinned == g.pool.l2.in_use == 0

    assert e.mode is NodeMode.DECODE and e.switch_state is SwitchState.SWITCHED
    e.submit_decode(decode("new", 1000, 3), now)
    with pytest.raises(WrongPhase, match="serves decode"):
        e.submit_prefill(prefill("old", 100), now)
    assert sum(e.step(now).decode_tokens.values()) == 1


def test_an_idle_node_switches_at_once() -> None:
    e = engine(NodeMode.DECODE)
    begun = e.begin_switch(Phase.PREFILL, 5.0)
    assert begun.handed_back == () and begun.completed is not None
    assert begun.completed.drain == 0.0 and e.mode is NodeMode.PREFILL
    with pytest.raises(ValueError, match="already serves prefill"):
        e.begin_switch(Phase.PREFILL, 5.0)


def test_decode_to_prefill_hands_back_waiting_decodes_and_drains_the_batch() -> None:
    e = engine(NodeMode.DECODE)
    e.submit_decode(decode("a", 640, 3), 0.0)
    pages = tuple(chain_hashes(f"big{i}".encode() for i in range(2040)))
    big = DecodeRequest(RequestId("big"), BranchId("x"), pages, 2040 * PAGE, 8, 1.0)
    e.submit_decode(big, 0.0)  # does not fit next to `a`: waits
    begun = e.begin_switch(Phase.PREFILL, 0.0)
    assert begun.handed_back == (big,)
    now = 0.0
    while e.switch_state is SwitchState.DRAINING:
        out = e.step(now)
        now = out.end
    assert out.decodes_finished[0].request == "a" and out.switch_completed is not None
    assert e.resident(Tier.GPU) == frozenset() and set(chain("a")[:10]) <= e.resident(Tier.HOST)
    e.submit_prefill(prefill("p", 100), now)


def test_collocated_to_prefill_keeps_prefill_work_and_drains_local_decodes() -> None:
    e = engine(NodeMode.COLLOCATED)
    e.submit_prefill(prefill("p1", 1000), 0.0)
    first = e.step(0.0)
    assert first.prefills_finished[0].local_decode
    e.submit_decode(decode("d", 200, 4), first.end)  # admitted at once: running, not handed back
    begun = e.begin_switch(Phase.PREFILL, first.end)
    assert begun.handed_back == ()
    e.submit_prefill(prefill("p2", 1000), first.end)  # prefill is served by both modes
    with pytest.raises(WrongPhase):
        e.submit_decode(decode("d2", 200, 4), first.end)
    now, finished, kinds = first.end, [], []
    while e.switch_state is SwitchState.DRAINING:
        out = e.step(now)
        finished += out.prefills_finished
        kinds.append(out.kind)
        now = out.end
    # the local decodes finish first (decode-only iterations), so the switch does not wait behind prefill chunks
    assert kinds and set(kinds) == {IterationKind.DECODE}
    assert e.mode is NodeMode.PREFILL
    while not any(f.request == "p2" for f in finished):
        out = e.step(now)
        finished += out.prefills_finished
        now = out.end
    p2 = [f for f in finished if f.request == "p2"]
    assert not p2[0].local_decode  # queued while switching to prefill: its KV goes elsewhere


def test_switch_latency_follows_the_drain_and_the_node_runs_nothing_meanwhile() -> None:
    e = EngineCore(NodeId("n"), profile().model_copy(update={"switch_latency": 0.7}), NodeMode.DECODE,
                   BranchCountEviction(), check_invariants=True)
    e.submit_decode(decode("a", 640, 3), 0.0)
    begun = e.begin_switch(Phase.PREFILL, 0.0)
    assert begun.completed is None
    now, drained = 0.0, None
    while drained is None:
        out = e.step(now)
        if out.decodes_finished:
            drained = out.end
        now = out.end
    assert e.switch_state is SwitchState.DRAINING  # drained, not yet switched
    with pytest.raises(SwitchInProgress):
        e.submit_prefill(prefill("early", 100), now)
    idle = e.step(now)
    assert idle.kind is IterationKind.IDLE and idle.switch_completed is None
    assert idle.wake_at == pytest.approx(drained + 0.7)
    done = e.step(idle.wake_at)
    report = done.switch_completed
    assert report is not None and report.completed == pytest.approx(drained + 0.7)
    assert report.drain == pytest.approx(drained + 0.7)
    assert e.mode is NodeMode.PREFILL
    e.submit_prefill(prefill("p", 100), idle.wake_at)


def test_an_idle_node_switches_after_the_latency_alone() -> None:
    e = EngineCore(NodeId("n"), profile().model_copy(update={"switch_latency": 0.7}), NodeMode.DECODE,
                   BranchCountEviction())
    begun = e.begin_switch(Phase.PREFILL, 5.0)
    assert begun.completed is None
    idle = e.step(5.0)
    assert idle.wake_at == pytest.approx(5.7)
    assert e.step(5.7).switch_completed is not None and e.mode is NodeMode.PREFILL
