"""Online fitting of the iteration-time models of one node (paper 5.1, "online fitting"; E.3 line 1).

During warmup a node serves both phases (collocated) and reports one `IterationRecord` per iteration. A
`ModelFitter` collects them, fits (c0..c3) of eq. 1 and (d0..d2) of eq. 2 by non-negative least squares,
reports the mean relative error on held-out iterations, and `freeze` turns the fit into a
`FittedNodeModel`. After that only t̄_n and f_n change, remeasured from `UsageCounts` carried as sums.

Invariants (the fit of one phase is `evolving_infra.router.fitphase`, with its own):
- A coefficient is FITTED only if its design column raises the rank of the scaled design and is non-zero
  in at least two samples; otherwise it is 0 and listed as UNIDENTIFIED, and its phase is PARTIAL.
- The held-out split is a pure function of (sample count, seed); held-out samples never enter the fit, and
  the returned coefficients are exactly those the held-out error was measured on.
- `UsageCounts` merge by adding counts, so merging two windows equals counting their union.

Fitting weights each iteration by 1 / measured time (relative least squares: noise is multiplicative and
the error reported is relative) and scales columns to unit norm for conditioning.

Boundary: pure numpy/scipy on records passed in; no I/O, no clock.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from evolving_infra.core.itermodel import (
    DecodeCoefficients, IterationRecord, PrefillCoefficients, PrefillItem, decode_features, decode_iteration_time,
    decode_request_time, mean_relative_error, prefill_features, prefill_iteration_time,
)  # fmt: skip
from evolving_infra.core.types import NodeId, Phase, Work
from evolving_infra.router.fitphase import (
    RANK_RTOL, CoefficientStatus, PhaseFit, PhaseSamples, PhaseStatus, fit_phase, holdout_split,
)  # fmt: skip

__all__ = [
    "DECODE_NAMES", "PREFILL_NAMES", "RANK_RTOL", "CoefficientStatus", "FitResult", "FitStatus", "FittedNodeModel",
    "ModelFitter", "PhaseFit", "PhaseNotFitted", "PhaseStatus", "PrefillWork", "UsageCounts", "decode_error",
    "holdout_split", "prefill_error",
]

PREFILL_NAMES = ("c0", "c1", "c2", "c3")
DECODE_NAMES = ("d0", "d1", "d2")
# Order in which columns are admitted when the design is rank deficient: time per token first for
# prefill (a constant-shape warmup still predicts in proportion to work), fixed cost first for decode.
PREFILL_PREFERENCE = (1, 2, 0, 3)
DECODE_PREFERENCE = (0, 2, 1)


class FitStatus(enum.Enum):
    OK = "ok"  # both phases fully fitted
    PARTIAL = "partial"  # at least one phase usable, but not everything was identified
    FAILED = "failed"  # no phase could be fitted


@dataclass(frozen=True, slots=True)
class UsageCounts:
    """Carried sums behind t̄_n (new tokens per prefill iteration) and f_n (fraction of cached tokens
    restored from host memory). Merge with `+`; never average the averages."""

    prefill_iterations: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0
    restored_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("prefill_iterations", "new_tokens", "cached_tokens", "restored_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"UsageCounts.{name} must be >= 0, got {getattr(self, name)}")
        if self.restored_tokens > self.cached_tokens:
            raise ValueError(f"restored tokens ({self.restored_tokens}) exceed cached tokens ({self.cached_tokens})")

    @classmethod
    def of_iteration(cls, items: Iterable[PrefillItem]) -> UsageCounts:
        """One prefill iteration: counts its new (uncached) tokens."""
        return cls(prefill_iterations=1, new_tokens=sum(item.t_uc for item in items))

    @classmethod
    def of_request(cls, cached_tokens: int, restored_tokens: int) -> UsageCounts:
        """One prefill request: its cached prefix t_c and how many of those tokens came from host memory."""
        if not 0 <= restored_tokens <= cached_tokens:
            raise ValueError(f"need 0 <= restored ({restored_tokens}) <= cached ({cached_tokens}) tokens")
        return cls(cached_tokens=cached_tokens, restored_tokens=restored_tokens)

    def __add__(self, other: UsageCounts) -> UsageCounts:
        return UsageCounts(
            self.prefill_iterations + other.prefill_iterations,
            self.new_tokens + other.new_tokens,
            self.cached_tokens + other.cached_tokens,
            self.restored_tokens + other.restored_tokens,
        )  # (field by field: `astuple` deep-copies, and a router adds one per request)

    @property
    def t_bar(self) -> float | None:
        return self.new_tokens / self.prefill_iterations if self.prefill_iterations else None

    @property
    def f_restore(self) -> float | None:
        return self.restored_tokens / self.cached_tokens if self.cached_tokens else None


@dataclass(frozen=True, slots=True)
class FitResult:
    """Outcome of `ModelFitter.fit`: coefficients of each usable phase and why anything is missing."""

    status: FitStatus
    prefill: PrefillCoefficients | None
    decode: DecodeCoefficients | None
    held_out_error_prefill: float | None
    held_out_error_decode: float | None
    samples: tuple[int, int]  # (prefill iterations, decode iterations) observed
    message: str
    prefill_fit: PhaseFit
    decode_fit: PhaseFit
    usage: UsageCounts

    @property
    def unidentified(self) -> tuple[str, ...]:
        return self.prefill_fit.unidentified + self.decode_fit.unidentified


class PhaseNotFitted(LookupError):
    """The node's model for this phase could not be fitted (see the fit's status and message)."""


class PrefillWork(Protocol):
    """The terms of eq. 3: a `Work`, or the planner's per-request means."""

    @property
    def t_uc(self) -> float: ...
    @property
    def t_c(self) -> float: ...
    @property
    def query_key_pairs(self) -> float: ...


