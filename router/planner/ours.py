"""Our phase-split planner: eq. 5 and 6 with the outer loop of appendix E.3.

At the end of each planning window (T_win = 600 s of m = 10 slices of 60 s by default):
1. skip while any node is still switching (draining) or less than `cooldown_s` (120 s) has passed since the
   last switch completed;
2. for every prefill count p != |P| with min_prefill <= p <= N - min_decode, form the split that changes the
   fewest nodes (`split.fewest_changes_split`, cheapest move cost first, then node id);
3. on each usable slice i compute g_i = Θ(candidate; w̄_i, q̄_i) - Θ(current; w̄_i, q̄_i) (eq. 6);
4. a candidate qualifies if ḡ > 2σ/√m, σ the sample standard deviation of its g_i over the m usable slices
   (m >= 2); switch to the qualified candidate with the largest ḡ, in place.

Beyond the paper (`history_s`; docs/planner.md, "Evidence from a split that ran"): eq. 5 evaluates every candidate
on the w̄_i and q̄_i measured under the current split, but both move with the split (with fewer prefill nodes:
longer queues, more prefixes evicted while queued, more of the prefix restored from host memory), so the model
can favour B on A's slices and A on B's, and the planner then alternates between A and B. The planner keeps the
usable slices of the last window each prefill count ran (for `history_s`) and, when that count is a candidate
again, adds the gains g_i = Θ(candidate) - Θ(current) evaluated on those slices to the current window's: a split
it left is judged on what was measured under it too, and the significance test runs over all of them.

Beyond the paper (`active_kv`; docs/planner.md, "A split whose prefill nodes cannot hold the active contexts"):
w̄_i is measured with the current split's prefill nodes holding the active branches' prefixes. A candidate with fewer
prefill nodes whose KV memory (GPU and host together) is smaller than the active contexts keeps that reuse only
while its prefill queues stay short (`active_kv` says why). By default (`ActiveKv.REFUSE`) such a move towards
decode does not qualify; with `ActiveKv.HEADROOM` it qualifies only while eq. 5 predicts its prefill side at most
`kv_short_utilization` busy (Θ / Σµ_P, mean over the slices its gains come from; each candidate lists it). Refused
moves have verdict `PREFILL_KV_SHORT`, their gains still listed; moves towards prefill are never refused. Both need
the observation's `active_kv_pages` and every prefill node's `kv_pages`; without them nothing is refused. With
HEADROOM the planner is also checked at the end of every slice (`check`): a split short of memory whose prefill side
eq. 5 now predicts significantly busier than the limit is left at once for the best split with more prefill nodes
the rule allows (the headroom was judged on the mix of one window; a mix that shifts towards prefill-heavy work
takes it away before the next decision).

Invariant: a switch is only returned when some candidate's mean gain exceeds `significance` standard errors
over at least two usable slices; every decision lists every candidate with its verdict and every slice with
its use and the current split's Θ. Slices that start before (last switch end + cooldown) are not used, so the
window evaluated after a switch holds only data of the new split. With `history_s = 0` nothing is kept between
decisions (the paper's rule).

Boundary: pure; the window slices and node models come in the observation; the only state kept is the usable
slices (w̄_i, q̄_i) of the last window of each prefill count that ran (at most `window.slices` each).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from evolving_infra.core.types import NodeId, Phase
from evolving_infra.router.planner.active_kv import ActiveKv, cannot_hold, prefill_utilization, refused
from evolving_infra.router.planner.base import (
    Outcome,
    PlannerDecision,
    PlannerName,
    PlannerObservation,
    SwitchMode,
)
from evolving_infra.router.planner.diagnostics import (
    CandidateDiagnostics,
    CandidateVerdict,
    OursDiagnostics,
    SliceDiagnostics,
    SliceUse,
)
from evolving_infra.router.planner.split import (
    decode_nodes,
    fewest_changes_split,
    format_split,
    nodes_to_move,
    prefill_nodes,
)
from evolving_infra.router.planner.throughput import split_throughput
from evolving_infra.router.planner.window import MeanWork, WindowConfig


class DecodeDemand(str, Enum):
    """What q̄ of eq. 5 counts on each slice.

    - IN_DECODE (the paper's definition): the mean number of requests in decode.
    - WITH_PREFILL_BACKLOG (the default): those plus the mean number waiting for (or in) prefill. When prefill is the
      bottleneck, the requests in decode are bounded by the prefill rate, so Θ evaluated at the measured q̄
      rates the decode side at today's throughput and no move towards prefill ever shows a gain (the split
      stays where prefill starves); the requests queued for prefill are decode demand that waits for it.
      Without a prefill queue both are the same.
    """

    IN_DECODE = "in-decode"
    WITH_PREFILL_BACKLOG = "with-prefill-backlog"


@dataclass(frozen=True, slots=True)
class OursSettings:
    """window: T_win and its slices (decisions every T_win); cooldown_s: no decision, and no slice used, until
    this long after the last switch completed; min_prefill / min_decode: bounds of a candidate split;
    significance: a candidate qualifies when ḡ > significance * σ/√m (paper: 2); decode_demand: what q̄ counts
    (`DecodeDemand`); history_s: how long the usable slices of a split that ran stay evidence about it when it is
    a candidate again (0: only the current window, the paper's rule); active_kv: how a move towards decode whose
    prefill nodes' KV memory cannot hold the active branches' contexts is judged (`ActiveKv`: refused, allowed with
    prefill headroom, or off: the paper's rule); kv_short_utilization: with headroom, the most such a move may load
    its prefill side (Θ / Σµ_P predicted by eq. 5)."""

    window: WindowConfig = field(default_factory=WindowConfig)
    cooldown_s: float = 120.0
    min_prefill: int = 1
    min_decode: int = 1
    significance: float = 2.0
    decode_demand: DecodeDemand = DecodeDemand.WITH_PREFILL_BACKLOG
    history_s: float = 3600.0
    active_kv: ActiveKv = ActiveKv.REFUSE
    kv_short_utilization: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.history_s) and self.history_s >= 0):
            raise ValueError(f"history_s must be a finite number >= 0, got {self.history_s}")
        if not self.cooldown_s >= 0:
            raise ValueError(f"cooldown_s must be >= 0, got {self.cooldown_s}")
        if self.min_prefill < 0 or self.min_decode < 0:
            raise ValueError(f"min_prefill and min_decode must be >= 0, got {self.min_prefill}, {self.min_decode}")
        if not 0 < self.kv_short_utilization <= 1:
            raise ValueError(f"kv_short_utilization must be in (0, 1], got {self.kv_short_utilization}")
        if not self.significance >= 0:
            raise ValueError(f"significance must be >= 0, got {self.significance}")


def _kv_pages(prefill: tuple[NodeId, ...], kv_pages: Mapping[NodeId, int]) -> int | None:
    """The KV pages the prefill nodes hold together (None unless every one's size is known)."""
    if not prefill or any(n not in kv_pages for n in prefill):
        return None
    return sum(kv_pages[n] for n in prefill)


@dataclass(frozen=True, slots=True)
class _Split:
    prefill: tuple[NodeId, ...]
    decode: tuple[NodeId, ...]


def _candidate_splits(
    phases: dict[NodeId, Phase], counts: Iterable[int], move_costs: dict[NodeId, float]
) -> tuple[dict[int, dict[NodeId, Phase]], dict[int, _Split]]:
    """Per prefill count, the split that changes the fewest nodes (`fewest_changes_split`) and its two sides."""
    targets = {p: fewest_changes_split(phases, p, move_costs) for p in counts}
    return targets, {p: _Split(prefill_nodes(t), decode_nodes(t)) for p, t in targets.items()}


@dataclass(frozen=True, slots=True)
class _Measured:
    """One usable slice of a window: its bounds, w̄_i and q̄_i."""

    start: float
    end: float
    work: MeanWork
    q_bar: float


@dataclass(frozen=True, slots=True)
class _Evaluated:
    """Eq. 5 and 6 on a window's slices: each slice's diagnostics, the usable ones, and per candidate prefill count
    the gains and predicted prefill utilization on them; `current_busy`: the current split's on them."""

    slices: list[SliceDiagnostics]
    measured: list[_Measured]
    gains: dict[int, list[float]]
    busy: dict[int, list[float]]
    current_busy: list[float]


class OursPlanner:
    """Eq. 5/6 planner with the E.3 outer loop. See the module docstring for the rule."""

    def __init__(self, settings: OursSettings | None = None) -> None:
        self._settings = settings or OursSettings()
        self._ran: dict[int, tuple[_Measured, ...]] = {}  # prefill count -> usable slices of its last window

    def evidence(self, now: float) -> dict[int, int]:
        """Prefill count -> how many slices measured while it ran still count as evidence about it at `now`."""
        return {p: n for p in sorted(self._ran) if (n := len(self._kept(p, now)))}

    def _kept(self, prefill_count: int, now: float) -> tuple[_Measured, ...]:
        horizon = now - self._settings.history_s
        return tuple(m for m in self._ran.get(prefill_count, ()) if m.end >= horizon)

    def _remember(self, prefill_count: int, used: list[_Measured], now: float) -> None:
        """Keep the current window's usable slices as what was measured under `prefill_count` (the latest
        `window.slices` of them); forget what is older than `history_s`."""
        if self._settings.history_s <= 0:
            return
        if used:
            starts = {m.start for m in used}
            kept = [m for m in self._kept(prefill_count, now) if m.start not in starts] + used
            self._ran[prefill_count] = tuple(sorted(kept, key=lambda m: m.start)[-self._settings.window.slices :])
        for p in [p for p in self._ran if not self._kept(p, now)]:
            del self._ran[p]

    @property
    def name(self) -> PlannerName:
        return PlannerName.OURS

    @property
    def settings(self) -> OursSettings:
        return self._settings

    @property
    def interval_s(self) -> float:
        return self._settings.window.window_s

    def decide(self, observation: PlannerObservation, now: float) -> PlannerDecision:
        cfg = self._settings
        phases = observation.phases
        current = format_split(phases)
        switching = observation.switching
        cooldown_until = self._cooldown_until(observation)
        if switching:
            diag = OursDiagnostics(current, switching, cooldown_until)
            reason = f"skipped: nodes {list(switching)} are still draining from the last switch"
            return self._hold(Outcome.SKIPPED_SWITCH_IN_FLIGHT, reason, diag)
        if cooldown_until is not None and now < cooldown_until:
            diag = OursDiagnostics(current, switching, cooldown_until)
            reason = f"skipped: within {cfg.cooldown_s:g} s after the last switch (until t={cooldown_until:g})"
            return self._hold(Outcome.SKIPPED_COOLDOWN, reason, diag)

        base = _Split(prefill_nodes(phases), decode_nodes(phases))
        total = len(phases)
        counts = [p for p in range(cfg.min_prefill, total - cfg.min_decode + 1) if p != len(base.prefill)]
        targets, splits = _candidate_splits(phases, counts, observation.move_costs)

        cur_p = len(base.prefill)
        active = observation.active_kv_pages
        held = {p: _kv_pages(c.prefill, observation.kv_pages) for p, c in splits.items()}
        ev = self._evaluate(observation, cooldown_until, base, splits)
        gains, busy, measured = ev.gains, ev.busy, ev.measured

        # A candidate that ran within history_s is also judged on the slices measured while it ran.
        history: dict[int, int] = {}
        for p, c in splits.items():
            for m in self._kept(p, now):
                then = split_throughput(base.prefill, base.decode, observation.models, m.work, m.q_bar).theta
                tp = split_throughput(c.prefill, c.decode, observation.models, m.work, m.q_bar)
                if math.isfinite(then) and math.isfinite(tp.theta):
                    gains[p].append(tp.theta - then)
                    busy[p].append(prefill_utilization(tp))
                    history[p] = history.get(p, 0) + 1
        self._remember(len(base.prefill), measured, now)

        candidates = []
        for p in counts:
            judged = self._judge(p, phases, observation.move_costs, gains[p], history.get(p, 0))
            utilization = statistics.fmean(busy[p]) if busy[p] else None
            judged = replace(judged, prefill_kv_pages=held[p], prefill_utilization=utilization)
            short = p < cur_p and cannot_hold(held[p], active)
            if judged.verdict is CandidateVerdict.QUALIFIED or cfg.active_kv is ActiveKv.REFUSE:
                if refused(cfg.active_kv, short, utilization, cfg.kv_short_utilization):
                    judged = replace(judged, verdict=CandidateVerdict.PREFILL_KV_SHORT)
            candidates.append(judged)
        qualified = [c for c in candidates if c.verdict is CandidateVerdict.QUALIFIED]
        diag = OursDiagnostics(current, switching, cooldown_until, tuple(ev.slices), tuple(candidates), active)
        if not qualified:
            used = diag.count(SliceUse.USED)
            n_short = sum(c.verdict is CandidateVerdict.PREFILL_KV_SHORT for c in candidates)
            why = ""
            if n_short and active is not None:
                limit = ""
                if cfg.active_kv is ActiveKv.HEADROOM:
                    limit = f" at over {cfg.kv_short_utilization:.0%} prefill load"
                why = f"; {n_short} would not hold the active contexts ({active:,} pages){limit}"
            reason = f"hold {current}: no candidate qualifies ({len(candidates)} candidates, {used} usable slices{why})"
            return self._hold(Outcome.HOLD, reason, diag)
        best = max(qualified, key=lambda c: (c.mean_gain or 0.0, -abs(c.prefill_count - cur_p), -c.prefill_count))
        candidates = [replace(c, chosen=c is best) for c in candidates]
        diag = replace(diag, candidates=tuple(candidates))
        earlier = f", {best.history} of them measured while {best.split} ran" if best.history else ""
        reason = (
            f"switch {current} -> {best.split}: mean gain {best.mean_gain:.4g} req/s > "
            f"{cfg.significance:g} standard errors ({best.threshold:.4g}) over {len(best.gains)} slices{earlier}"
        )
        return PlannerDecision(targets[best.prefill_count], SwitchMode.IN_PLACE, Outcome.SWITCH, reason, diag)

    def _cooldown_until(self, observation: PlannerObservation) -> float | None:
        """When the cooldown after the last switch ends (None: no switch yet)."""
        last = observation.last_switch_end
        return None if last is None else last + self._settings.cooldown_s

    def _evaluate(
        self, observation: PlannerObservation, cooldown_until: float | None, base: _Split, splits: dict[int, _Split]
    ) -> _Evaluated:
        """Eq. 5 for the current split and every candidate on each usable slice of the observation."""
        ev = _Evaluated([], [], {p: [] for p in splits}, {p: [] for p in splits}, [])
        with_backlog = self._settings.decode_demand is DecodeDemand.WITH_PREFILL_BACKLOG
        for s in observation.slices:
            q_bar = s.mean_decode_requests
            backlog = s.mean_prefill_backlog
            if with_backlog and q_bar is not None:
                q_bar += backlog or 0.0
            work = s.mean_work
            use = SliceUse.USED
            if cooldown_until is not None and s.start < cooldown_until:
                use = SliceUse.BEFORE_COOLDOWN_END
            elif work is None:
                use = SliceUse.EMPTY
            elif q_bar is None:
                use = SliceUse.NO_OCCUPANCY
            if use is not SliceUse.USED or work is None or q_bar is None:
                ev.slices.append(
                    SliceDiagnostics(s.start, s.end, s.requests, q_bar, use, prefill_backlog=backlog, work=work)
                )
                continue
            now_tp = split_throughput(base.prefill, base.decode, observation.models, work, q_bar)
            theirs = {
                p: split_throughput(c.prefill, c.decode, observation.models, work, q_bar) for p, c in splits.items()
            }
            finite = math.isfinite(now_tp.theta) and all(math.isfinite(t.theta) for t in theirs.values())
            use = SliceUse.USED if finite else SliceUse.NOT_FINITE
            ev.slices.append(
                SliceDiagnostics(
                    s.start, s.end, s.requests, q_bar, use, now_tp.prefill, now_tp.decode, now_tp.theta,
                    backlog, work,
                )
            )
            if finite:
                ev.measured.append(_Measured(s.start, s.end, work, q_bar))
                ev.current_busy.append(prefill_utilization(now_tp))
                for p, tp in theirs.items():
                    ev.gains[p].append(tp.theta - now_tp.theta)
                    ev.busy[p].append(prefill_utilization(tp))
        return ev

    @property
    def check_interval_s(self) -> float | None:
        """With `ActiveKv.HEADROOM`, `check` runs at the end of every slice; otherwise never."""
        return self._settings.window.slice_s if self._settings.active_kv is ActiveKv.HEADROOM else None

    def check(self, observation: PlannerObservation, now: float) -> PlannerDecision | None:
        """Between decisions, with `ActiveKv.HEADROOM`: whether the current split still has the prefill headroom a
        move towards decode whose prefill nodes cannot hold the active contexts was allowed on.

        None unless (no switch in flight, past the cooldown) the current split's prefill nodes cannot hold the
        active contexts and eq. 5 on the usable slices predicts its prefill side busier than `kv_short_utilization`
        by more than `significance` standard errors (m >= 2; the same test a switch needs, so a burst does not trip
        it). Then the split no longer meets the rule that let it in, and the planner moves to the split with more
        prefill nodes the rule allows (its prefill nodes hold the active contexts, or it is predicted at most
        `kv_short_utilization` busy) with the largest mean gain on those slices (ties: fewer nodes moved), without
        waiting for the window's end: a prefill queue that grows behind prefill nodes short of memory loses the
        queued requests' prefixes, which lengthens it (`active_kv`). The slices are kept as evidence about the
        split left (`history_s`), so the next decisions judge a return to it on them too."""
        cfg = self._settings
        if cfg.active_kv is not ActiveKv.HEADROOM or observation.switching:
            return None
        cooldown_until = self._cooldown_until(observation)
        if cooldown_until is not None and now < cooldown_until:
            return None
        phases = observation.phases
        base = _Split(prefill_nodes(phases), decode_nodes(phases))
        active = observation.active_kv_pages
        if not cannot_hold(_kv_pages(base.prefill, observation.kv_pages), active):
            return None
        assert active is not None
        cur_p = len(base.prefill)
        counts = range(cur_p + 1, len(phases) - cfg.min_decode + 1)
        targets, splits = _candidate_splits(phases, counts, observation.move_costs)
        ev = self._evaluate(observation, cooldown_until, base, splits)
        m = len(ev.current_busy)
        if m < 2:
            return None
        busy_now = statistics.fmean(ev.current_busy)
        std_error = statistics.stdev(ev.current_busy) / math.sqrt(m)
        if not busy_now - cfg.kv_short_utilization > cfg.significance * std_error:
            return None
        self._remember(cur_p, ev.measured, now)
        candidates = []
        for p in counts:
            judged = self._judge(p, phases, observation.move_costs, ev.gains[p])
            held = _kv_pages(splits[p].prefill, observation.kv_pages)
            utilization = statistics.fmean(ev.busy[p]) if ev.busy[p] else None
            allowed = not refused(cfg.active_kv, cannot_hold(held, active), utilization, cfg.kv_short_utilization)
            verdict = CandidateVerdict.RESTORES_HEADROOM if allowed else CandidateVerdict.PREFILL_KV_SHORT
            candidates.append(replace(judged, verdict=verdict, prefill_kv_pages=held, prefill_utilization=utilization))
        current = format_split(phases)
        allowed_ones = [c for c in candidates if c.verdict is CandidateVerdict.RESTORES_HEADROOM]
        if not allowed_ones:
            return None
        best = max(allowed_ones, key=lambda c: (c.mean_gain or 0.0, -c.prefill_count))
        candidates = [replace(c, chosen=c is best) for c in candidates]
        diag = OursDiagnostics(current, (), cooldown_until, tuple(ev.slices), tuple(candidates), active)
        reason = (
            f"check: {current}'s prefill side is predicted {busy_now:.2f} busy, over {cfg.kv_short_utilization:g} "
            f"by more than {cfg.significance:g} standard errors ({std_error:.2g}) over {m} slices, and its prefill "
            f"nodes cannot hold the active contexts ({active:,} pages); switch {current} -> {best.split} "
            f"(mean gain {best.mean_gain or 0.0:.4g} req/s, predicted {best.prefill_utilization or 0.0:.2f} busy)"
        )
        return PlannerDecision(targets[best.prefill_count], SwitchMode.IN_PLACE, Outcome.SWITCH, reason, diag)

    def _judge(
        self,
        prefill_count: int,
        phases: dict[NodeId, Phase],
        move_costs: dict[NodeId, float],
        gains: list[float],
        history: int = 0,
    ) -> CandidateDiagnostics:
        moved = nodes_to_move(phases, prefill_count, move_costs)
        target = format_split(fewest_changes_split(phases, prefill_count, move_costs))
        m = len(gains)
        mean = statistics.fmean(gains) if gains else None
        if m < 2:
            return CandidateDiagnostics(
                prefill_count, target, moved, tuple(gains), mean, None, None, CandidateVerdict.TOO_FEW_SLICES,
                history=history,
            )
        assert mean is not None
        std_error = statistics.stdev(gains) / math.sqrt(m)
        threshold = self._settings.significance * std_error
        verdict = CandidateVerdict.QUALIFIED if mean > threshold else CandidateVerdict.BELOW_THRESHOLD
        return CandidateDiagnostics(
            prefill_count, target, moved, tuple(gains), mean, std_error, threshold, verdict, history=history
        )

    @staticmethod
    def _hold(outcome: Outcome, reason: str, diag: OursDiagnostics) -> PlannerDecision:
        return PlannerDecision(None, SwitchMode.IN_PLACE, outcome, reason, diag)
