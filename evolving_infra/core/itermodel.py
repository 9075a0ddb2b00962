"""Iteration-time models of the paper (section 5.1, equations 1-4) and the records they are fitted on.

- Prefill iteration (eq. 1): `T = c0 + c1 * sum(t_uc) + c2 * sum(A) + c3 * sum(t_rst)` over the batch,
  with `A = t_uc * t_c + t_uc (t_uc + 1) / 2` for each request's chunk.
- Decode iteration (eq. 2): `T(B) = d0 + d1 * phi(B) + d2 * B`, `phi(B) = 1 - (1 - k/E)^(t_fwd * B)`.
- Per-request service time in prefill (eq. 3) and decode (eq. 4), and node throughputs mu_P, mu_D.

The same functions give the *true* iteration time of the emulated engine (from a hardware profile's
coefficients) and the *predicted* time used by the planner and router (from coefficients fitted online).

Boundary: pure arithmetic on plain values; no fitting (see `evolving_infra.router.fitting`), no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from evolving_infra.core.types import NodeId, Phase, Work


@dataclass(frozen=True, slots=True)
class PrefillCoefficients:
    """c0: fixed cost per iteration (s); c1: per uncached token; c2: per query-key pair; c3: per restored token."""

    c0: float
    c1: float
    c2: float
    c3: float

    def __post_init__(self) -> None:
        for name in ("c0", "c1", "c2", "c3"):
            if getattr(self, name) < 0:
                raise ValueError(f"prefill coefficient {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class DecodeCoefficients:
    """d0: fixed cost; d1: time to read all routed experts; d2: per running request (all in seconds).

    k: experts each token selects; experts: routed experts E; t_fwd: tokens each running request feeds
    into an iteration (> 1 under speculative decoding).
    """

    d0: float
    d1: float
    d2: float
    k: int
    experts: int
    t_fwd: float = 1.0

    def __post_init__(self) -> None:
        for name in ("d0", "d1", "d2"):
            if getattr(self, name) < 0:
                raise ValueError(f"decode coefficient {name} must be >= 0, got {getattr(self, name)}")
        if not 1 <= self.k <= self.experts:
            raise ValueError(f"need 1 <= k <= experts, got k={self.k}, experts={self.experts}")
        if self.t_fwd < 1:
            raise ValueError(f"t_fwd must be >= 1, got {self.t_fwd}")


@dataclass(frozen=True, slots=True)
class PrefillItem:
    """One request's share of a prefill iteration.

    t_uc: uncached tokens computed in this iteration (the chunk); t_c: tokens before the chunk whose KV
    the chunk attends to (cached prefix plus earlier chunks); t_rst: tokens restored from host memory and
    charged to this iteration.
    """

    t_uc: int
    t_c: int
    t_rst: int = 0

    @property
    def query_key_pairs(self) -> int:
        return self.t_uc * self.t_c + self.t_uc * (self.t_uc + 1) // 2


class IterationRecord(NamedTuple):
    """What one engine iteration did and how long it took: the sample the models are fitted on.

    A prefill iteration lists its `prefill` items and has `decode_batch == 0`; a decode iteration has no
    prefill items and `decode_batch == B` running requests, which attended to `context_tokens` tokens in all
    (eq. 2 does not use it; it lets the model's error be told apart from the engine's ground truth).
    An immutable named tuple: one is made per engine iteration, which a frozen dataclass makes several
    times slower.
    """

    node: NodeId
    phase: Phase
    start: float
    duration: float
    prefill: tuple[PrefillItem, ...] = ()
    decode_batch: int = 0
    context_tokens: float = 0.0


def prefill_features(items: Iterable[PrefillItem]) -> tuple[float, float, float, float]:
    """The regressors of eq. 1 for one iteration: (1, sum t_uc, sum A, sum t_rst)."""
    uc = pairs = rst = 0
    for item in items:
        uc += item.t_uc
        pairs += item.query_key_pairs
        rst += item.t_rst
    return (1.0, float(uc), float(pairs), float(rst))


def prefill_iteration_time(coef: PrefillCoefficients, items: Iterable[PrefillItem]) -> float:
    """Eq. 1."""
    _, uc, pairs, rst = prefill_features(items)
    return coef.c0 + coef.c1 * uc + coef.c2 * pairs + coef.c3 * rst


def phi(batch: float, k: int, experts: int, t_fwd: float) -> float:
    """Expected fraction of routed experts that `t_fwd * batch` tokens select (appendix B.3)."""
    if batch <= 0:
        return 0.0
    missed: float = (1.0 - k / experts) ** (t_fwd * batch)  # float ** float is typed Any (complex if negative)
    return 1.0 - missed


def decode_features(coef: DecodeCoefficients, batch: float) -> tuple[float, float, float]:
    """The regressors of eq. 2 for one iteration: (1, phi(B), B)."""
    return (1.0, phi(batch, coef.k, coef.experts, coef.t_fwd), float(batch))


def decode_iteration_time(coef: DecodeCoefficients, batch: float) -> float:
    """Eq. 2. Zero running requests means no iteration (0 s)."""
    if batch <= 0:
        return 0.0
    return coef.d0 + coef.d1 * phi(batch, coef.k, coef.experts, coef.t_fwd) + coef.d2 * batch


def prefill_request_time(coef: PrefillCoefficients, work: Work, t_bar: float, f_restore: float) -> float:
    """Eq. 3: time a request occupies a prefill node.

    t_bar: average new tokens per prefill iteration on the node (the fixed cost is divided in proportion
    to uncached tokens); f_restore: fraction of cached tokens the node restores from host memory.
    """
    if t_bar <= 0:
        raise ValueError(f"t_bar must be > 0, got {t_bar}")
    return (
        coef.c0 * work.t_uc / t_bar
        + coef.c1 * work.t_uc
        + coef.c2 * work.query_key_pairs
        + coef.c3 * f_restore * work.t_c
    )


def decode_request_time(coef: DecodeCoefficients, work: Work, batch: float) -> float:
    """Eq. 4: time a request occupies a decode node running `batch` requests."""
    if batch <= 0:
        raise ValueError(f"batch must be > 0, got {batch}")
    return decode_iteration_time(coef, batch) * work.t_out / (batch * work.t_acc)


def node_throughputs(
    prefill: PrefillCoefficients,
    decode: DecodeCoefficients,
    work: Work,
    t_bar: float,
    f_restore: float,
    batch: float,
) -> tuple[float, float]:
    """(mu_P, mu_D): requests per second the node completes in prefill and in decode."""
    tp = prefill_request_time(prefill, work, t_bar, f_restore)
    td = decode_request_time(decode, work, batch)
    return (1.0 / tp if tp > 0 else float("inf"), 1.0 / td if td > 0 else float("inf"))


def mean_relative_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Mean of |predicted - measured| / measured over samples with measured > 0."""
    pairs = [(p, m) for p, m in zip(predicted, measured, strict=True) if m > 0]
    if not pairs:
        raise ValueError("no samples with a positive measured time")
    return sum(abs(p - m) / m for p, m in pairs) / len(pairs)