@dataclass(frozen=True, slots=True)
class FitQuality:
    """How one phase's frozen fit did: its mean relative error on the warmup iterations it held out, and how
    many iterations it was fitted on and checked on (`PhaseFit`'s diagnostics, kept with the model)."""

    held_out_error: float | None
    train_samples: int
    held_out_samples: int

    @classmethod
    def of(cls, fit: PhaseFit) -> FitQuality:
        return cls(fit.held_out_error, fit.train_samples, fit.held_out_samples)


@dataclass(frozen=True, slots=True)
class FittedNodeModel:
    """Frozen coefficients of one node plus its remeasured t̄_n and f_n: what planner and router evaluate.

    A phase whose fit was unusable is `None`, and asking for its times raises `PhaseNotFitted`. f_n is 0
    while no request has reported a cached prefix (nothing cached, nothing restored).
    """

    node: NodeId
    prefill: PrefillCoefficients | None
    decode: DecodeCoefficients | None
    usage: UsageCounts = field(default_factory=UsageCounts)
    unidentified: tuple[str, ...] = ()
    prefill_quality: FitQuality | None = None
    """The prefill fit's held-out diagnostics; None when the phase was not fitted on this node."""
    decode_quality: FitQuality | None = None
    """The decode fit's held-out diagnostics; None when the phase was not fitted on this node."""
    decode_kv_tokens: float = math.inf
    """KV tokens the node holds for running decodes (a known size, not fitted): caps the planner's decode batch
    (`planner.throughput.batch_limit`); inf: no cap."""

    def __post_init__(self) -> None:
        if self.prefill is not None and self.usage.t_bar is None:
            raise ValueError(f"node {self.node}: a prefill model needs usage counts with prefill iterations for t̄_n")

    @property
    def t_bar(self) -> float:
        if self.usage.t_bar is None:
            raise PhaseNotFitted(f"node {self.node}: no prefill iteration measured, so t̄_n is unknown")
        return self.usage.t_bar

    @property
    def f_restore(self) -> float:
        return self.usage.f_restore or 0.0

    def remeasured(self, window: UsageCounts) -> FittedNodeModel:
        """The same coefficients with t̄_n and f_n from `window`; each keeps its old value if the window
        holds no data for it (a node in decode runs no prefill iterations)."""
        t_part = window if window.prefill_iterations else self.usage
        f_part = window if window.cached_tokens else self.usage
        usage = UsageCounts(t_part.prefill_iterations, t_part.new_tokens, f_part.cached_tokens, f_part.restored_tokens)
        return replace(self, usage=usage)

    def _need_prefill(self) -> PrefillCoefficients:
        if self.prefill is None:
            raise PhaseNotFitted(f"node {self.node}: the prefill model was not fitted; see the fit's message")
        return self.prefill

    def _need_decode(self) -> DecodeCoefficients:
        if self.decode is None:
            raise PhaseNotFitted(f"node {self.node}: the decode model was not fitted; see the fit's message")
        return self.decode

    def prefill_iteration_time(self, items: Iterable[PrefillItem]) -> float:
        """Eq. 1."""
        return prefill_iteration_time(self._need_prefill(), items)

    def decode_iteration_time(self, batch: float) -> float:
        """Eq. 2."""
        return decode_iteration_time(self._need_decode(), batch)

    def prefill_request_time(self, work: PrefillWork) -> float:
        """Eq. 3 with the node's current t̄_n and f_n."""
        c = self._need_prefill()
        per_token = c.c0 / self.t_bar + c.c1
        return per_token * work.t_uc + c.c2 * work.query_key_pairs + c.c3 * self.f_restore * work.t_c

    def decode_request_time(self, work: Work, batch: float) -> float:
        """Eq. 4."""
        return decode_request_time(self._need_decode(), work, batch)

    def mu_prefill(self, work: PrefillWork) -> float:
        """Requests per second the node completes in prefill (inf for work that costs nothing)."""
        seconds = self.prefill_request_time(work)
        return math.inf if seconds <= 0 else 1.0 / seconds

    def mu_decode(self, work: Work, batch: float) -> float:
        """Requests per second the node completes in decode while running `batch` requests."""
        seconds = self.decode_request_time(work, batch)
        return math.inf if seconds <= 0 else 1.0 / seconds


