"""Online fitting of the iteration-time models of one node (paper 5.1, "online fitting"; E.3 line 1).

During warmup a node serves both phases (collocated) and reports one `IterationRecord` per iteration. A
`ModelFitter` collects them, fits (c0..c3) of eq. 1 and (d0..d2) of eq. 2 by non-negative least squares,
reports the mean relative error on held-out iterations, and `freeze` turns the fit into a
`FittedNodeModel`. After that only t̄_n and f_n change, remeasured from `UsageCounts` carried as sums.

Invariants:
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
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, field, replace
from typing import Protocol

import numpy as np
from scipy.optimize import nnls

from evolving_infra.core.itermodel import (
    DecodeCoefficients, IterationRecord, PrefillCoefficients, PrefillItem, decode_features, decode_iteration_time,
    decode_request_time, mean_relative_error, prefill_features, prefill_iteration_time,
)  # fmt: skip
from evolving_infra.core.types import NodeId, Phase, Work

PREFILL_NAMES = ("c0", "c1", "c2", "c3")
DECODE_NAMES = ("d0", "d1", "d2")
# Order in which columns are admitted when the design is rank deficient: time per token first for
# prefill (a constant-shape warmup still predicts in proportion to work), fixed cost first for decode.
PREFILL_PREFERENCE = (1, 2, 0, 3)
DECODE_PREFERENCE = (0, 2, 1)
RANK_RTOL = 1e-6
"""A column is unidentifiable if the smallest singular value of the scaled design with it falls below this
fraction of the largest."""


class CoefficientStatus(enum.Enum):
    FITTED = "fitted"
    UNIDENTIFIED = "unidentified"  # its column adds nothing the others do not explain; value 0


class PhaseStatus(enum.Enum):
    FITTED = "fitted"  # every coefficient identified
    PARTIAL = "partial"  # fitted on the identifiable subset; the rest are 0 and UNIDENTIFIED
    TOO_FEW_SAMPLES = "too_few_samples"
    NO_SAMPLES = "no_samples"


class FitStatus(enum.Enum):
    OK = "ok"  # both phases fully fitted
    PARTIAL = "partial"  # at least one phase usable, but not everything was identified
    FAILED = "failed"  # no phase could be fitted


@dataclass(frozen=True, slots=True)
class PhaseFit:
    """The fit of one phase: status, each coefficient's status, its values and held-out diagnostics."""

    status: PhaseStatus
    coefficient_status: tuple[tuple[str, CoefficientStatus], ...]
    values: tuple[float, ...] | None
    train_samples: int
    held_out_samples: int
    held_out_error: float | None
    message: str

    @property
    def unidentified(self) -> tuple[str, ...]:
        return tuple(name for name, s in self.coefficient_status if s is CoefficientStatus.UNIDENTIFIED)


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
        return UsageCounts(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

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
        self._prefill_x: list[tuple[float, float, float, float]] = []
        self._prefill_y: list[float] = []
        self._decode_x: list[tuple[float, float, float]] = []
        self._decode_y: list[float] = []
        self._usage = UsageCounts()
        self._last: FitResult | None = None
        self._frozen = False

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def samples(self) -> tuple[int, int]:
        """(prefill, decode) iterations observed."""
        return (len(self._prefill_y), len(self._decode_y))

    def observe(self, record: IterationRecord) -> None:
        """Add one iteration. Raises ValueError for a record of another node, a non-positive duration, or a
        record that is neither a pure prefill nor a pure decode iteration; RuntimeError once frozen."""
        self._check_open()
        where = f"iteration of node {record.node} at t={record.start}"
        if record.node != self.node:
            raise ValueError(f"{where}: this fitter fits node {self.node}")
        if not (math.isfinite(record.duration) and record.duration > 0):
            raise ValueError(f"{where}: duration must be a finite number > 0, got {record.duration}")
        if bool(record.prefill) == (record.decode_batch > 0):
            content = f"{len(record.prefill)} prefill items and decode batch {record.decode_batch}"
            raise ValueError(f"{where}: {content}; eqs. 1 and 2 fit pure prefill or pure decode iterations")
        expected = Phase.PREFILL if record.prefill else Phase.DECODE
        if record.phase is not expected:
            raise ValueError(f"{where}: phase {record.phase.value} but its content is a {expected.value} iteration")
        if record.prefill:
            self._prefill_x.append(prefill_features(record.prefill))
            self._prefill_y.append(record.duration)
            self._usage = self._usage + UsageCounts.of_iteration(record.prefill)
        else:
            self._decode_x.append(decode_features(self._shape, record.decode_batch))
            self._decode_y.append(record.duration)

    def observe_request(self, cached_tokens: int, restored_tokens: int) -> None:
        """Add one prefill request's cached prefix and the part of it restored from host memory (for f_n)."""
        self._check_open()
        self._usage = self._usage + UsageCounts.of_request(cached_tokens, restored_tokens)

    def fit(self, split_seed: int = 0) -> FitResult:
        """Fit both phases on a deterministic split of the samples seen so far (see the module invariants)."""
        prefill = _fit_phase(
            "prefill", self._prefill_x, self._prefill_y, PREFILL_NAMES, PREFILL_PREFERENCE,
            self.min_samples_per_coefficient * len(PREFILL_NAMES), self.holdout_fraction, (split_seed, 0),
        )  # fmt: skip
        decode = _fit_phase(
            "decode", self._decode_x, self._decode_y, DECODE_NAMES, DECODE_PREFERENCE,
            self.min_samples_per_coefficient * len(DECODE_NAMES), self.holdout_fraction, (split_seed, 1),
        )  # fmt: skip
        p_coef = None if prefill.values is None else PrefillCoefficients(*prefill.values)
        d_coef = None if decode.values is None else DecodeCoefficients(*decode.values, self.k, self.experts, self.t_fwd)
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

    def freeze(self, split_seed: int = 0) -> FittedNodeModel:
        """Stop learning: the last fit (refitted if samples arrived since) becomes the node's model; later
        `observe` calls fail."""
        result = self._last
        if result is None or result.samples != self.samples or result.usage != self._usage:
            result = self.fit(split_seed)
        self._frozen = True
        return FittedNodeModel(self.node, result.prefill, result.decode, result.usage, result.unidentified)

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


def holdout_split(n: int, fraction: float, seed: Sequence[int], min_train: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) indices: a seeded permutation, holding out `fraction` but keeping >= min_train."""
    order = np.random.default_rng(list(seed)).permutation(n)
    held = max(0, min(int(n * fraction), n - min_train))
    return np.sort(order[held:]), np.sort(order[:held])


def _fit_phase(
    phase: str, rows: Sequence[Sequence[float]], times: Sequence[float], names: tuple[str, ...],
    preference: tuple[int, ...], min_train: int, holdout_fraction: float, seed: tuple[int, int],
) -> PhaseFit:  # fmt: skip
    n = len(times)
    if n == 0:
        return PhaseFit(PhaseStatus.NO_SAMPLES, (), None, 0, 0, None, f"no {phase} iterations observed")
    if n < min_train:
        message = f"{n} {phase} iterations observed, need at least {min_train} ({len(names)} coefficients)"
        return PhaseFit(PhaseStatus.TOO_FEW_SAMPLES, (), None, n, 0, None, message)
    x, y = np.asarray(rows, dtype=float), np.asarray(times, dtype=float)
    train, held = holdout_split(n, holdout_fraction, seed, min_train)
    weighted = x[train] / y[train, None]  # relative least squares
    norms = np.linalg.norm(weighted, axis=0)
    support = np.count_nonzero(x[train], axis=0)
    chosen: list[int] = []
    for col in preference:
        if support[col] < 2 or norms[col] == 0:
            continue
        candidate = weighted[:, [*chosen, col]] / norms[[*chosen, col]]
        sv = np.linalg.svd(candidate, compute_uv=False)
        if sv[-1] > RANK_RTOL * sv[0]:
            chosen.append(col)
    solution, _ = nnls(weighted[:, chosen] / norms[chosen], np.ones(len(train)))
    values = np.zeros(len(names))
    values[chosen] = solution / norms[chosen]
    statuses = tuple(
        (name, CoefficientStatus.FITTED if i in chosen else CoefficientStatus.UNIDENTIFIED)
        for i, name in enumerate(names)
    )
    missing = [name for name, s in statuses if s is CoefficientStatus.UNIDENTIFIED]
    error = mean_relative_error(list(x[held] @ values), list(y[held])) if len(held) else None
    parts = [f"fitted on {len(train)} iterations"]
    parts.append(f"held-out error {error:.1%} on {len(held)}" if error is not None else "no held-out iterations")
    if missing:
        parts.append(f"{', '.join(missing)} unidentifiable from these iterations (set to 0)")
    status = PhaseStatus.PARTIAL if missing else PhaseStatus.FITTED
    return PhaseFit(status, statuses, tuple(float(v) for v in values), len(train), len(held), error, ", ".join(parts))
