"""The control core (router/core/control.py), the one orchestration of a cluster for both drivers: the collocated
warmup and its end, planner ticks, switch orders with bounded increasing generations, the cooldown measured from
a switch's end, node loss, and the planner's decode work measured from finished requests (no oracle)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evolving_infra.core.kv_events import KvStored
from evolving_infra.core.types import NodeId, NodeMode, Phase, Tier
from evolving_infra.node_agent.profiles import load_profile
from evolving_infra.router.core import CoreSettings, NodeTrack, PoolSnapshot, RouterCore
from evolving_infra.router.core.control import (
    MAX_GENERATION, ControlCore, ControlPhase, ControlSettings, ModelsFrozen, NodeLost, PlannerDecided,
    RecordKind, RequestFinished, SwitchCompleted, SwitchOrder, Tick, WarmupExit,
)  # fmt: skip
from evolving_infra.router.core.models import ModelBook, ModelOrigin
from evolving_infra.router.planner import (
    Outcome, PlannerDecision, PlannerObservation, SwitchMode, WindowConfig,
)  # fmt: skip
from evolving_infra.router.routing import make_decode_binder, make_prefill_router
from evolving_infra.sim.models import shape_of

from tests.router.test_core_flow import PT, request

SHAPE = shape_of(load_profile("deepseek-v4-flash-4xh200-tp4"))
INITIAL = {NodeId("n0"): Phase.PREFILL, NodeId("n1"): Phase.DECODE, NodeId("n2"): Phase.DECODE}


@dataclass
class ScriptedPlanner:
    """Returns the queued decisions in turn (HOLD when none is left); keeps every observation."""

    interval_s: float = 10.0
    decisions: list[PlannerDecision] = field(default_factory=list)
    seen: list[PlannerObservation] = field(default_factory=list)

    def decide(self, observation: PlannerObservation, now: float) -> PlannerDecision:
        self.seen.append(observation)
        if self.decisions:
            return self.decisions.pop(0)
        return PlannerDecision(None, SwitchMode.IN_PLACE, Outcome.HOLD, "hold", None)  # type: ignore[arg-type]


def cluster(warmup_s: float = 0.0, origin: ModelOrigin = ModelOrigin.PROFILE, collocated: bool = False,
            planner: ScriptedPlanner | None = None, exit: WarmupExit = WarmupExit.AT_ONCE,
            initial: dict[NodeId, Phase] | None = None) -> tuple[ControlCore, ScriptedPlanner]:  # fmt: skip
    initial = initial or INITIAL
    tracks = {}
    for node, phase in initial.items():
        mode = NodeMode.COLLOCATED if collocated else NodeMode.of(phase)
        tracks[node] = NodeTrack(node, None if collocated else phase, mode=mode, pool=PoolSnapshot(PT, l1_free=10_000))
    core = RouterCore(tracks, router=make_prefill_router("round-robin"),
                      binder=make_decode_binder("fewest-requests", random.Random(0)), settings=CoreSettings())  # fmt: skip
    planner = planner or ScriptedPlanner()
    settings = ControlSettings(initial, warmup_s=warmup_s, fit_interval_s=20.0, window=WindowConfig(40.0, 4),
                               warmup_exit=exit)
    return ControlCore(core, planner, settings, ModelBook(SHAPE, origin)), planner  # type: ignore[arg-type]


def switch(target: dict[str, Phase], mode: SwitchMode = SwitchMode.IN_PLACE, relaunch_s: float = 0.0) -> PlannerDecision:
    return PlannerDecision(target, mode, Outcome.SWITCH, "test", None, relaunch_s)  # type: ignore[arg-type]


def test_the_collocated_warmup_refits_then_orders_the_initial_split_and_starts_planning() -> None:
    control, planner = cluster(warmup_s=50.0, origin=ModelOrigin.FITTED, collocated=True)
    assert control.start(0.0) == [] and control.phase is ControlPhase.WARMUP
    assert all(t.fitter is not None for t in control.core.nodes.values())
    assert control.next_tick_at == 20.0  # a provisional refit
    provisional = dict(control.core.router_models)
    assert control.tick(20.0) == [] and control.next_tick_at == 40.0
    assert all(control.core.router_models[n] is not m for n, m in provisional.items())  # refreshed: new objects
    control.tick(40.0)
    assert control.next_tick_at == 50.0  # the warmup's end (no refit at or after it)
    effects = control.tick(50.0)
    frozen = [e for e in effects if isinstance(e, ModelsFrozen)]
    assert len(frozen) == 1 and frozen[0].fallback  # no iterations seen: the profile's models stay, said so
    orders = [e for e in effects if isinstance(e, SwitchOrder)]
    assert {(o.node, o.phase) for o in orders} == set(INITIAL.items()) and all(o.initial for o in orders)
    assert len({o.generation for o in orders}) == 1
    assert control.phase is ControlPhase.SERVING and all(t.fitter is None for t in control.core.nodes.values())
    assert all(not t.accepts(Phase.DECODE) for n, t in control.core.nodes.items() if INITIAL[n] is Phase.PREFILL)
    for o in orders:
        control.handle(SwitchCompleted(o.node, o.phase, 50.5))
    assert control.core.last_switch_end is None  # the initial placement starts no cooldown
    assert control.next_tick_at == 60.0 and not planner.seen
    effects = control.tick(60.0)
    assert [type(e) for e in effects] == [PlannerDecided] and len(planner.seen) == 1
    kinds = [r.kind for r in control.log]
    assert kinds[:2] == [RecordKind.WARMUP_STARTED, RecordKind.WARMUP_ENDED] and kinds[-1] is RecordKind.DECISION


def test_the_staged_exit_keeps_prefill_capacity_and_never_lets_a_draining_node_take_prefills() -> None:
    """Prefill-bound nodes leave in two waves through decode, decode-bound nodes stay collocated until the whole
    prefill side serves; at every step some node accepts prefills, and no node draining decodes does."""
    initial = {NodeId(f"n{i}"): Phase.PREFILL if i < 3 else Phase.DECODE for i in range(6)}
    control, _ = cluster(warmup_s=50.0, collocated=True, exit=WarmupExit.STAGED, initial=initial)
    control.start(0.0)
    nodes = control.core.nodes

    def check() -> None:
        assert any(t.accepts(Phase.PREFILL) for t in nodes.values())
        for t in nodes.values():  # a node bound for prefill that still serves decodes never accepts prefills
            if t.target is NodeMode.PREFILL and t.mode is not NodeMode.PREFILL:
                assert not t.accepts(Phase.PREFILL)

    def orders(effects: list) -> list[tuple[str, Phase]]:  # type: ignore[type-arg]
        return [(o.node, o.phase) for o in effects if isinstance(o, SwitchOrder)]

    def complete(node: str, phase: Phase, at: float) -> None:
        nodes[NodeId(node)].mode = NodeMode.of(phase)  # what the node's next report says
        control.handle(SwitchCompleted(NodeId(node), phase, at))
        check()

    for t in nodes.values():
        t.mode = NodeMode.COLLOCATED
    effects = control.tick(50.0)
    assert orders(effects) == [("n0", Phase.DECODE), ("n1", Phase.DECODE)]  # wave one (the larger half)
    check()
    assert all(nodes[NodeId(n)].accepts(Phase.PREFILL) for n in ("n2", "n3", "n4", "n5"))  # still collocated
    complete("n0", Phase.DECODE, 50.2)
    assert control.next_tick_at == 50.2  # a stage is due at the completion
    assert orders(control.tick(50.2)) == [("n0", Phase.PREFILL)]
    check()
    assert not nodes[NodeId("n0")].accepts(Phase.PREFILL)  # draining its decodes: prefills go elsewhere
    complete("n1", Phase.DECODE, 50.3)
    assert orders(control.tick(50.3)) == [("n1", Phase.PREFILL)]
    complete("n0", Phase.PREFILL, 55.0)
    assert orders(control.tick(55.0)) == []  # n1 still drains
    complete("n1", Phase.PREFILL, 57.0)
    assert orders(control.tick(57.0)) == [("n2", Phase.DECODE)]  # wave two
    complete("n2", Phase.DECODE, 57.1)
    assert orders(control.tick(57.1)) == [("n2", Phase.PREFILL)]
    complete("n2", Phase.PREFILL, 60.0)
    effects = control.tick(60.0)
    assert orders(effects) == [(NodeId(f"n{i}"), Phase.DECODE) for i in (3, 4, 5)]  # the prefill side serves
    for i in (3, 4, 5):
        complete(f"n{i}", Phase.DECODE, 60.5)
    assert {n: t.phase for n, t in nodes.items()} == initial
    generations = [o.generation for o in (e for e in effects if isinstance(e, SwitchOrder))]
    assert generations == sorted(set(generations))  # one fresh generation per order
    assert control.core.last_switch_end is None and control.next_tick_at == 60.0 + ScriptedPlanner().interval_s


def test_a_staged_exit_goes_on_when_a_moving_node_is_lost_or_refuses() -> None:
    initial = {NodeId("n0"): Phase.PREFILL, NodeId("n1"): Phase.PREFILL, NodeId("n2"): Phase.DECODE}
    control, _ = cluster(warmup_s=10.0, collocated=True, exit=WarmupExit.STAGED, initial=initial)
    control.start(0.0)
    for t in control.core.nodes.values():
        t.mode = NodeMode.COLLOCATED
    assert [o.node for o in control.tick(10.0) if isinstance(o, SwitchOrder)] == ["n0"]
    control.switch_failed(NodeId("n0"), 10.5, "refused")  # stays collocated: ordered straight to prefill
    assert [(o.node, o.phase) for o in control.tick(10.5) if isinstance(o, SwitchOrder)] == [("n0", Phase.PREFILL)]
    control.node_lost(NodeId("n0"), 11.0)
    assert [(o.node, o.phase) for o in control.tick(11.0) if isinstance(o, SwitchOrder)] == [("n1", Phase.DECODE)]


def test_a_planner_switch_is_ordered_with_a_fresh_generation_and_its_end_starts_the_cooldown() -> None:
    planner = ScriptedPlanner(decisions=[switch({"n0": Phase.PREFILL, "n1": Phase.PREFILL, "n2": Phase.DECODE})])
    control, _ = cluster(planner=planner)
    control.start(0.0)
    control.generation_seen(NodeId("n1"), 41)
    effects = control.tick(10.0)
    (order,) = [e for e in effects if isinstance(e, SwitchOrder)]
    assert (order.node, order.phase, order.generation, order.initial) == ("n1", Phase.PREFILL, 42, False)
    assert control.core.nodes[NodeId("n1")].draining
    assert control.core.last_switch_end is None  # not at the decision
    control.handle(SwitchCompleted(NodeId("n1"), Phase.PREFILL, 13.5))
    assert control.core.last_switch_end == 13.5 and control.core.split_now() == (2, 1)
    assert control.next_tick_at == 20.0


def test_a_relaunch_order_carries_its_downtime_and_a_failed_switch_keeps_the_old_phase() -> None:
    planner = ScriptedPlanner(decisions=[switch({"n0": Phase.PREFILL, "n1": Phase.PREFILL, "n2": Phase.DECODE},
                                                SwitchMode.RELAUNCH, 30.0)])  # fmt: skip
    control, _ = cluster(planner=planner)
    control.start(0.0)
    (order,) = [e for e in control.tick(10.0) if isinstance(e, SwitchOrder)]
    assert (order.mode, order.relaunch_s) == (SwitchMode.RELAUNCH, 30.0)
    control.switch_failed(order.node, 11.0, "refused")
    track = control.core.nodes[order.node]
    assert track.target is None and track.accepts(Phase.DECODE) and control.core.last_switch_end is None


@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=8))
def test_generations_increase_and_stay_bounded_whatever_nodes_report(reported: list[int]) -> None:
    control, _ = cluster()
    control.start(0.0)
    for g in reported:
        control.generation_seen(NodeId("n0"), g)
    before = control.generation
    assert before <= MAX_GENERATION and before == max([g for g in reported if g <= MAX_GENERATION], default=0)
    if before < MAX_GENERATION:
        (order,) = [e for e in control.decided(switch({"n0": Phase.DECODE, "n1": Phase.PREFILL, "n2": Phase.DECODE}), 1.0)
                    if isinstance(e, SwitchOrder) and e.node == "n0"]  # fmt: skip
        assert before < order.generation <= MAX_GENERATION
    else:
        with pytest.raises(OverflowError):
            control.decided(switch({"n0": Phase.DECODE, "n1": Phase.PREFILL, "n2": Phase.DECODE}), 1.0)


def test_ticks_never_go_back_in_time_and_events_are_typed() -> None:
    control, _ = cluster()
    control.start(0.0)
    control.handle(Tick(10.0))
    with pytest.raises(ValueError, match="before the last tick"):
        control.handle(Tick(5.0))
    with pytest.raises(TypeError, match="not a control event"):
        control.handle("tick")  # type: ignore[arg-type]


def test_a_lost_node_serves_nothing_and_its_kv_and_counts_are_dropped() -> None:
    control, _ = cluster()
    control.start(0.0)
    core = control.core
    req = request(core, "a", "b1", 3)
    core.absorb([KvStored(NodeId("n1"), Tier.HOST, None, req.prompt_pages, 0.0)])
    assert core.directory.held_count(NodeId("n1"), Tier.HOST) == 3
    effects = control.handle(NodeLost(NodeId("n1"), 1.0, "stream broke"))
    assert core.directory.held_count(NodeId("n1"), Tier.HOST) == 0
    assert core.nodes[NodeId("n1")].phase is None and control.log[-1].kind is RecordKind.NODE_LOST
    assert all(p.node != "n1" or all(v == 0 for v in p.counts.values()) for p in effects)  # type: ignore[union-attr]


def test_no_planner_input_reads_a_requests_declared_output_length() -> None:
    """Requests declare 100,000 output tokens (a max_tokens, or a trace's future output) but finish after 300:
    the planner's w̄ holds only the measured 300 (it would hold 100,000 if planning read the declared length)."""
    control, planner = cluster()
    control.start(0.0)
    core = control.core
    for i in range(4):
        req = request(core, f"r{i}", f"b{i}", 2, name=f"x{i}")
        assert req.route.output_tokens == 10  # the test helper's declared output...
        object.__setattr__(req.route, "output_tokens", 100_000)  # ...made absurd
        routed = core.route(req, 1.0 + i)
        assert routed is not None
        core.prefill_sent(req)
        core.prefill_started(routed.node, req, 0, 0, 1.0 + i)
        control.handle(RequestFinished(300, 120.0, 2.0 + i))
    control.tick(10.0)
    slices = [s for s in planner.seen[-1].slices if s.requests]
    assert sum(s.requests for s in slices) == 4 and sum(s.finished for s in slices) == 4
    assert sum(s.sum_t_out for s in slices) == 4 * 300
    assert sum(s.sum_decode_iterations for s in slices) == 4 * 120.0
    merged = slices[0]
    assert merged.mean_work is not None and merged.mean_work.t_out == 300


def test_a_request_counts_in_the_slice_it_arrives_in_even_while_its_prefill_waits() -> None:
    """E.3 measures w̄ over the requests that arrive in the window: requests queued behind a saturated prefill node
    (never started) are in the planner's slices, once each, even when routed again."""
    control, planner = cluster()
    control.start(0.0)
    core = control.core
    for i in range(3):
        req = request(core, f"q{i}", f"qb{i}", 2, name=f"q{i}")
        assert core.route(req, 1.0 + i) is not None
        core.prefill_sent(req)
        assert core.route(req, 1.5 + i) is not None  # routed again (a hand-back): still one arrival
    control.tick(10.0)
    slices = [s for s in planner.seen[-1].slices if s.requests]
    assert sum(s.requests for s in slices) == 3
    assert sum(s.sum_t_uc + s.sum_t_c for s in slices) == 3 * (2 * PT + 5)  # every prompt token, none started


def test_the_planners_node_models_carry_the_nodes_kv_capacity_fitted_or_not() -> None:
    """The planner caps a decode node's batch at what its KV memory holds (`planner.throughput.batch_limit`): both
    model origins carry the profile's L1 size, and the cap survives the per-window remeasuring."""
    from evolving_infra.core.itermodel import IterationRecord, PrefillItem
    from evolving_infra.router.fitting import UsageCounts

    node = NodeId("n0")
    profile_book = ModelBook(SHAPE, ModelOrigin.PROFILE)
    _, planner_model = profile_book.initial(warmup=False)
    assert planner_model.decode_kv_tokens == SHAPE.l1_tokens  # type: ignore[union-attr]
    _, remeasured = profile_book.refreshed(node, None, UsageCounts(4, 8192, 100, 50))
    assert remeasured.decode_kv_tokens == SHAPE.l1_tokens  # type: ignore[attr-defined]
    fitted_book = ModelBook(SHAPE, ModelOrigin.FITTED)
    fitter = SHAPE.fitter(node)
    for i in range(40):  # enough iterations of both phases to fit (the profile's own times)
        uc, c, batch = 512 * (1 + i % 8), 4096 * (i % 5), 1 + i % 16
        seconds = 0.01 + 1e-5 * uc + 1e-9 * c * uc
        fitter.observe(IterationRecord(node, Phase.PREFILL, float(i), seconds, (PrefillItem(uc, c),)))
        fitter.observe(IterationRecord(node, Phase.DECODE, float(i), 0.02 + 0.001 * batch, decode_batch=batch))
    models, _, fallback = fitted_book.freeze({node: fitter})
    assert not fallback
    assert models[node][1].decode_kv_tokens == SHAPE.l1_tokens  # type: ignore[attr-defined]
    again, _ = fitted_book.refreshed(node, models[node][1], UsageCounts(4, 8192, 100, 50))
    assert again.decode_kv_tokens == SHAPE.l1_tokens  # type: ignore[attr-defined]


@dataclass
class CheckingScriptedPlanner(ScriptedPlanner):
    """A `ScriptedPlanner` that is also checked every `check_interval_s` (the queued checks' answers in turn)."""

    check_interval_s: float | None = 3.0
    checks: list[PlannerDecision | None] = field(default_factory=list)
    checked_at: list[float] = field(default_factory=list)

    def check(self, observation: PlannerObservation, now: float) -> PlannerDecision | None:
        self.checked_at.append(now)
        return self.checks.pop(0) if self.checks else None


def test_a_checking_planner_is_checked_between_decisions_and_a_check_that_switches_is_applied() -> None:
    target = {"n0": Phase.PREFILL, "n1": Phase.PREFILL, "n2": Phase.DECODE}
    planner = CheckingScriptedPlanner(interval_s=9.0, checks=[None, switch(target)])
    control, _ = cluster(planner=planner)
    control.start(0.0)
    assert control.next_tick_at == 3.0
    assert control.tick(3.0) == [] and planner.checked_at == [3.0] and not planner.seen
    effects = control.tick(6.0)  # the second check switches, as a decision would
    assert [(o.node, o.phase) for o in effects if isinstance(o, SwitchOrder)] == [("n1", Phase.PREFILL)]
    assert [e.decision.reason for e in effects if isinstance(e, PlannerDecided)] == ["test"]
    assert [r.kind for r in control.log].count(RecordKind.DECISION) == 1
    control.tick(9.0)  # a decision and a check due together: the decision only
    assert len(planner.seen) == 1 and planner.checked_at == [3.0, 6.0]
    control.tick(17.5)  # a late tick catches up, and checks keep to their grid
    assert planner.checked_at == [3.0, 6.0, 17.5] and control.next_tick_at == 18.0
    # a planner without checks, or with check_interval_s None, is never checked
    quiet = CheckingScriptedPlanner(check_interval_s=None)
    control, _ = cluster(planner=quiet)
    control.start(0.0)
    assert control.next_tick_at == 10.0
    control.tick(10.0)
    assert quiet.checked_at == [] and len(quiet.seen) == 1 and control.next_tick_at == 20.0
    control, _ = cluster(planner=CheckingScriptedPlanner(check_interval_s=0.0))
    with pytest.raises(ValueError, match="check_interval_s must be > 0"):
        control.start(0.0)  # a check every 0 s would never let time pass
