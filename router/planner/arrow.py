"""Arrow-style TTFT/TPOT planner (the paper's reimplementation; Arrow's own code is not public).

Rule followed (/work/shared/baselines.md, "Planners" / "Arrow-style planner"):
- sizes the prefill and decode pools from TTFT and TPOT targets;
- predicts TTFT from the full input length, so cached prefixes count as prefill work: each queued request
  costs eq. 3 with t_c = 0 and t_uc = its whole prompt;
- reacts to momentary TTFT spikes: it is evaluated every tick (5 s) on the current queues;
- switches nodes in place without a restart, but the switched node's KV is stranded (no longer reachable for
  prefill): decisions carry mode IN_PLACE_STRAND_KV and the simulator enforces the loss.

Each tick: the predicted TTFT of prefill node n is the time to prefill everything queued on it, the last
request included (Σ over its queue of eq. 3 on full prompts); the predicted TPOT of decode node n is
T^iter_n(B_n) / accepted tokens per iteration, B_n its running plus queued decode requests. The worst node of
each pool is compared with its target.

Accepted tokens per iteration (speculative decoding accepts more than one): `accepted_tokens` when set;
by default measured, the output tokens over the decode iterations of the requests finished in the
observation's slices, which on the emulated engine is the profile's `t_acc` (2.5 for GLM-5.2) and live the
engine's real acceptance. Until a request has finished there is no measurement and TPOT is not judged (no
move is made on TPOT, nor one that would need a TPOT estimate).
- TTFT over target and TPOT within: move the cheapest decode node to prefill if the remaining decode nodes,
  sharing all decode requests evenly, still meet the TPOT target.
- TPOT over target and TTFT within: move the cheapest prefill node to decode if the remaining prefill nodes,
  sharing all queued prefill seconds evenly, still meet the TTFT target.
- Both or neither over target: hold. No decision while a switch is in flight.

Default targets (the paper gives none): TTFT 5 s, a first token within a few seconds for an interactive
agent turn, and TPOT 50 ms (20 tokens/s per stream), a common decode target in disaggregated serving work.
Both are settings.

Boundary: pure; reads node models and per-node queues from the observation.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolving_infra.router.planner.base import (
    Outcome,
    PlannerDecision,
    PlannerName,
    PlannerObservation,
    SwitchMode,
)
from evolving_infra.router.planner.diagnostics import ArrowDiagnostics
from evolving_infra.router.planner.split import (
    decode_nodes,
    fewest_changes_split,
    format_split,
    nodes_to_move,
    prefill_nodes,
)
from evolving_infra.router.planner.throughput import NodeModel
from evolving_infra.router.planner.window import MeanWork


@dataclass(frozen=True, slots=True)
class ArrowSettings:
    """interval_s: tick; ttft_target_s / tpot_target_s: the SLO targets; accepted_tokens: mean tokens accepted
    per decode iteration (TPOT = iteration time / accepted tokens; None: measured from the finished requests, see
    the module docstring); min_prefill / min_decode: pool bounds."""

    interval_s: float = 5.0
    ttft_target_s: float = 5.0
    tpot_target_s: float = 0.05
    accepted_tokens: float | None = None
    min_prefill: int = 1
    min_decode: int = 1

    def __post_init__(self) -> None:
        for name in ("interval_s", "ttft_target_s", "tpot_target_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.accepted_tokens is not None and not self.accepted_tokens >= 1:
            raise ValueError(f"accepted_tokens must be >= 1, got {self.accepted_tokens}")
        if self.min_prefill < 1 or self.min_decode < 1:
            raise ValueError(f"min_prefill and min_decode must be >= 1, got {self.min_prefill}, {self.min_decode}")


def full_prompt_time(model: NodeModel, prompt_tokens: int) -> float:
    """Eq. 3 with the whole prompt counted as uncached work (t_uc = t_in, t_c = 0)."""
    t = float(prompt_tokens)
    terms = MeanWork(t_uc=t, t_c=0.0, query_key_pairs=t * (t + 1) / 2, decode_iterations=0.0)
    return model.prefill_request_time(terms)


class ArrowPlanner:
    """TTFT/TPOT-target planner that strands a switched node's KV. See the module docstring for the rule."""

    def __init__(self, settings: ArrowSettings | None = None) -> None:
        self._settings = settings or ArrowSettings()

    @property
    def name(self) -> PlannerName:
        return PlannerName.ARROW

    @property
    def settings(self) -> ArrowSettings:
        return self._settings

    @property
    def interval_s(self) -> float:
        return self._settings.interval_s

    def accepted_tokens(self, observation: PlannerObservation) -> float | None:
        """Tokens accepted per decode iteration: the setting, else measured over the observation's slices."""
        if self._settings.accepted_tokens is not None:
            return self._settings.accepted_tokens
        tokens = sum(s.sum_t_out for s in observation.slices)
        iterations = sum(s.sum_decode_iterations for s in observation.slices)
        return tokens / iterations if iterations > 0 and tokens > 0 else None

    def _tpot(self, model: NodeModel, batch: float, accepted: float) -> float:
        return model.decode_iteration_time(batch) / accepted

    def decide(self, observation: PlannerObservation, now: float) -> PlannerDecision:
        cfg = self._settings
        phases = observation.phases
        current = format_split(phases)
        switching = observation.switching
        prefill = prefill_nodes(phases)
        decode = decode_nodes(phases)
        queued_s = {
            n: sum(full_prompt_time(observation.model_of(n), t) for t in observation.load_of(n).queued_prefill_inputs)
            for n in prefill
        }
        batches = {n: observation.load_of(n).decode_requests for n in decode}
        accepted = self.accepted_tokens(observation)
        tpot = {} if accepted is None else {n: self._tpot(observation.model_of(n), b, accepted) for n, b in batches.items()}
        ttft_bad = max(queued_s.values(), default=0.0) > cfg.ttft_target_s
        tpot_bad = max(tpot.values(), default=0.0) > cfg.tpot_target_s

        def hold(
            outcome: Outcome, reason: str, ttft_after: float | None = None, tpot_after: float | None = None
        ) -> PlannerDecision:
            diag = ArrowDiagnostics(current, switching, queued_s, tpot, ttft_bad, tpot_bad, ttft_after, tpot_after)
            return PlannerDecision(None, SwitchMode.IN_PLACE_STRAND_KV, outcome, reason, diag)

        if switching:
            return hold(Outcome.SKIPPED_SWITCH_IN_FLIGHT, f"no decision: switch of {list(switching)} in flight")
        if ttft_bad == tpot_bad:
            state = "both targets missed" if ttft_bad else "both targets met"
            return hold(Outcome.HOLD, f"hold {current}: {state}")
        target_p = len(prefill) + (1 if ttft_bad else -1)
        if target_p < cfg.min_prefill or len(phases) - target_p < cfg.min_decode:
            return hold(Outcome.HOLD, f"hold {current}: the move would break min_prefill/min_decode")
        moved = nodes_to_move(phases, target_p, observation.move_costs)
        target = fewest_changes_split(phases, target_p, observation.move_costs)
        ttft_after: float | None = None
        tpot_after: float | None = None
        if ttft_bad:
            if accepted is None:
                return hold(Outcome.HOLD, f"hold {current}: TTFT over target, but no decode measured yet to judge "
                            "TPOT with one decode node less")
            rest = [n for n in decode if n not in moved]
            share = sum(batches.values()) / len(rest)
            tpot_after = max(self._tpot(observation.model_of(n), share, accepted) for n in rest)
            if tpot_after > cfg.tpot_target_s:
                reason = (
                    f"hold {current}: TTFT over target, but TPOT would be {tpot_after:.3g} s "
                    "with one decode node less"
                )
                return hold(Outcome.HOLD, reason, tpot_after=tpot_after)
        else:
            rest = [n for n in prefill if n not in moved]
            ttft_after = sum(queued_s.values()) / len(rest)
            if ttft_after > cfg.ttft_target_s:
                reason = (
                    f"hold {current}: TPOT over target, but TTFT would be {ttft_after:.3g} s "
                    "with one prefill node less"
                )
                return hold(Outcome.HOLD, reason, ttft_after=ttft_after)
        diag = ArrowDiagnostics(current, switching, queued_s, tpot, ttft_bad, tpot_bad, ttft_after, tpot_after, moved)
        why = "TTFT spike" if ttft_bad else "TPOT over target"
        reason = f"switch {list(moved)} in place ({current} -> {format_split(target)}), KV stranded: {why}"
        return PlannerDecision(target, SwitchMode.IN_PLACE_STRAND_KV, Outcome.SWITCH, reason, diag)

