"""Decode iterations touch only the requests that finish (the scheduler's heap of finish iterations): the results
equal advancing every request every iteration, with and without per-step detail.

Two engines run the same random stream of decode requests, one reporting per-step detail (tokens per request,
gauges) and one not; their step outputs agree in everything else (with the same iteration-time noise too). The
lean engine takes the quiet path for iterations in which nothing is due (`EngineCore._quiet_step`), the detailed one
never does: the agreement is also that of the two paths. From the detailed stream: each request gets
`min(out, floor(i * t_acc))` tokens after its `i`-th iteration, finishes in exactly the iteration that reaches
its output length, and has none of its generated pages written to GPU memory before that iteration and
exactly its full generated pages from it on (an SGLang decode server caches a request's KV at its end).
"""

from __future__ import annotations

import math
import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.kv_events import KvStored
from evolving_infra.core.pages import chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, RequestId, Tier
from evolving_infra.node_agent.engine import DecodeRequest, EngineCore, IterationKind
from evolving_infra.node_agent.engine.requests import generated_pages
from evolving_infra.node_agent.profile import DecodeModel, HardwareProfile, PrefillModel

PAGE = 4
T_ACC = [0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 2.5, 3.7, 9.0]


def _profile(l1_pages: int) -> HardwareProfile:
    return HardwareProfile(
        name="unit", gpu="test", gpus_per_node=1, model="test", parallelism="TP1",
        prefill=PrefillModel(c0=0.01, c1=2e-5, c2=1e-10, c3=1e-6),
        decode=DecodeModel(d0=0.005, d1=0.02, d2=3e-4, k=8, experts=256, t_fwd=2.0, t_acc=1.5),
        kv_bytes_per_token=100, l1_tokens=l1_pages * PAGE, l2_tokens=400 * PAGE, page_tokens=PAGE,
        chunk_tokens=64, fetch_bandwidth=1e9, fetch_latency=0.001, transfer_bandwidth=1e10, load_bandwidth=5e8,
    )  # fmt: skip