class ModelFitter:
    """Collects one node's warmup iterations and fits eqs. 1 and 2.

    k, experts, t_fwd: the model's MoE shape and tokens fed per running request (known facts, not fitted).
    min_samples_per_coefficient: training samples a phase needs per coefficient (4 prefill, 3 decode).
    holdout_fraction: share of each phase's samples held out to measure the error (0 for none).
    """

    def __init__(
        self, node: NodeId, k: int, experts: int, t_fwd: float = 1.0, *,
        min_samples_per_coefficient: int = 2, holdout_fraction: float = 0.2,
    ) -> None:  # fmt: skip
        self._shape = DecodeCoefficients(0.0, 0.0, 0.0, k, experts, t_fwd)  # validates the shape
        if min_samples_per_coefficient < 1:
            raise ValueError(f"min_samples_per_coefficient must be >= 1, got {min_samples_per_coefficient}")
        if not 0.0 <= holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
        self.node, self.k, self.experts, self.t_fwd = node, k, experts, t_fwd
        self.min_samples_per_coefficient = min_samples_per_coefficient
        self.holdout_fraction = holdout_fraction
        self._prefill = PhaseSamples(len(PREFILL_NAMES))
        self._decode = PhaseSamples(len(DECODE_NAMES))
        self._decode_rows: dict[int, tuple[float, float, float]] = {}
        self._usage = UsageCounts()
        self._last: FitResult | None = None
        self._frozen = False

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def samples(self) -> tuple[int, int]:
        """(prefill, decode) iterations observed."""
        return (len(self._prefill), len(self._decode))

    def observe(self, record: IterationRecord) -> None:
        """Add one iteration. Raises ValueError for a record of another node, a non-positive duration, or a
        record that is neither a pure prefill nor a pure decode iteration; RuntimeError once frozen."""
        self._check_open()
        prefill, duration, batch = record.prefill, record.duration, record.decode_batch
        if record.node != self.node:
            raise ValueError(f"{_where(record)}: this fitter fits node {self.node}")
        if not 0 < duration < math.inf:
            raise ValueError(f"{_where(record)}: duration must be a finite number > 0, got {duration}")
        if bool(prefill) == (batch > 0):
            content = f"{len(prefill)} prefill items and decode batch {batch}"
            raise ValueError(f"{_where(record)}: {content}; eqs. 1 and 2 fit pure prefill or pure decode iterations")
        expected = Phase.PREFILL if prefill else Phase.DECODE
        if record.phase is not expected:
            phase = record.phase.value
            raise ValueError(f"{_where(record)}: phase {phase} but its content is a {expected.value} iteration")
        if prefill:
            self._prefill.add(prefill_features(prefill), duration)
            self._usage = self._usage + UsageCounts.of_iteration(prefill)
        else:
            row = self._decode_rows.get(batch)
            if row is None:  # eq. 2's regressors depend on the batch size only
                row = self._decode_rows[batch] = decode_features(self._shape, batch)
            self._decode.add(row, duration)

    def observe_request(self, cached_tokens: int, restored_tokens: int) -> None:
        """Add one prefill request's cached prefix and the part of it restored from host memory (for f_n)."""
        self._check_open()
        self._usage = self._usage + UsageCounts.of_request(cached_tokens, restored_tokens)

    def fit(self, split_seed: int = 0) -> FitResult:
        """Fit both phases on a deterministic split of the samples seen so far (see the module invariants)."""
        prefill = self._fit_prefill(split_seed)
        decode = fit_phase(
            "decode", *self._decode.arrays(), DECODE_NAMES, DECODE_PREFERENCE,
            self.min_samples_per_coefficient * len(DECODE_NAMES), self.holdout_fraction, (split_seed, 1),
        )  # fmt: skip
        p_coef = None if prefill.values is None else PrefillCoefficients(*prefill.values)
        d_coef: DecodeCoefficients | None = None
        if decode.values is not None:
            d0, d1, d2 = decode.values  # one value per DECODE_NAMES
            d_coef = DecodeCoefficients(d0, d1, d2, self.k, self.experts, self.t_fwd)
        if prefill.status is PhaseStatus.FITTED and decode.status is PhaseStatus.FITTED:
            status = FitStatus.OK
        else:
            status = FitStatus.FAILED if p_coef is None and d_coef is None else FitStatus.PARTIAL
        self._last = FitResult(
            status, p_coef, d_coef, prefill.held_out_error, decode.held_out_error, self.samples,
            f"node {self.node}: {status.value}; prefill: {prefill.message}; decode: {decode.message}",
            prefill, decode, self._usage,
        )  # fmt: skip
        return self._last

    def fit_prefill(self, split_seed: int = 0) -> tuple[PrefillCoefficients | None, UsageCounts]:
        """`fit(split_seed)`'s prefill coefficients (None if unusable) and usage counts, without fitting the decode
        phase: what the router's provisional model needs during warmup."""
        prefill = self._fit_prefill(split_seed)
        return (None if prefill.values is None else PrefillCoefficients(*prefill.values)), self._usage

    def _fit_prefill(self, split_seed: int) -> PhaseFit:
        return fit_phase(
            "prefill", *self._prefill.arrays(), PREFILL_NAMES, PREFILL_PREFERENCE,
            self.min_samples_per_coefficient * len(PREFILL_NAMES), self.holdout_fraction, (split_seed, 0),
        )  # fmt: skip

    def freeze(self, split_seed: int = 0) -> FittedNodeModel:
        """Stop learning: the last fit (refitted if samples arrived since) becomes the node's model; later
        `observe` calls fail."""
        result = self._last
        if result is None or result.samples != self.samples or result.usage != self._usage:
            result = self.fit(split_seed)
        self._frozen = True
        return FittedNodeModel(
            self.node, result.prefill, result.decode, result.usage, result.unidentified,
            None if result.prefill is None else FitQuality.of(result.prefill_fit),
            None if result.decode is None else FitQuality.of(result.decode_fit),
        )  # fmt: skip

    def _check_open(self) -> None:
        if self._frozen:
            raise RuntimeError(f"node {self.node}: the model is frozen; remeasure t̄_n and f_n with UsageCounts")


def prefill_error(coef: PrefillCoefficients, records: Iterable[IterationRecord]) -> float:
    """Mean relative error of eq. 1 with `coef` on the prefill iterations among `records`."""
    pairs = [(prefill_iteration_time(coef, r.prefill), r.duration) for r in records if r.prefill]
    return mean_relative_error([p for p, _ in pairs], [m for _, m in pairs])


def decode_error(coef: DecodeCoefficients, records: Iterable[IterationRecord]) -> float:
    """Mean relative error of eq. 2 with `coef` on the decode iterations among `records`."""
    pairs = [(decode_iteration_time(coef, r.decode_batch), r.duration) for r in records if r.decode_batch > 0]
    return mean_relative_error([p for p, _ in pairs], [m for _, m in pairs])


def _where(record: IterationRecord) -> str:
    return f"iteration of node {record.node} at t={record.start}"
