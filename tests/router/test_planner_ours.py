"""Our planner (eq. 5/6, E.3 outer loop): switches on sustained shifts, not on bursts; cooldown and draining;
diagnostics for every candidate and slice."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients
from evolving_infra.core.types import NodeId, Phase, Work
from evolving_infra.router.planner.ours import DecodeDemand
from evolving_infra.router.planner import (
    CandidateVerdict,
    CoefficientNodeModel,
    DynamoPlanner,
    MeanWork,
    NodeLoad,
    NodeStatus,
    Outcome,
    OursDiagnostics,
    OursPlanner,
    OursSettings,
    PlannerObservation,
    SliceRecorder,
    SliceStats,
    SliceUse,
    SwitchMode,
    format_split,
    split_throughput,
)
from evolving_infra.router.planner.split import fewest_changes_split

NODES = [NodeId(f"n{i}") for i in range(9)]
MODEL = CoefficientNodeModel(
    PrefillCoefficients(c0=0.02, c1=5e-5, c2=1e-10, c3=1e-6),
    DecodeCoefficients(d0=0.015, d1=0.02, d2=2e-4, k=8, experts=256, t_fwd=2.0),
    t_bar=8192.0,
    f_restore=0.1,
)
MODELS = {n: MODEL for n in NODES}
BASE = Work(t_uc=2000, t_c=60_000, t_out=300, t_acc=1.8)  # best split 3P6D at q̄ = 90
NOW = 1200.0


def split_of(prefill: int) -> dict[NodeId, Phase]:
    return {n: (Phase.PREFILL if i < prefill else Phase.DECODE) for i, n in enumerate(NODES)}


def record_window(
    work_of: Callable[[int, random.Random], Work],
    requests_of: Callable[[int], int],
    q_bar_of: Callable[[int], float],
    seed: int = 7,
    end: float = NOW,
    backlog_of: Callable[[int], float] | None = None,
) -> tuple[SliceStats, ...]:
    """Ten 60 s slices ending at `end`: per slice i, `requests_of(i)` requests, occupancy around q̄_i and (with
    `backlog_of`) a prefill backlog around `backlog_of(i)`."""
    rng = random.Random(seed)
    start = end - 600.0
    rec = SliceRecorder(origin=start, slice_s=60.0, keep=10)
    for i in range(10):
        t0 = start + 60.0 * i
        rec.record_decode_occupancy(round(q_bar_of(i) * rng.uniform(0.97, 1.03)), t0)
        if backlog_of is not None:
            rec.record_prefill_backlog(round(backlog_of(i) * rng.uniform(0.97, 1.03)), t0)
        n = requests_of(i)
        for j in range(n):
            rec.record_request(work_of(i, rng), t0 + 60.0 * j / max(n, 1))
    return rec.completed(end)


def jitter(work: Work) -> Callable[[int, random.Random], Work]:
    def make(_: int, rng: random.Random) -> Work:
        return Work(
            t_uc=round(work.t_uc * rng.uniform(0.9, 1.1)),
            t_c=round(work.t_c * rng.uniform(0.9, 1.1)),
            t_out=round(work.t_out * rng.uniform(0.9, 1.1)),
            t_acc=work.t_acc,
        )

    return make


def observe(
    prefill: int, slices: tuple[SliceStats, ...], last_switch_end: float | None = None, switching: tuple[str, ...] = ()
) -> PlannerObservation:
    nodes = {n: NodeStatus(phase, switching=n in switching) for n, phase in split_of(prefill).items()}
    return PlannerObservation(nodes=nodes, last_switch_end=last_switch_end, slices=slices, models=MODELS)


def diag_of(decision: object) -> OursDiagnostics:
    assert isinstance(decision, OursDiagnostics)
    return decision


def test_base_workload_has_its_optimum_at_3p6d() -> None:
    thetas = {
        p: split_throughput(NODES[:p], NODES[p:], MODELS, MeanWork.of(BASE), 90.0).theta for p in range(1, 9)
    }
    assert max(thetas, key=lambda p: thetas[p]) == 3


def test_sustained_shift_to_prefill_heavy_work_switches_toward_prefill() -> None:
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    slices = record_window(jitter(heavy), lambda i: 30, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices), NOW)
    assert decision.outcome is Outcome.SWITCH and decision.mode is SwitchMode.IN_PLACE
    assert decision.target is not None
    assert format_split(decision.target) in {f"{p}P{9 - p}D" for p in range(4, 9)}
    chosen = [c for c in diag_of(decision.diagnostics).candidates if c.chosen]
    assert len(chosen) == 1 and chosen[0].verdict is CandidateVerdict.QUALIFIED
    # Only prefill nodes were added; nodes already in prefill stay there.
    assert all(decision.target[n] is Phase.PREFILL for n in NODES[:3])


def test_sustained_shift_to_decode_heavy_work_switches_toward_decode() -> None:
    long_outputs = Work(t_uc=2000, t_c=60_000, t_out=2000, t_acc=1.8)
    slices = record_window(jitter(long_outputs), lambda i: 30, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices), NOW)
    assert decision.outcome is Outcome.SWITCH and decision.target is not None
    assert format_split(decision.target) in {"1P8D", "2P7D"}


def test_a_prefill_starved_split_moves_towards_prefill_only_when_q_counts_the_prefill_backlog() -> None:
    """At 1P8D under prefill-heavy work, prefill delivers about half of what its model predicts and a long queue
    waits for it, so the requests in decode are few (q̄ = 2, Little's law at the delivered rate): Θ at that q̄
    rates decode below the predicted prefill, so the paper's q̄ sees no gain in any move towards prefill, while
    q̄ with the prefill backlog (the queued requests are decode demand) does."""
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    slices = record_window(jitter(heavy), lambda i: 30, lambda i: 2.0, backlog_of=lambda i: 150.0)
    assert all(s.mean_prefill_backlog is not None and 140 < s.mean_prefill_backlog < 160 for s in slices)
    paper = OursPlanner(OursSettings(decode_demand=DecodeDemand.IN_DECODE)).decide(observe(1, slices), NOW)
    assert paper.target is None or format_split(paper.target) == "1P8D"
    assert not any(c.mean_gain is not None and c.mean_gain > 0 for c in diag_of(paper.diagnostics).candidates)
    backlog = OursPlanner().decide(observe(1, slices), NOW)  # the default
    assert backlog.outcome is Outcome.SWITCH and backlog.target is not None
    assert format_split(backlog.target) in {f"{p}P{9 - p}D" for p in range(2, 9)}


def test_without_a_prefill_backlog_both_decode_demands_decide_alike() -> None:
    for work in (BASE, Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8), Work(t_uc=2000, t_c=60_000, t_out=2000, t_acc=1.8)):
        slices = record_window(jitter(work), lambda i: 30, lambda i: 90.0, backlog_of=lambda i: 0.0)
        paper = OursPlanner(OursSettings(decode_demand=DecodeDemand.IN_DECODE)).decide(observe(3, slices), NOW)
        backlog = OursPlanner(OursSettings(decode_demand=DecodeDemand.WITH_PREFILL_BACKLOG)).decide(observe(3, slices), NOW)
        assert (paper.outcome, paper.target) == (backlog.outcome, backlog.target)


def test_stationary_workload_at_the_best_split_holds() -> None:
    slices = record_window(jitter(BASE), lambda i: 30, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices), NOW)
    assert decision.outcome is Outcome.HOLD and decision.target is None


def test_burst_of_sub_agents_does_not_switch_but_a_queue_rule_reacts() -> None:
    """A burst in one slice with the same per-request work leaves w̄_i unchanged and barely moves q̄_i."""
    same = lambda i, rng: BASE  # noqa: E731 - identical work per request: only the count changes
    burst_slice = 6
    slices = record_window(
        same, lambda i: 300 if i == burst_slice else 20, lambda i: 95.0 if i == burst_slice else 90.0
    )
    assert slices[burst_slice].requests == 300
    burst_work, calm_work = slices[burst_slice].mean_work, slices[0].mean_work
    assert burst_work is not None and calm_work is not None
    assert burst_work.t_uc == calm_work.t_uc and burst_work.query_key_pairs == calm_work.query_key_pairs
    assert burst_work.decode_iterations == pytest.approx(calm_work.decode_iterations)  # w̄ does not move
    decision = OursPlanner().decide(observe(3, slices), NOW)
    diag = diag_of(decision.diagnostics)
    assert decision.outcome is Outcome.HOLD, decision.reason
    assert all(c.verdict is not CandidateVerdict.QUALIFIED for c in diag.candidates)

    # The same burst as momentary queues: 300 requests of 62K prompt tokens spread over the prefill engines.
    queued = 300 * BASE.t_in // 3
    load = {n: NodeLoad(queued_prefill_tokens=queued, context_length=131_072) for n in NODES[:3]}
    load |= {n: NodeLoad(decode_kv_tokens=700_000, kv_capacity_tokens=1_000_000) for n in NODES[3:]}
    nodes = {n: NodeStatus(p) for n, p in split_of(3).items()}
    dynamo = DynamoPlanner().decide(PlannerObservation(nodes=nodes, load=load), NOW)
    assert dynamo.outcome is Outcome.SWITCH and dynamo.target is not None
    assert format_split(dynamo.target) == "4P5D"


def test_a_gain_on_a_single_slice_never_qualifies() -> None:
    """A candidate that only wins on one slice (zero gain elsewhere) stays below 2σ/√m."""
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    spike = 4

    def work(i: int, rng: random.Random) -> Work:
        return heavy if i == spike else BASE

    slices = record_window(work, lambda i: 30, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices), NOW)
    assert decision.outcome is Outcome.HOLD
    for c in diag_of(decision.diagnostics).candidates:
        if c.prefill_count > 3:
            assert c.gains[spike] > 0
        assert c.verdict is CandidateVerdict.BELOW_THRESHOLD


def test_cooldown_after_a_switch_is_respected_with_the_reason() -> None:
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    slices = record_window(jitter(heavy), lambda i: 30, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices, last_switch_end=NOW - 119.0), NOW)
    assert decision.outcome is Outcome.SKIPPED_COOLDOWN and decision.target is None
    assert "120 s after the last switch" in decision.reason
    assert diag_of(decision.diagnostics).cooldown_until == NOW + 1.0
    # Once the cooldown is over, only slices that start after it count.
    later = OursPlanner().decide(observe(3, slices, last_switch_end=NOW - 300.0), NOW)
    diag = diag_of(later.diagnostics)
    assert diag.count(SliceUse.BEFORE_COOLDOWN_END) == 7 and diag.count(SliceUse.USED) == 3
    assert later.outcome is Outcome.SWITCH


def test_no_decision_while_a_node_is_draining() -> None:
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    slices = record_window(jitter(heavy), lambda i: 30, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices, switching=("n3",)), NOW)
    assert decision.outcome is Outcome.SKIPPED_SWITCH_IN_FLIGHT and decision.target is None
    assert "draining" in decision.reason and "n3" in decision.reason
    assert diag_of(decision.diagnostics).switching == ("n3",)


def test_every_candidate_and_slice_has_diagnostics() -> None:
    slices = record_window(jitter(BASE), lambda i: 0 if i in (2, 5) else 30, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices), NOW)
    diag = diag_of(decision.diagnostics)
    assert diag.current_split == "3P6D"
    assert sorted(c.prefill_count for c in diag.candidates) == [1, 2, 4, 5, 6, 7, 8]
    for c in diag.candidates:
        assert len(c.gains) == 8 and c.mean_gain is not None and c.std_error is not None
        assert c.threshold == pytest.approx(2 * c.std_error)
        assert c.verdict in (CandidateVerdict.QUALIFIED, CandidateVerdict.BELOW_THRESHOLD)
        assert len(c.moved) == abs(c.prefill_count - 3)
    assert len(diag.slices) == 10 and diag.count(SliceUse.EMPTY) == 2
    for s in diag.slices:
        assert (s.current_theta is not None) == (s.use is SliceUse.USED)


def test_fewer_than_two_usable_slices_never_qualify() -> None:
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    slices = record_window(jitter(heavy), lambda i: 30 if i == 9 else 0, lambda i: 90.0)
    decision = OursPlanner().decide(observe(3, slices), NOW)
    assert decision.outcome is Outcome.HOLD
    assert {c.verdict for c in diag_of(decision.diagnostics).candidates} == {CandidateVerdict.TOO_FEW_SLICES}


def test_candidates_respect_min_prefill_and_min_decode() -> None:
    slices = record_window(jitter(BASE), lambda i: 30, lambda i: 90.0)
    planner = OursPlanner(OursSettings(min_prefill=2, min_decode=3))
    counts = [c.prefill_count for c in diag_of(planner.decide(observe(3, slices), NOW).diagnostics).candidates]
    assert counts == [2, 4, 5, 6]


def test_missing_node_model_is_a_clear_error() -> None:
    slices = record_window(jitter(BASE), lambda i: 30, lambda i: 90.0)
    obs = PlannerObservation(nodes={n: NodeStatus(p) for n, p in split_of(3).items()}, slices=slices, models={})
    with pytest.raises(ValueError, match="no node model for node"):
        OursPlanner().decide(obs, NOW)


def test_move_cost_hint_picks_which_nodes_move() -> None:
    slices = record_window(jitter(BASE), lambda i: 30, lambda i: 90.0)
    costs = {"n1": 0.5, "n2": 0.0}  # prefill nodes n0..n3; the others cost 1
    nodes = {n: NodeStatus(p, move_cost=costs.get(n, 1.0)) for n, p in split_of(4).items()}
    decision = OursPlanner().decide(PlannerObservation(nodes=nodes, slices=slices, models=MODELS), NOW)
    moved = {c.prefill_count: c.moved for c in diag_of(decision.diagnostics).candidates}
    assert moved[3] == ("n2",) and moved[2] == ("n1", "n2") and moved[1] == ("n0", "n1", "n2")
    assert moved[5] == ("n4",)  # equal costs: lowest node id first


# -- evidence from a split that ran (history_s) -------------------------------------------------------------------
# Under the current split the planner measures w̄ and q̄, and eq. 5 rates every candidate on them; but they move
# with the split. WORK_AT_3P is what a window at 3P6D measures (eq. 5 then favours 2P7D by ~1.1 req/s), WORK_AT_2P
# what the window at 2P7D measures after the move (more uncached tokens per request, fewer requests in decode:
# eq. 5 now favours 3P6D by ~0.25 req/s). The paper's rule goes back and forth between them.
WORK_AT_3P, Q_AT_3P = Work(t_uc=1000, t_c=60_000, t_out=300, t_acc=1.8), 120.0
WORK_AT_2P, Q_AT_2P = Work(t_uc=2500, t_c=60_000, t_out=400, t_acc=1.8), 90.0


def window_at(work: Work, q_bar: float, end: float, seed: int = 7) -> tuple[SliceStats, ...]:
    return record_window(jitter(work), lambda i: 30, lambda i: q_bar, seed=seed, end=end)


def test_the_paper_rule_alternates_when_each_split_measures_a_workload_that_favours_the_other() -> None:
    planner = OursPlanner(OursSettings(history_s=0.0))
    first = planner.decide(observe(3, window_at(WORK_AT_3P, Q_AT_3P, NOW)), NOW)
    assert first.target is not None and format_split(first.target) == "2P7D"
    later = NOW + 1200.0
    back = planner.decide(observe(2, window_at(WORK_AT_2P, Q_AT_2P, later), last_switch_end=NOW + 5.0), later)
    assert back.target is not None and format_split(back.target) == "3P6D"
    assert planner.evidence(later) == {}  # history_s = 0 keeps nothing


def test_a_split_it_left_is_judged_on_the_slices_measured_while_it_ran() -> None:
    planner = OursPlanner()  # default history_s = 3600
    first = planner.decide(observe(3, window_at(WORK_AT_3P, Q_AT_3P, NOW)), NOW)
    assert first.target is not None and format_split(first.target) == "2P7D"
    assert planner.evidence(NOW) == {3: 10}
    later = NOW + 1200.0
    hold = planner.decide(observe(2, window_at(WORK_AT_2P, Q_AT_2P, later), last_switch_end=NOW + 5.0), later)
    assert hold.outcome is Outcome.HOLD, hold.reason
    back = {c.prefill_count: c for c in diag_of(hold.diagnostics).candidates}[3]
    assert back.history == 10 and len(back.gains) == 20
    assert sum(back.gains[:10]) > 0 > sum(back.gains[10:])  # this window favours 3P6D, the one measured at 3P6D not
    assert back.mean_gain is not None and back.mean_gain < 0
    # Candidates that never ran are judged on the current window alone.
    assert all(c.history == 0 and len(c.gains) == 10 for c in diag_of(hold.diagnostics).candidates if c.prefill_count != 3)
    assert planner.evidence(later) == {2: 10, 3: 10}


def test_a_real_shift_still_moves_back_past_the_evidence() -> None:
    planner = OursPlanner()
    planner.decide(observe(3, window_at(WORK_AT_3P, Q_AT_3P, NOW)), NOW)
    later = NOW + 1200.0
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    decision = planner.decide(observe(2, window_at(heavy, 90.0, later), last_switch_end=NOW + 5.0), later)
    assert decision.outcome is Outcome.SWITCH and decision.target is not None
    assert sum(1 for p in decision.target.values() if p is Phase.PREFILL) > 3
    chosen = next(c for c in diag_of(decision.diagnostics).candidates if c.chosen)
    assert chosen.verdict is CandidateVerdict.QUALIFIED


def test_evidence_expires_after_history_s() -> None:
    planner = OursPlanner(OursSettings(history_s=900.0))
    planner.decide(observe(3, window_at(WORK_AT_3P, Q_AT_3P, NOW)), NOW)
    assert planner.evidence(NOW + 360.0) == {3: 10}  # the first slice ended at NOW - 540
    assert planner.evidence(NOW + 900.0) == {3: 1}  # each slice counts for history_s after it ended
    assert planner.evidence(NOW + 901.0) == {}
    later = NOW + 1200.0  # too late: the paper's rule again, and it goes back
    back = planner.decide(observe(2, window_at(WORK_AT_2P, Q_AT_2P, later), last_switch_end=NOW + 5.0), later)
    assert back.target is not None and format_split(back.target) == "3P6D"
    assert all(c.history == 0 for c in diag_of(back.diagnostics).candidates)


def test_history_s_is_validated_and_reachable_by_name() -> None:
    with pytest.raises(ValueError, match="history_s"):
        OursSettings(history_s=-1.0)
    with pytest.raises(ValueError, match="history_s"):
        OursSettings(history_s=math.inf)
    from evolving_infra.router.planner.registry import make_planner

    planner = make_planner("ours", history_s=0)
    assert isinstance(planner, OursPlanner) and planner.settings.history_s == 0


_WORKS = st.builds(
    Work,
    t_uc=st.integers(200, 30_000),
    t_c=st.integers(0, 120_000),
    t_out=st.integers(50, 3_000),
    t_acc=st.sampled_from([1.0, 1.8, 2.5]),
)


@settings(max_examples=25, deadline=None)
@given(
    work_a=_WORKS, work_b=_WORKS, q_a=st.floats(5.0, 200.0), q_b=st.floats(5.0, 200.0),
    split_a=st.integers(1, 8), split_b=st.integers(1, 8), gap=st.floats(600.0, 5000.0),
)
def test_a_candidate_gains_are_this_window_then_the_slices_measured_while_it_ran(
    work_a: Work, work_b: Work, q_a: float, q_b: float, split_a: int, split_b: int, gap: float
) -> None:
    """Whatever two windows measure, at the second decision a candidate's gains are those of a planner without
    memory on this window, followed (if the candidate ran within history_s) by Θ(candidate) - Θ(current) recomputed
    here on every slice of the first window; a stateless planner's decision is the paper's rule on this window."""
    window_a, later = window_at(work_a, q_a, NOW), NOW + gap
    window_b = window_at(work_b, q_b, later, seed=11)
    planner = OursPlanner()
    planner.decide(observe(split_a, window_a), NOW)
    decision = planner.decide(observe(split_b, window_b), later)
    fresh = OursPlanner(OursSettings(history_s=0.0)).decide(observe(split_b, window_b), later)
    mine = {c.prefill_count: c for c in diag_of(decision.diagnostics).candidates}
    theirs = {c.prefill_count: c for c in diag_of(fresh.diagnostics).candidates}
    assert mine.keys() == theirs.keys()
    kept = [s for s in window_a if s.end >= later - 3600.0] if split_a != split_b else []
    for p, c in mine.items():
        assert c.gains[: len(theirs[p].gains)] == theirs[p].gains
        if p == split_a and kept:
            target = fewest_changes_split(split_of(split_b), p, {})
            cand_p = [n for n in NODES if target[n] is Phase.PREFILL]
            cand_d = [n for n in NODES if target[n] is Phase.DECODE]
            expected = []
            for s in kept:
                work = s.mean_work
                assert work is not None and s.mean_decode_requests is not None
                q = s.mean_decode_requests + (s.mean_prefill_backlog or 0.0)
                now_theta = split_throughput(NODES[:split_b], NODES[split_b:], MODELS, work, q).theta
                expected.append(split_throughput(cand_p, cand_d, MODELS, work, q).theta - now_theta)
            assert c.history == len(kept)
            assert c.gains[len(theirs[p].gains) :] == pytest.approx(expected, rel=1e-12, abs=1e-12)
        else:
            assert c.history == 0 and c.gains == theirs[p].gains
    if all(c.history == 0 for c in mine.values()):
        assert (decision.outcome, decision.target) == (fresh.outcome, fresh.target)


def test_observation_sizes_are_validated() -> None:
    nodes = {n: NodeStatus(phase) for n, phase in split_of(3).items()}
    with pytest.raises(ValueError, match="active_kv_pages"):
        PlannerObservation(nodes=nodes, active_kv_pages=-1)
    with pytest.raises(ValueError, match="kv_pages"):
        PlannerObservation(nodes=nodes, kv_pages={NODES[0]: 0})
