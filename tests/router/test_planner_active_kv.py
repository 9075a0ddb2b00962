"""Our planner with prefill nodes that cannot hold the active branches' contexts (`OursSettings.active_kv`):
`refuse` (the default) refuses such a move towards decode; with `headroom` it qualifies only with its prefill side
predicted at most `kv_short_utilization` busy; `off` is the paper's rule."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolving_infra.core.types import Phase, Work
from evolving_infra.router.planner import (
    CandidateVerdict,
    NodeStatus,
    Outcome,
    OursPlanner,
    OursSettings,
    PlannerObservation,
    SliceStats,
    format_split,
    split_throughput,
)
from evolving_infra.router.planner.active_kv import ActiveKv, prefill_utilization, refused
from evolving_infra.router.planner.throughput import SplitThroughput

from .test_planner_ours import MODELS, NODES, NOW, diag_of, jitter, observe, record_window, split_of

REFUSE = OursPlanner(OursSettings(active_kv=ActiveKv.REFUSE))


def headroom(limit: float = 0.5) -> OursPlanner:
    return OursPlanner(OursSettings(active_kv=ActiveKv.HEADROOM, kv_short_utilization=limit))


KV_CASES = {"active": st.integers(0, 12_000), "prefill": st.integers(1, 8), "per_node": st.integers(1, 2_000),
            "limit": st.floats(0.05, 1.0), "q_bar": st.sampled_from([30.0, 90.0, 150.0])}
"""Active context pages, current prefill count, pages per node, headroom limit, q̄ (the properties below)."""
LONG_OUTPUTS = Work(t_uc=2000, t_c=60_000, t_out=2000, t_acc=1.8)  # favours 1P8D or 2P7D from 3P6D


def observe_kv(prefill: int, slices: tuple[SliceStats, ...], active: int | None, per_node: int = 1000) -> PlannerObservation:
    nodes = {n: NodeStatus(phase) for n, phase in split_of(prefill).items()}
    return PlannerObservation(nodes=nodes, slices=slices, models=MODELS, active_kv_pages=active,
                              kv_pages={n: per_node for n in NODES})  # fmt: skip


def test_refuse_a_move_towards_decode_whose_prefill_nodes_cannot_hold_the_active_contexts() -> None:
    long_outputs = Work(t_uc=2000, t_c=60_000, t_out=2000, t_acc=1.8)  # favours 1P8D or 2P7D from 3P6D
    slices = record_window(jitter(long_outputs), lambda i: 30, lambda i: 90.0)
    assert format_split(OursPlanner().decide(observe_kv(3, slices, 1000), NOW).target or {}) in {"1P8D", "2P7D"}
    # one prefill node holds 1,000 pages, two 2,000, three 3,000: with 2,501 active pages no move towards decode is left
    decision = REFUSE.decide(observe_kv(3, slices, 2500 + 1), NOW)
    diag = diag_of(decision.diagnostics)
    assert decision.outcome is Outcome.HOLD and decision.target is None
    assert diag.active_kv_pages == 2501
    by_p = {c.prefill_count: c for c in diag.candidates}
    for p in (1, 2):
        assert by_p[p].verdict is CandidateVerdict.PREFILL_KV_SHORT and by_p[p].prefill_kv_pages == 1000 * p
        assert by_p[p].mean_gain is not None and by_p[p].mean_gain > 0  # its gains are still listed
    assert "would not hold the active contexts (2,501 pages)" in decision.reason
    # with 1,500 active pages two prefill nodes hold them: 2P7D may be chosen, 1P8D may not
    decision = REFUSE.decide(observe_kv(3, slices, 1500), NOW)
    assert decision.target is not None and format_split(decision.target) == "2P7D"
    assert {c.prefill_count: c.verdict for c in diag_of(decision.diagnostics).candidates}[1] is CandidateVerdict.PREFILL_KV_SHORT


def test_moves_towards_prefill_are_never_refused_for_kv() -> None:
    heavy = Work(t_uc=20_000, t_c=60_000, t_out=300, t_acc=1.8)
    slices = record_window(jitter(heavy), lambda i: 30, lambda i: 90.0)
    free = OursPlanner().decide(observe(3, slices), NOW)
    short = REFUSE.decide(observe_kv(3, slices, 10**9), NOW)  # no split holds them
    assert free.target is not None and short.target == free.target
    assert all(c.verdict is not CandidateVerdict.PREFILL_KV_SHORT for c in diag_of(short.diagnostics).candidates
               if c.prefill_count > 3)  # fmt: skip


def test_without_sizes_or_with_the_rule_off_the_paper_rule_decides() -> None:
    long_outputs = Work(t_uc=2000, t_c=60_000, t_out=2000, t_acc=1.8)
    slices = record_window(jitter(long_outputs), lambda i: 30, lambda i: 90.0)
    paper = OursPlanner().decide(observe(3, slices), NOW)
    assert OursPlanner().decide(observe_kv(3, slices, None), NOW).target == paper.target
    off = OursPlanner(OursSettings(active_kv=ActiveKv.OFF)).decide(observe_kv(3, slices, 10**9), NOW)
    assert off.target == paper.target and paper.target is not None
    assert [c.prefill_kv_pages for c in diag_of(off.diagnostics).candidates] == [1000 * p for p in (1, 2, 4, 5, 6, 7, 8)]
    from evolving_infra.router.planner.registry import PLANNERS

    planner = PLANNERS.build("ours", {"active_kv": "off", "kv_short_utilization": 0.7}, random.Random(0))
    assert isinstance(planner, OursPlanner) and planner.settings.active_kv is ActiveKv.OFF
    assert planner.settings.kv_short_utilization == 0.7


@given(active=st.integers(0, 12_000), prefill=st.integers(1, 8), per_node=st.integers(1, 2_000))
@settings(max_examples=60, deadline=None)
def test_with_refuse_a_chosen_move_towards_decode_always_holds_the_active_contexts(active: int, prefill: int, per_node: int) -> None:
    long_outputs = Work(t_uc=2000, t_c=60_000, t_out=2000, t_acc=1.8)
    slices = record_window(jitter(long_outputs), lambda i: 30, lambda i: 90.0)
    decision = OursPlanner(OursSettings(active_kv=ActiveKv.REFUSE)).decide(observe_kv(prefill, slices, active, per_node), NOW)
    for c in diag_of(decision.diagnostics).candidates:
        assert c.prefill_kv_pages == per_node * c.prefill_count
        short = c.prefill_count < prefill and per_node * c.prefill_count < active
        assert (c.verdict is CandidateVerdict.PREFILL_KV_SHORT) == short
        assert not (c.chosen and short)
    if decision.target is not None:
        chosen_p = sum(p is Phase.PREFILL for p in decision.target.values())
        assert chosen_p > prefill or per_node * chosen_p >= active


# -- with headroom ---------------------------------------------------------------------------------------------
def test_a_move_that_cannot_hold_the_active_contexts_qualifies_only_with_prefill_headroom() -> None:
    slices = record_window(jitter(LONG_OUTPUTS), lambda i: 30, lambda i: 150.0)
    off = OursPlanner(OursSettings(active_kv=ActiveKv.OFF)).decide(observe_kv(3, slices, 10**9), NOW)
    assert off.target is not None and format_split(off.target) == "1P8D"
    decision = headroom().decide(observe_kv(3, slices, 10**9), NOW)  # no split holds the active contexts
    by_p = {c.prefill_count: c for c in diag_of(decision.diagnostics).candidates}
    # 1P8D would load its one prefill node over half (eq. 5); 2P7D keeps it under a quarter
    assert by_p[1].prefill_utilization is not None and by_p[1].prefill_utilization > 0.5
    assert by_p[1].verdict is CandidateVerdict.PREFILL_KV_SHORT and by_p[1].mean_gain is not None
    assert by_p[2].prefill_utilization is not None and by_p[2].prefill_utilization < 0.5
    assert decision.target is not None and format_split(decision.target) == "2P7D"
    # its figure is eq. 5's: Θ / Σµ_P of the candidate, mean over the slices of its gains
    expected = []
    for s in slices:
        work, q = s.mean_work, s.mean_decode_requests
        assert work is not None and q is not None
        expected.append(prefill_utilization(split_throughput(NODES[:2], NODES[2:], MODELS, work, q + (s.mean_prefill_backlog or 0.0))))
    assert by_p[2].prefill_utilization == pytest.approx(statistics.fmean(expected), rel=1e-12)
    # with a higher limit, or prefill memory that holds the active contexts, 1P8D is chosen as the paper's rule does
    loose = headroom(0.9).decide(observe_kv(3, slices, 10**9), NOW)
    assert loose.target == off.target
    assert headroom().decide(observe_kv(3, slices, 999), NOW).target == off.target


@given(**KV_CASES)
@settings(max_examples=60, deadline=None)
def test_with_headroom_a_move_is_refused_only_when_short_and_busy(
    active: int, prefill: int, per_node: int, limit: float, q_bar: float
) -> None:
    slices = record_window(jitter(LONG_OUTPUTS), lambda i: 30, lambda i: q_bar)
    observation = observe_kv(prefill, slices, active, per_node)
    decision = headroom(limit).decide(observation, NOW)
    paper = OursPlanner(OursSettings(active_kv=ActiveKv.OFF)).decide(observation, NOW)
    mine = diag_of(decision.diagnostics).candidates
    for c, p in zip(mine, diag_of(paper.diagnostics).candidates, strict=True):
        short = c.prefill_count < prefill and per_node * c.prefill_count < active
        assert c.gains == p.gains and c.prefill_utilization is not None and 0.0 <= c.prefill_utilization <= 1.0
        if c.verdict is CandidateVerdict.PREFILL_KV_SHORT:  # only a qualified move, short and too busy
            assert short and c.prefill_utilization > limit and p.verdict is CandidateVerdict.QUALIFIED
        else:
            assert c.verdict is p.verdict
    if decision.target is not None:
        chosen = next(c for c in mine if c.chosen)
        short = chosen.prefill_count < prefill and per_node * chosen.prefill_count < active
        assert not short or (chosen.prefill_utilization or 0.0) <= limit
    if all(c.verdict is not CandidateVerdict.PREFILL_KV_SHORT for c in mine):
        assert decision.target == paper.target


def test_the_default_refuses() -> None:
    assert OursSettings().active_kv is ActiveKv.REFUSE and OursSettings().kv_short_utilization == 0.5


def test_the_rule_and_its_limit_are_validated() -> None:
    with pytest.raises(ValueError, match="kv_short_utilization"):
        OursSettings(kv_short_utilization=0.0)
    with pytest.raises(ValueError, match="kv_short_utilization"):
        OursSettings(kv_short_utilization=1.5)
    assert prefill_utilization(SplitThroughput(prefill=math.inf, decode=3.0)) == 0.0
    assert prefill_utilization(SplitThroughput(prefill=4.0, decode=1.0)) == 0.25
    assert prefill_utilization(SplitThroughput(prefill=4.0, decode=9.0)) == 1.0  # prefill-bound
    assert not refused(ActiveKv.HEADROOM, False, 0.99, 0.5) and refused(ActiveKv.HEADROOM, True, None, 0.5)
    assert refused(ActiveKv.REFUSE, True, 0.0, 0.5) and not refused(ActiveKv.OFF, True, 1.0, 0.5)


# -- the check between decisions -------------------------------------------------------------------------------
def predicted_busy(prefill: int, slices: tuple[SliceStats, ...]) -> list[float]:
    """Θ / Σµ_P of the split with `prefill` prefill nodes on each slice with requests (q̄ with the prefill backlog)."""
    return [prefill_utilization(split_throughput(NODES[:prefill], NODES[prefill:], MODELS, s.mean_work,
                                                 (s.mean_decode_requests or 0.0) + (s.mean_prefill_backlog or 0.0)))
            for s in slices if s.mean_work is not None]  # fmt: skip


def test_the_check_moves_a_short_split_that_lost_its_headroom_to_the_best_one_that_has_it() -> None:
    slices = record_window(jitter(LONG_OUTPUTS), lambda i: 30, lambda i: 150.0)
    busy_now = predicted_busy(1, slices)
    assert statistics.fmean(busy_now) > 0.5  # 1P8D is predicted over half busy on these slices
    planner = headroom()
    assert planner.check_interval_s == planner.settings.window.slice_s
    decision = planner.check(observe_kv(1, slices, 10**9), NOW)
    assert decision is not None and decision.outcome is Outcome.SWITCH and decision.target is not None
    diag = diag_of(decision.diagnostics)
    assert [c.prefill_count for c in diag.candidates] == list(range(2, 9))  # only moves towards prefill
    allowed = [c for c in diag.candidates if c.verdict is CandidateVerdict.RESTORES_HEADROOM]
    assert allowed and all((c.prefill_utilization or 1.0) <= 0.5 for c in allowed)
    assert all((c.prefill_utilization or 0.0) > 0.5 for c in diag.candidates if c.verdict is CandidateVerdict.PREFILL_KV_SHORT)
    chosen = next(c for c in diag.candidates if c.chosen)
    assert chosen.mean_gain == max(c.mean_gain or 0.0 for c in allowed)
    assert format_split(decision.target) == chosen.split and decision.reason.startswith("check: 1P8D")
    # the slices count as evidence about 1P8D from now on
    assert planner.evidence(NOW) == {1: len(busy_now)}


def test_the_check_holds_while_the_premise_holds() -> None:
    slices = record_window(jitter(LONG_OUTPUTS), lambda i: 30, lambda i: 150.0)
    assert headroom().check(observe_kv(1, slices, 999), NOW) is None  # one prefill node holds the active contexts
    assert headroom(0.95).check(observe_kv(1, slices, 10**9), NOW) is None  # under a looser limit
    assert headroom().check(observe_kv(2, slices, 10**9), NOW) is None  # 2P7D keeps its headroom
    assert REFUSE.check(observe_kv(1, slices, 10**9), NOW) is None and REFUSE.check_interval_s is None
    cooling = PlannerObservation(nodes={n: NodeStatus(p) for n, p in split_of(1).items()}, slices=slices, models=MODELS,
                                 active_kv_pages=10**9, kv_pages={n: 1000 for n in NODES}, last_switch_end=NOW - 60.0)
    assert headroom().check(cooling, NOW) is None  # within the cooldown
    assert headroom().check(observe_kv(1, slices[-1:], 10**9), NOW) is None  # one slice is too few


@given(**KV_CASES)
@settings(max_examples=60, deadline=None)
def test_a_check_switches_only_a_short_split_past_its_limit_and_only_to_an_allowed_one(
    active: int, prefill: int, per_node: int, limit: float, q_bar: float
) -> None:
    slices = record_window(jitter(LONG_OUTPUTS), lambda i: 30, lambda i: q_bar)
    decision = headroom(limit).check(observe_kv(prefill, slices, active, per_node), NOW)
    busy = predicted_busy(prefill, slices)
    past = statistics.fmean(busy) - limit > 2 * statistics.stdev(busy) / math.sqrt(len(busy))
    short = per_node * prefill < active
    if decision is None:  # it holds only while the premise holds, or when no split with more prefill nodes is allowed
        assert not (short and past and prefill < 8 and per_node * 8 >= active)
        return
    assert short and past and decision.target is not None
    chosen = next(c for c in diag_of(decision.diagnostics).candidates if c.chosen)
    assert chosen.prefill_count > prefill and chosen.verdict is CandidateVerdict.RESTORES_HEADROOM
    assert per_node * chosen.prefill_count >= active or (chosen.prefill_utilization or 0.0) <= limit
    assert format_split(decision.target) == chosen.split
