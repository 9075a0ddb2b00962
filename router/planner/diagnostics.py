"""Diagnostics each planner returns with every decision: the numbers it decided on and why.

Boundary: plain frozen records, one family per planner; no logic beyond summaries.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from evolving_infra.core.types import NodeId
from evolving_infra.router.planner.window import MeanWork


class SliceUse(enum.Enum):
    """Whether a window slice entered the gains, and if not why."""

    USED = "used"
    EMPTY = "empty"  # no requests: no w̄_i
    NO_OCCUPANCY = "no_occupancy"  # decode occupancy not observed on the slice: no q̄_i
    BEFORE_COOLDOWN_END = "before_cooldown_end"  # starts before the last switch end + cooldown
    NOT_FINITE = "not_finite"  # Θ of some split is not finite on the slice (work with zero cost)


class CandidateVerdict(enum.Enum):
    """Whether a candidate split qualifies: ḡ > 2σ/√m over m usable slices."""

    QUALIFIED = "qualified"
    BELOW_THRESHOLD = "below_threshold"
    TOO_FEW_SLICES = "too_few_slices"
    PREFILL_KV_SHORT = "prefill_kv_short"
    """A move towards decode whose prefill nodes' KV memory (GPU and host) would not hold the active branches'
    contexts, refused by ours' `active_kv` rule (with headroom: predicted too busy); its gains are still listed."""
    RESTORES_HEADROOM = "restores_headroom"
    """In a check between decisions (`OursPlanner.check`): a move towards prefill the `active_kv` rule allows (its
    prefill nodes hold the active contexts, or it is predicted at most `kv_short_utilization` busy)."""


@dataclass(frozen=True, slots=True)
class SliceDiagnostics:
    """One window slice: its counts, q̄_i, and the current split's predicted throughput on it."""

    start: float
    end: float
    requests: int
    mean_decode_requests: float | None
    use: SliceUse
    current_prefill: float | None = None
    current_decode: float | None = None
    current_theta: float | None = None
    prefill_backlog: float | None = None
    """The mean number of requests waiting for (or in) prefill over the slice (None: not observed)."""
    work: MeanWork | None = None
    """w̄_i (None: the slice had no requests)."""


@dataclass(frozen=True, slots=True)
class CandidateDiagnostics:
    """One candidate prefill count: the nodes it moves, its per-slice gains and its verdict; `history`: how many of
    the gains (the last ones) were evaluated on slices measured while this prefill count ran earlier."""

    prefill_count: int
    split: str
    moved: tuple[NodeId, ...]
    gains: tuple[float, ...]
    mean_gain: float | None
    std_error: float | None
    threshold: float | None
    verdict: CandidateVerdict
    chosen: bool = False
    history: int = 0
    prefill_kv_pages: int | None = None
    """The KV pages its prefill nodes' GPU and host memory hold together (None: sizes unknown)."""
    prefill_utilization: float | None = None
    """Θ / Σµ_P eq. 5 predicts for it, mean over the slices of its gains (None: none)."""


@dataclass(frozen=True, slots=True)
class OursDiagnostics:
    """Our planner's record of one window (E.3 outer loop)."""

    current_split: str
    switching: tuple[NodeId, ...]
    cooldown_until: float | None
    slices: tuple[SliceDiagnostics, ...] = ()
    candidates: tuple[CandidateDiagnostics, ...] = ()
    active_kv_pages: int | None = None
    """The active branches' context pages at the decision (None: unknown)."""

    def count(self, use: SliceUse) -> int:
        return sum(1 for s in self.slices if s.use is use)

    def slice_summary(self) -> list[dict[str, Any]]:
        """Each slice as plain data (the simulator's decision records): its start, requests, use, q̄_i, the prefill
        backlog, the current split's Σµ_P and Σµ_D in req/s, and w̄_i's mean uncached and cached prompt tokens."""
        return [
            {"start": s.start, "requests": s.requests, "use": s.use.value, "q_bar": s.mean_decode_requests,
             "prefill_backlog": s.prefill_backlog, "prefill": s.current_prefill, "decode": s.current_decode,
             "t_uc": None if s.work is None else s.work.t_uc, "t_c": None if s.work is None else s.work.t_c}
            for s in self.slices
        ]  # fmt: skip

    def candidate_summary(self) -> list[dict[str, Any]]:
        """Each candidate as plain data (the simulator's decision records): its split, mean gain and standard error
        in req/s, the slices the gains came from (of them measured earlier while it ran: `history`), its verdict,
        whether it was chosen, and the KV pages its prefill nodes hold (None: unknown)."""
        return [
            {"split": c.split, "mean_gain": c.mean_gain, "std_error": c.std_error, "slices": len(c.gains),
             "history": c.history, "verdict": c.verdict.value, "chosen": c.chosen,
             "prefill_kv_pages": c.prefill_kv_pages, "prefill_utilization": c.prefill_utilization}
            for c in self.candidates
        ]  # fmt: skip


class Want(enum.IntEnum):
    """A pool's wish for one tick."""

    SHRINK = -1
    KEEP = 0
    GROW = 1


@dataclass(frozen=True, slots=True)
class DynamoDiagnostics:
    """Per-engine load signals and each pool's wish on one tick."""

    current_split: str
    switching: tuple[NodeId, ...]
    prefill_ratios: Mapping[NodeId, float]
    decode_utilizations: Mapping[NodeId, float]
    prefill_want: Want
    decode_want: Want
    moved: tuple[NodeId, ...] = ()


@dataclass(frozen=True, slots=True)
class ArrowDiagnostics:
    """Predicted TTFT per prefill node and TPOT per decode node on one tick, and the same after a move."""

    current_split: str
    switching: tuple[NodeId, ...]
    predicted_ttft_s: Mapping[NodeId, float]
    predicted_tpot_s: Mapping[NodeId, float]
    ttft_violated: bool
    tpot_violated: bool
    ttft_after_move_s: float | None = None
    tpot_after_move_s: float | None = None
    moved: tuple[NodeId, ...] = ()


@dataclass(frozen=True, slots=True)
class StaticDiagnostics:
    """The fixed split."""

    current_split: str


Diagnostics = OursDiagnostics | DynamoDiagnostics | ArrowDiagnostics | StaticDiagnostics
