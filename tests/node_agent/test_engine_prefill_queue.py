"""`EngineCore.prefill_queue()`: what a node reports at an iteration launch. Before each step it lists the running
chunked prefills with the tokens still to compute (exactly what the next iterations compute for them) and the
context their next chunk attends to (exactly that chunk's t_c), and the other prefills in arrival order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.pages import chain_hashes
from evolving_infra.node_agent.engine import IterationKind, PrefillQueue

from tests.node_agent.test_engine_prefill import PAGE, engine, profile, request


def test_an_idle_engine_reports_an_empty_queue() -> None:
    assert engine().prefill_queue() == PrefillQueue((), ())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 40_000), min_size=1, max_size=5), st.sampled_from([2048, 8192]))
def test_reports_match_what_the_iterations_then_compute(prompts: list[int], chunk: int) -> None:
    e = engine(profile(chunk=chunk))
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, tokens in zip(ids, prompts, strict=True):
        pages = chain_hashes(f"{rid}:{j}".encode() for j in range(tokens // PAGE))
        e.submit_prefill(request(rid, tokens, chain=pages), 0.0)
    computed = dict.fromkeys(ids, 0)
    now = 0.0
    for _ in range(1000):
        queue = e.prefill_queue()
        running = {r.request: r for r in queue.running}
        listed = [*running, *queue.queued]
        assert len(listed) == len(set(listed)) and set(listed) <= set(ids)
        assert list(queue.queued) == [rid for rid in ids if rid in queue.queued]  # arrival order
        for r in running.values():  # still to compute = prompt minus what is done (nothing was cached)
            assert r.remaining_tokens == prompts[ids.index(r.request)] - computed[r.request] > 0
            assert r.context_tokens == computed[r.request]
        out = e.step(now)
        if out.kind is IterationKind.IDLE:
            break
        if out.record is not None:
            starters = {s.request for s in out.prefills_started}
            chunked = [rid for rid in listed if rid in running or rid in starters]
            for rid, item in zip(chunked, out.record.prefill, strict=False):
                if rid in running:
                    assert item.t_c == running[rid].context_tokens
                computed[rid] += item.t_uc
        now = out.end
    assert e.prefill_queue() == PrefillQueue((), ())
    assert computed == dict(zip(ids, prompts, strict=True))
