"""Decode on the engine core: t_acc tokens per iteration, exact output lengths, eq. 2 iteration times,
continuous batching, write-through of generated pages, and collocated prefill + decode on one node."""

from __future__ import annotations

import pytest

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.itermodel import decode_iteration_time
from evolving_infra.core.kv_events import KvStored
from evolving_infra.core.pages import chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, RequestId, Tier
from evolving_infra.node_agent.engine import (
    DecodeRequest,
    EngineCore,
    IterationKind,
    PrefillRequest,
    StepOutput,
    WrongPhase,
)
from evolving_infra.node_agent.profile import DecodeModel, HardwareProfile, PrefillModel

PAGE = 16
CHAIN = chain_hashes(f"t{i}".encode() for i in range(256))


def profile(l1_pages: int = 512) -> HardwareProfile:
    return HardwareProfile(
        name="unit",
        gpu="test",
        gpus_per_node=4,
        model="test",
        parallelism="TP4",
        prefill=PrefillModel(c0=0.01, c1=2e-5, c2=1e-10, c3=1e-6),
        decode=DecodeModel(d0=0.005, d1=0.02, d2=3e-4, k=8, experts=256, t_fwd=2.0, t_acc=1.5),
        kv_bytes_per_token=1000,
        l1_tokens=l1_pages * PAGE,
        l2_tokens=4096 * PAGE,
        page_tokens=PAGE,
        chunk_tokens=256,
        fetch_bandwidth=1e9,
        fetch_latency=0.001,
        transfer_bandwidth=1e10,
        load_bandwidth=5e8,
    )


def engine(mode: NodeMode = NodeMode.DECODE, l1_pages: int = 512) -> EngineCore:
    return EngineCore(NodeId("d0"), profile(l1_pages), mode, BranchCountEviction(), check_invariants=True)


