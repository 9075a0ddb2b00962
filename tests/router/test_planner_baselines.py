"""Each baseline planner follows its documented rule (/work/shared/baselines.md, "Planners")."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients
from evolving_infra.core.types import NodeId, Phase, Work
from evolving_infra.router.planner.window import SliceStats
from evolving_infra.router.planner import (
    ArrowDiagnostics,
    ArrowPlanner,
    ArrowSettings,
    CoefficientNodeModel,
    DynamoDiagnostics,
    DynamoPlanner,
    DynamoSettings,
    NodeLoad,
    NodeStatus,
    Outcome,
    PlannerName,
    PlannerObservation,
    StaticPlanner,
    SwitchMode,
    Want,
    allowed_settings,
    changed_nodes,
    format_split,
    full_prompt_time,
    make_planner,
)

NODES = [NodeId(f"n{i}") for i in range(9)]
MODEL = CoefficientNodeModel(
    PrefillCoefficients(c0=0.02, c1=5e-5, c2=1e-10, c3=1e-6),
    DecodeCoefficients(d0=0.015, d1=0.02, d2=2e-4, k=8, experts=256, t_fwd=2.0),
    t_bar=8192.0,
    f_restore=0.1,
)


def phases_of(prefill: int) -> dict[NodeId, Phase]:
    return {n: (Phase.PREFILL if i < prefill else Phase.DECODE) for i, n in enumerate(NODES)}


# ----------------------------------------------------------------------------------------------- Dynamo


def dynamo_obs(
    ratios: list[float], utils: list[float], switching: tuple[str, ...] = ()
) -> PlannerObservation:
    """Prefill nodes get queued tokens = ratio * context length; decode nodes KV tokens = util * capacity."""
    p = len(ratios)
    assert p + len(utils) == len(NODES)
    ctx, cap = 100_000, 1_000_000
    load = {n: NodeLoad(queued_prefill_tokens=round(r * ctx), context_length=ctx) for n, r in zip(NODES[:p], ratios)}
    load |= {n: NodeLoad(decode_kv_tokens=round(u * cap), kv_capacity_tokens=cap) for n, u in zip(NODES[p:], utils)}
    nodes = {n: NodeStatus(phase, switching=n in switching) for n, phase in phases_of(p).items()}
    return PlannerObservation(nodes=nodes, load=load)


def dynamo_split(ratios: list[float], utils: list[float]) -> str:
    decision = DynamoPlanner().decide(dynamo_obs(ratios, utils), 0.0)
    return format_split(decision.target) if decision.target is not None else "hold"


def test_dynamo_prefill_grows_when_any_ratio_reaches_one() -> None:
    assert dynamo_split([1.0, 0.2, 0.2, 0.2], [0.7] * 5) == "5P4D"
    assert dynamo_split([0.99, 0.2, 0.2, 0.2], [0.7] * 5) == "hold"


def test_dynamo_prefill_shrinks_only_when_all_ratios_are_below_a_tenth() -> None:
    assert dynamo_split([0.09, 0.09, 0.09, 0.09], [0.7] * 5) == "3P6D"
    assert dynamo_split([0.09, 0.09, 0.09, 0.1], [0.7] * 5) == "hold"


def test_dynamo_decode_grows_when_any_utilization_exceeds_one() -> None:
    assert dynamo_split([0.5] * 4, [1.01, 0.7, 0.7, 0.7, 0.7]) == "3P6D"
    assert dynamo_split([0.5] * 4, [1.0, 0.7, 0.7, 0.7, 0.7]) == "hold"


def test_dynamo_decode_shrinks_only_when_all_utilizations_are_below_sixty_percent() -> None:
    assert dynamo_split([0.5] * 4, [0.59] * 5) == "5P4D"
    assert dynamo_split([0.5] * 4, [0.59, 0.59, 0.59, 0.59, 0.6]) == "hold"


def test_dynamo_opposed_wishes_cancel_under_a_fixed_budget() -> None:
    assert dynamo_split([1.5, 0.2, 0.2, 0.2], [1.2] * 5) == "hold"
    assert dynamo_split([0.0] * 4, [0.1] * 5) == "hold"


def test_dynamo_moves_one_node_per_tick_as_a_relaunch() -> None:
    decision = DynamoPlanner().decide(dynamo_obs([0.0] * 4, [0.7] * 5), 0.0)
    assert decision.mode is SwitchMode.RELAUNCH and decision.relaunch_s == 754.0
    assert decision.target is not None and len(changed_nodes(phases_of(4), decision.target)) == 1
    diag = decision.diagnostics
    assert isinstance(diag, DynamoDiagnostics)
    assert diag.prefill_want is Want.SHRINK and diag.decode_want is Want.KEEP and len(diag.moved) == 1


def test_dynamo_makes_no_decision_while_a_relaunch_is_in_flight() -> None:
    decision = DynamoPlanner().decide(dynamo_obs([2.0] * 4, [0.7] * 5, switching=("n8",)), 0.0)
    assert decision.outcome is Outcome.SKIPPED_SWITCH_IN_FLIGHT and decision.target is None
    assert "in flight" in decision.reason


def test_dynamo_keeps_the_pool_bounds() -> None:
    obs = dynamo_obs([0.0], [0.7] * 8)
    assert DynamoPlanner().decide(obs, 0.0).target is None


def test_dynamo_relaunch_duration_is_a_seeded_draw_in_the_measured_range() -> None:
    obs = dynamo_obs([0.0] * 4, [0.7] * 5)
    draws = [DynamoPlanner(rng=random.Random(seed)).decide(obs, 0.0).relaunch_s for seed in range(20)]
    assert all(666.0 <= d <= 831.0 for d in draws) and len(set(draws)) > 1
    again = [DynamoPlanner(rng=random.Random(seed)).decide(obs, 0.0).relaunch_s for seed in range(20)]
    assert draws == again
    with pytest.raises(ValueError, match="relaunch_min_s"):
        DynamoSettings(relaunch_s=900.0)


# ------------------------------------------------------------------------------------------------ Arrow


def arrow_obs(
    prefill: int, queues: dict[int, tuple[int, ...]], decode_requests: int = 8, switching: tuple[str, ...] = (),
    accepted: float | None = 1.0,
) -> PlannerObservation:
    """`accepted`: tokens per decode iteration of the requests finished in the window (None: none finished)."""
    phases = phases_of(prefill)
    load = {
        n: NodeLoad(queued_prefill_inputs=queues.get(i, ()))
        if phases[n] is Phase.PREFILL
        else NodeLoad(decode_requests=decode_requests)
        for i, n in enumerate(NODES)
    }
    nodes = {n: NodeStatus(p, switching=n in switching) for n, p in phases.items()}
    slices = () if accepted is None else (
        SliceStats(0.0, 5.0, finished=10, sum_t_out=3000, sum_decode_iterations=3000 / accepted),
    )
    return PlannerObservation(nodes=nodes, models={n: MODEL for n in NODES}, load=load, slices=slices)


def test_arrow_counts_a_cached_prefix_as_prefill_work_and_tips_toward_prefill() -> None:
    agent_turn = Work(t_uc=2_000, t_c=118_000, t_out=300)  # mostly a reused context
    assert MODEL.prefill_request_time(agent_turn) < 1.0  # what the request really costs
    assert full_prompt_time(MODEL, agent_turn.t_in) > ArrowSettings().ttft_target_s  # what Arrow predicts
    decision = ArrowPlanner().decide(arrow_obs(6, {0: (agent_turn.t_in,)}), 0.0)
    assert decision.outcome is Outcome.SWITCH and decision.target is not None
    assert format_split(decision.target) == "7P2D"
    assert decision.mode is SwitchMode.IN_PLACE_STRAND_KV and "KV stranded" in decision.reason
    diag = decision.diagnostics
    assert isinstance(diag, ArrowDiagnostics) and diag.ttft_violated and not diag.tpot_violated
    # The same request with only its uncached tokens as the prompt does not trigger anything.
    assert ArrowPlanner().decide(arrow_obs(6, {0: (agent_turn.t_uc,)}), 0.0).target is None


def test_arrow_moves_prefill_to_decode_when_tpot_is_missed() -> None:
    slow_decode = ArrowSettings(tpot_target_s=0.03)  # T_iter at 40 running requests is about 0.043 s
    decision = ArrowPlanner(slow_decode).decide(arrow_obs(6, {}, decode_requests=40), 0.0)
    assert decision.target is not None and format_split(decision.target) == "5P4D"
    assert decision.mode is SwitchMode.IN_PLACE_STRAND_KV


def test_arrow_does_not_take_a_decode_node_that_tpot_needs() -> None:
    settings = ArrowSettings(tpot_target_s=0.04)
    # 3 decode nodes at 30 requests each are within target; 2 nodes at 45 each would not be.
    assert MODEL.decode_iteration_time(30) < 0.04 < MODEL.decode_iteration_time(45)
    decision = ArrowPlanner(settings).decide(arrow_obs(6, {0: (120_000,)}, decode_requests=30), 0.0)
    assert decision.outcome is Outcome.HOLD and "TPOT would be" in decision.reason


def test_arrow_holds_when_targets_are_met_and_while_a_switch_is_in_flight() -> None:
    assert ArrowPlanner().decide(arrow_obs(6, {0: (4_000,)}), 0.0).outcome is Outcome.HOLD
    busy = ArrowPlanner().decide(arrow_obs(6, {0: (120_000,)}, switching=("n2",)), 0.0)
    assert busy.outcome is Outcome.SKIPPED_SWITCH_IN_FLIGHT


def test_arrow_judges_tpot_with_the_measured_accepted_tokens() -> None:
    settings = ArrowSettings(tpot_target_s=0.03)  # T_iter at 40 running requests is about 0.043 s
    assert ArrowPlanner(settings).decide(arrow_obs(6, {}, decode_requests=40, accepted=1.0), 0.0).target is not None
    # speculative decoding accepting 2.5 tokens per iteration (the GLM-5.2 profile): TPOT ~0.017 s, within target
    planner = ArrowPlanner(settings)
    observation = arrow_obs(6, {}, decode_requests=40, accepted=2.5)
    assert planner.accepted_tokens(observation) == pytest.approx(2.5)
    assert planner.decide(observation, 0.0).outcome is Outcome.HOLD
    # an explicit setting wins over the measurement
    assert ArrowPlanner(ArrowSettings(accepted_tokens=1.0)).accepted_tokens(observation) == 1.0


def test_arrow_judges_no_tpot_before_a_request_finished() -> None:
    decision = ArrowPlanner(ArrowSettings(tpot_target_s=0.001)).decide(arrow_obs(6, {}, accepted=None), 0.0)
    assert decision.outcome is Outcome.HOLD  # TPOT unknown: no move on it
    spike = ArrowPlanner().decide(arrow_obs(6, {0: (120_000,)}, accepted=None), 0.0)
    assert spike.outcome is Outcome.HOLD and "no decode measured yet" in spike.reason
    with pytest.raises(ValueError, match="accepted_tokens"):
        ArrowSettings(accepted_tokens=0.5)


# ----------------------------------------------------------------------------------------------- Static


@given(
    st.integers(1, 8),
    st.lists(st.floats(0.0, 10.0), min_size=9, max_size=9),
    st.floats(0.0, 1e6),
)
def test_static_never_switches(prefill: int, signals: list[float], now: float) -> None:
    ctx = 100_000
    load = {n: NodeLoad(queued_prefill_tokens=round(s * ctx), context_length=ctx) for n, s in zip(NODES, signals)}
    nodes = {n: NodeStatus(p) for n, p in phases_of(prefill).items()}
    decision = StaticPlanner().decide(PlannerObservation(nodes=nodes, load=load), now)
    assert decision.target is None and decision.outcome is Outcome.HOLD


# ---------------------------------------------------------------------------------------------- Registry


def test_registry_builds_every_planner_with_its_settings() -> None:
    for name in PlannerName:
        assert make_planner(name).name is name
        assert make_planner(name.value).name is name
    assert make_planner("ours", window_s=300, slices=5).interval_s == 300
    assert make_planner(PlannerName.DYNAMO, interval_s=10.0).interval_s == 10.0
    assert "ttft_target_s" in allowed_settings("arrow")


def test_registry_rejects_unknown_names_and_settings() -> None:
    with pytest.raises(ValueError, match="unknown planner policy 'magic'; known: ours, dynamo, arrow, static"):
        make_planner("magic")
    with pytest.raises(ValueError, match=r"unknown setting\(s\) cooldown for planner 'ours'"):
        make_planner("ours", cooldown=5)
    with pytest.raises(ValueError, match="rng for planner 'dynamo' must be a random.Random"):
        make_planner("dynamo", rng=42)