def _request(i: int, prompt: int, out: int, t_acc: float) -> DecodeRequest:
    pages = tuple(chain_hashes(f"r{i}:{k}".encode() for k in range(prompt // PAGE)))
    return DecodeRequest(RequestId(f"r{i}"), BranchId(f"b{i}"), pages, prompt, out, t_acc)


specs = st.lists(
    st.tuples(st.integers(0, 8), st.integers(1, 30), st.integers(1, 25), st.sampled_from(T_ACC)),
    min_size=1,
    max_size=8,
)


@given(specs=specs, l1_pages=st.sampled_from([14, 40, 200]), noise=st.sampled_from([0.0, 0.05]))
def test_lean_and_detailed_decode_agree_with_per_iteration_progress(
    specs: list[tuple[int, int, int, float]], l1_pages: int, noise: float
) -> None:
    detailed, lean = (
        EngineCore(NodeId("d0"), _profile(l1_pages), NodeMode.DECODE, BranchCountEviction(), check_invariants=True,
                   report_detail=detail, noise=noise, rng=random.Random(7) if noise else None)
        for detail in (True, False)
    )  # fmt: skip
    quiet = Counter[str]()
    for name, engine in (("detailed", detailed), ("lean", lean)):
        def counted(now: float, name: str = name, path=engine._quiet_step) -> object:  # type: ignore[no-untyped-def]
            quiet[name] += 1
            return path(now)

        engine._quiet_step = counted  # type: ignore[method-assign]
    requests = [(arrive, _request(i, *spec)) for i, (arrive, *spec) in enumerate(specs)]
    generated = {r.request: generated_pages(r, PAGE) for _, r in requests}
    tokens: Counter[str] = Counter()
    iterations: Counter[str] = Counter()
    stored: set[int] = set()
    finished: set[str] = set()
    now = 0.0
    for step in range(2000):
        for arrive, req in requests:
            if arrive == step:
                assert detailed.submit_decode(req, now) == lean.submit_decode(req, now)
        a, b = detailed.step(now), lean.step(now)
        assert b.decode_tokens == {} and b.gauges is None
        assert a._replace(decode_tokens={}, gauges=None) == b._replace(decode_tokens={}, gauges=None)
        if a.kind is IterationKind.IDLE:
            if step > max(arrive for arrive, _ in requests):
                break
            continue
        assert a.record is not None and set(a.decode_tokens) <= {r.request for _, r in requests}
        assert a.record.decode_batch == len(a.decode_tokens)
        for rid, new in a.decode_tokens.items():
            iterations[rid] += 1
            tokens[rid] += new
        stored |= {p for ev in a.events if isinstance(ev, KvStored) and ev.tier is Tier.GPU for p in ev.pages}
        done = {d.request for d in a.decodes_finished}
        for _, req in requests:
            rid = req.request
            if rid not in iterations:
                continue
            assert tokens[rid] == min(req.output_tokens, math.floor(iterations[rid] * req.t_acc + 1e-9))
            assert (rid in done) == (rid not in finished and tokens[rid] == req.output_tokens)
            full = min(len(generated[rid]), (req.prompt_tokens + tokens[rid]) // PAGE - req.prompt_tokens // PAGE)
            written = set(generated[rid][:full]) if rid in done or rid in finished else set()
            assert {p for p in generated[rid] if p in stored} == written
        finished |= done
        for d in a.decodes_finished:
            assert d.output_tokens == tokens[d.request]
        now = a.end
    assert finished == {r.request for _, r in requests}
    assert quiet["detailed"] == 0


def test_a_lone_decode_takes_the_quiet_path_until_it_finishes() -> None:
    """One request, 1 prompt token, 25 output tokens at one per iteration: its pages fill at 3, 7, ..., 23 tokens
    are written when it finishes at 25, so only its last iteration acts (writing all six full pages at once) and
    the other 24 are quiet (before, each page's iteration acted too: 7 acting, 18 quiet)."""
    engine = EngineCore(NodeId("d0"), _profile(40), NodeMode.DECODE, BranchCountEviction(), check_invariants=True,
                        report_detail=False)
    calls = []
    path = engine._quiet_step
    engine._quiet_step = lambda now: calls.append(now) or path(now)  # type: ignore[method-assign]
    engine.submit_decode(_request(0, 1, 25, 1.0), 0.0)
    now, kinds, written = 0.0, [], []
    while (out := engine.step(now)).kind is not IterationKind.IDLE:
        kinds.append(bool(out.events or out.decodes_finished))
        written.append(sum(len(ev.pages) for ev in out.events if isinstance(ev, KvStored) and ev.tier is Tier.GPU))
        now = out.end
    assert len(kinds) == 25 and kinds[-1] and sum(kinds) == 1 and len(calls) == 24
    assert written == [0] * 24 + [6]


def test_a_cancelled_decode_caches_the_pages_it_filled() -> None:
    """Cancelled after 10 of its 25 iterations (1 prompt token, one output token per iteration), a request has
    filled two pages (3 and 7 tokens in): they are written then, stay cached unpinned, and nothing else is."""
    engine = EngineCore(NodeId("d0"), _profile(40), NodeMode.DECODE, BranchCountEviction(), check_invariants=True,
                        report_detail=False)
    req = _request(0, 1, 25, 1.0)
    generated = generated_pages(req, PAGE)
    engine.submit_decode(req, 0.0)
    now, events = 0.0, []
    for _ in range(10):
        out = engine.step(now)
        events += out.events
        now = out.end
    assert not [ev for ev in events if isinstance(ev, KvStored)]
    effects = engine.cancel_decode(req.request, now)
    assert effects.applied
    stored = [p for ev in effects.events if isinstance(ev, KvStored) and ev.tier is Tier.GPU for p in ev.pages]
    assert stored == list(generated[:2])
    assert all(engine.pool.l1.contains(p) for p in generated[:2]) and not engine.pool.l1.pinned_pages()
    assert engine.step(now).kind is IterationKind.IDLE
