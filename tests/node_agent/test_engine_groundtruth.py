"""The engine's ground truth (`groundtruth.IterationTimes`): what it adds to eq. 1 and 2, the exact switch, the
node factor, and the decode batch's context carried without a pass over the batch (property-tested against
the sum over the running requests)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.eviction import BranchCountEviction
from evolving_infra.core.itermodel import PrefillItem, decode_iteration_time, prefill_iteration_time
from evolving_infra.core.pages import chain_hashes
from evolving_infra.core.types import BranchId, NodeId, NodeMode, RequestId
from evolving_infra.node_agent.engine import DecodeRequest, EngineCore, IterationKind
from evolving_infra.node_agent.engine.groundtruth import IterationTimes, node_speed_factor, padded_batch
from evolving_infra.node_agent.profile import GroundTruth
from evolving_infra.node_agent.profiles import load_profile

GLM = load_profile("glm-5.2-4xgb300-tp4")


def test_prefill_adds_a_cost_per_chunk_and_decode_the_context_and_the_padding() -> None:
    times = IterationTimes("n0", GLM)
    f = times.factor
    assert 1.0 <= f <= 1.0 + GLM.truth.node_slowdown
    items = [PrefillItem(4096, 60_000), PrefillItem(2048, 0), PrefillItem(1024, 10_000)]
    eq1 = prefill_iteration_time(GLM.prefill.coefficients(), items)
    assert times.prefill(items) == pytest.approx(f * (eq1 + 3 * GLM.truth.prefill_chunk_s))
    d = GLM.decode
    # a batch of 9 runs padded to the captured size 12: d2 is paid three more times
    eq2 = decode_iteration_time(d.coefficients(), 9)
    assert times.decode(9, 500_000) == pytest.approx(f * (eq2 + 3 * d.d2 + 500_000 * GLM.truth.decode_context_s))
    assert times.decode(0, 10) == 0.0


def test_exact_models_and_an_empty_truth_give_eq_1_and_2() -> None:
    items = [PrefillItem(8192, 1000)]
    for times in (IterationTimes("n0", GLM, exact=True),
                  IterationTimes("n0", GLM.model_copy(update={"truth": GroundTruth()}))):
        assert times.factor == 1.0 and times.exact
        assert times.prefill(items) == prefill_iteration_time(GLM.prefill.coefficients(), items)
        assert times.decode(9, 1e6) == pytest.approx(decode_iteration_time(GLM.decode.coefficients(), 9))


def test_padding_and_node_factors() -> None:
    sizes = (1, 2, 4, 8, 12, 16)
    assert [padded_batch(b, sizes) for b in (1, 3, 8, 9, 16, 17, 40)] == [1, 4, 8, 12, 16, 17, 40]
    factors = {node_speed_factor(f"n{i}", 0.06) for i in range(50)}
    assert all(1.0 <= x <= 1.06 for x in factors) and len(factors) == 50  # nodes differ, within the bound
    assert node_speed_factor("n3", 0.06) == node_speed_factor("n3", 0.06)  # a node keeps its speed
    assert node_speed_factor("n3", 0.0) == 1.0
    with pytest.raises(ValueError, match="strictly ascending"):
        GroundTruth(decode_graph_sizes=(4, 2))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 300), st.sampled_from([1.0, 1.5, 2.5, 3.0]),
                          st.integers(0, 6)), min_size=1, max_size=8))
def test_the_carried_context_equals_the_running_requests_prompts_plus_what_they_produced(
    requests: list[tuple[int, int, float, int]],
) -> None:
    """(prompt pages, output tokens, t_acc, iterations before it arrives) per request; the context a decode
    iteration reports is checked against the prompts and the tokens each request was reported to produce."""
    profile = GLM.model_copy(update={"page_tokens": 16, "l1_tokens": 16 * 4096})
    e = EngineCore(NodeId("n"), profile, NodeMode.DECODE, BranchCountEviction(), check_invariants=True)
    pending = sorted(enumerate(requests), key=lambda x: x[1][3])
    prompt: dict[str, int] = {}
    produced: dict[str, int] = {}
    now, step, iterations = 0.0, 0, 0
    for _ in range(2000):
        while pending and pending[0][1][3] <= step:
            i, (pages, out, t_acc, _) = pending.pop(0)
            rid = f"r{i}"
            chain = tuple(chain_hashes(f"{rid}:{p}".encode() for p in range(pages)))
            e.submit_decode(DecodeRequest(RequestId(rid), BranchId(rid), chain, pages * 16, out, t_acc), now)
            prompt[rid], produced[rid] = pages * 16, 0
        out = e.step(now)
        if out.kind is IterationKind.DECODE:
            iterations += 1
            assert out.record is not None
            running = out.decode_tokens.keys()  # every running request, finishing ones included
            exact = sum(prompt[r] + produced[r] for r in running)
            # carried as t_acc per iteration, without the rounding to whole tokens: within a token per request
            assert out.record.context_tokens == pytest.approx(exact, abs=len(running) + 1e-6)
            for r, n in out.decode_tokens.items():
                produced[r] += n
        step += 1
        now = out.end if out.kind is not IterationKind.IDLE else now + 0.01
        gauges = e.gauges()
        if not pending and gauges.decode_running == gauges.decode_queued == 0:
            break
    assert iterations > 0 and e.gauges().decode_running == 0


def test_the_node_agent_defaults_to_the_ground_truth_with_5_percent_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    from evolving_infra.node_agent.service.settings import NodeAgentSettings, load_settings

    s = NodeAgentSettings(node="n0", mode=NodeMode.PREFILL, insecure=True)
    assert s.noise == pytest.approx(0.05) and not s.exact_models  # the local cluster's node agents run these
    monkeypatch.setenv("EVOLVING_NODE_EXACT_MODELS", "true")
    assert load_settings(flags={"node": "n0", "mode": "prefill", "insecure": True}).exact_models