def decode_request(rid: str, prompt: int, out: int, t_acc: float, offset: int = 0) -> DecodeRequest:
    chain = CHAIN[offset:] if offset == 0 else chain_hashes(f"{rid}{i}".encode() for i in range(64))
    return DecodeRequest(RequestId(rid), BranchId("b"), tuple(chain[: prompt // PAGE]), prompt, out, t_acc)


def run(e: EngineCore, now: float = 0.0) -> list[StepOutput]:
    outs = []
    for _ in range(10_000):
        out = e.step(now)
        if out.kind is IterationKind.IDLE:
            return outs
        outs.append(out)
        now = out.end
    raise AssertionError("never idle")


def test_decode_advances_t_acc_tokens_per_iteration_and_stops_at_the_output_length() -> None:
    e = engine()
    e.submit_decode(decode_request("r", 100, 10, 1.5), 0.0)
    outs = run(e)
    assert [o.decode_tokens["r"] for o in outs] == [1, 2, 1, 2, 1, 2, 1]
    assert [d.output_tokens for o in outs for d in o.decodes_finished] == [10]
    assert outs[-1].decodes_finished[0].request == "r"
    coef = e.profile.decode.coefficients()
    for o in outs:
        assert o.record is not None and o.record.decode_batch == 1 and o.record.prefill == ()
        assert o.duration == pytest.approx(coef.d0 + coef.d1 * (1 - (1 - 8 / 256) ** 2.0) + coef.d2)


def test_batch_size_follows_continuous_batching() -> None:
    e = engine()
    e.submit_decode(decode_request("a", 32, 3, 1.0), 0.0)
    first = e.step(0.0)
    e.submit_decode(decode_request("b", 40, 4, 1.0, offset=1), first.end)  # joins at the next iteration
    outs = [first, *run(e, first.end)]
    assert [o.record.decode_batch for o in outs] == [1, 2, 2, 1, 1]  # type: ignore[union-attr]
    coef = e.profile.decode.coefficients()
    for o in outs:
        assert o.record is not None
        assert o.duration == pytest.approx(decode_iteration_time(coef, o.record.decode_batch))
    assert sum(o.decode_tokens.get("b", 0) for o in outs) == 4


def test_received_and_generated_pages_are_written_through_to_host_memory() -> None:
    e = engine()
    fx = e.submit_decode(decode_request("r", 40, 30, 2.0), 0.0)  # 2 full prompt pages; 70 tokens -> 4 pages
    assert [(ev.tier, ev.pages) for ev in fx.events] == [
        (Tier.GPU, tuple(CHAIN[:2])),
        (Tier.HOST, tuple(CHAIN[:2])),
    ]
    outs = run(e)
    stored = [ev for o in outs for ev in o.events if isinstance(ev, KvStored)]
    host_new = [p for ev in stored if ev.tier is Tier.HOST for p in ev.pages]
    gpu_new = [p for ev in stored if ev.tier is Tier.GPU for p in ev.pages]
    assert len(host_new) == len(gpu_new) == 2
    assert stored[0].parent == CHAIN[1]  # the generated chain continues the prompt's
    assert set(host_new) <= e.resident(Tier.HOST)
    g = e.gauges().pool
    assert (g.l1.pinned, g.l1.in_use, g.l1.cached) == (0, 0, 4)


def test_decode_admission_waits_for_gpu_room() -> None:
    e = engine(l1_pages=8)
    e.submit_decode(decode_request("a", 64, 32, 1.0), 0.0)  # 6 pages
    e.submit_decode(decode_request("b", 32, 16, 1.0, offset=1), 0.0)  # 3 pages: waits
    assert e.gauges().decode_queued == 1 and e.gauges().decode_running == 1
    outs = run(e)
    batches = [o.record.decode_batch for o in outs]  # type: ignore[union-attr]
    assert batches[:32] == [1] * 32 and batches[32:] == [1] * 16


def test_collocated_node_serves_prefill_then_decode_without_a_transfer() -> None:
    e = engine(NodeMode.COLLOCATED)
    req = PrefillRequest(RequestId("r"), BranchId("b"), tuple(CHAIN[:37]), 600, 5, 1.0)
    e.submit_prefill(req, 0.0)
    outs = run(e)
    kinds = [o.kind for o in outs]
    assert kinds == [IterationKind.PREFILL] * 3 + [IterationKind.DECODE] * 5
    assert outs[0].prefills_started[0].local_decode
    (done,) = outs[2].prefills_finished
    assert done.local_decode and done.tokens == 600
    assert sum(o.decode_tokens.get("r", 0) for o in outs) == 5
    assert outs[-1].decodes_finished[0].output_tokens == 5
    # The prompt's pages were reused in place (pinned, not received again): no second GPU store.
    gpu_stores = [ev for o in outs for ev in o.events if isinstance(ev, KvStored) and ev.tier is Tier.GPU]
    gpu_pages = [p for ev in gpu_stores for p in ev.pages]
    assert len(gpu_pages) == len(set(gpu_pages)) == 37 + (605 // PAGE - 37)


def test_collocated_node_alternates_prefill_and_decode_iterations() -> None:
    e = engine(NodeMode.COLLOCATED)
    e.submit_decode(decode_request("d", 32, 20, 1.0), 0.0)
    other = chain_hashes(f"p{i}".encode() for i in range(64))
    e.submit_prefill(PrefillRequest(RequestId("p"), BranchId("b"), tuple(other[:50]), 800, 2, 1.0), 0.0)
    kinds = [o.kind for o in run(e)[:6]]
    assert kinds == [IterationKind.PREFILL, IterationKind.DECODE] * 3


def test_a_decode_node_refuses_prefill_work() -> None:
    e = engine()
    with pytest.raises(WrongPhase, match="serves decode: prefill work is refused"):
        e.submit_prefill(PrefillRequest(RequestId("p"), BranchId("b"), (), 10), 0.0)
    with pytest.raises(ValueError, match="output_tokens >= 1"):
        DecodeRequest(RequestId("r"), BranchId("b"), (), 10, 0)
