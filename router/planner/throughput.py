"""Predicted cluster throughput of a split: Θ(P, D; w̄, q̄) = min(Σ_{n∈P} µ_P,n, Σ_{n∈D} µ_D,n) (eq. 5).

µ_P,n = 1 / T_P,n(w̄) with eq. 3 on the mean terms of `MeanWork` (exact mean service time, see `window`);
µ_D,n = 1 / T_D,n(w̄) with eq. 4 at the batch B_n = min(q̄ / |D|, B_max,n), i.e.
B_n / (T_D,n^iter(B_n) * mean(t_out / t_acc)).

Beyond the paper: B_max,n is how many requests node n's KV memory holds at once, its `decode_kv_tokens` over a
request's decode footprint (mean prompt plus mean output tokens: a decode engine admits a request only with room
for both, and the rest wait). Eq. 4 alone lets a few decode nodes batch any q̄ (at 40 agents a node, contexts of
~100K tokens and q̄ / |D| ~ 50, it rated three decode nodes at 1.7x what the ~20 requests each one holds can
serve). A model without `decode_kv_tokens` (or with inf) has no cap.

Invariants: adding a prefill node never lowers Σµ_P; Σµ_D never falls when q̄ grows (B / T^iter(B) is
non-decreasing because φ is concave with φ(0) = 0, and the cap only stops B's growth); with identical decode
nodes Σµ_D never falls when |D| grows. At q̄ = 0 the decode pool completes nothing (the limit of eq. 4 as
B -> 0), so Θ = 0.

Boundary: the planner's view of a node is the `NodeModel` protocol; how its coefficients, t̄_n and f_n are
fitted is not this module's concern. `CoefficientNodeModel` adapts plain coefficients (a hardware profile's
true ones, or fitted ones) to the protocol.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients, decode_iteration_time
from evolving_infra.core.types import NodeId, Work
from evolving_infra.router.planner.window import MeanWork


@runtime_checkable
class NodeModel(Protocol):
    """What a planner needs to know about one node's speed."""

    def prefill_request_time(self, work: MeanWork) -> float:
        """Eq. 3 with the node's t̄_n and f_n: seconds a request with these (mean) terms occupies it in prefill.

        Must be linear in work.t_uc, work.query_key_pairs and work.t_c with no constant term.
        """
        ...

    def decode_iteration_time(self, batch: float) -> float:
        """Eq. 2: seconds of one decode iteration with `batch` running requests."""
        ...


def decode_kv_tokens(model: NodeModel) -> float:
    """The node's KV capacity for running decodes in tokens: a model's optional `decode_kv_tokens` attribute
    (inf, no cap, for models without one)."""
    return float(getattr(model, "decode_kv_tokens", math.inf))


def batch_limit(model: NodeModel, work: MeanWork) -> float:
    """B_max,n: the requests of `work`'s mean footprint (prompt plus output tokens) that the node's KV holds at
    once (inf without a cap or without a footprint)."""
    footprint = work.t_uc + work.t_c + work.t_out
    capacity = decode_kv_tokens(model)
    return math.inf if footprint <= 0 or math.isinf(capacity) else capacity / footprint


@dataclass(frozen=True, slots=True)
class CoefficientNodeModel:
    """`NodeModel` from eq. 1/2 coefficients plus the node's t̄_n (new tokens per prefill iteration) and f_n
    (fraction of cached tokens restored from host memory)."""

    prefill: PrefillCoefficients
    decode: DecodeCoefficients
    t_bar: float
    f_restore: float = 0.0
    decode_kv_tokens: float = math.inf
    """KV tokens the node holds for running decodes (its GPU memory, L1); inf: no cap (see the module docstring)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.t_bar) and self.t_bar > 0):
            raise ValueError(f"t_bar (new tokens per prefill iteration) must be > 0, got {self.t_bar}")
        if not 0.0 <= self.f_restore <= 1.0:
            raise ValueError(f"f_restore (fraction of cached tokens restored) must be in [0, 1], got {self.f_restore}")
        if not self.decode_kv_tokens > 0:
            raise ValueError(f"decode_kv_tokens must be > 0 (inf for no cap), got {self.decode_kv_tokens}")

    def prefill_request_time(self, work: MeanWork | Work) -> float:
        terms = MeanWork.of(work) if isinstance(work, Work) else work
        c = self.prefill
        return (
            c.c0 * terms.t_uc / self.t_bar
            + c.c1 * terms.t_uc
            + c.c2 * terms.query_key_pairs
            + c.c3 * self.f_restore * terms.t_c
        )

    def decode_iteration_time(self, batch: float) -> float:
        return decode_iteration_time(self.decode, batch)


def prefill_rate(model: NodeModel, work: MeanWork) -> float:
    """µ_P,n: requests per second (inf if the work costs no prefill time)."""
    seconds = model.prefill_request_time(work)
    if seconds < 0 or math.isnan(seconds):
        raise ValueError(f"prefill_request_time returned {seconds}; it must be >= 0")
    return math.inf if seconds == 0 else 1.0 / seconds


def decode_rate(model: NodeModel, work: MeanWork, batch: float) -> float:
    """µ_D,n with `batch` requests in decode on the node: B / (T^iter(B) * mean(t_out / t_acc)) at
    B = min(batch, `batch_limit`); 0 at B = 0."""
    batch = min(batch, batch_limit(model, work))
    if batch <= 0:
        return 0.0
    per_request = model.decode_iteration_time(batch) * work.decode_iterations / batch
    if per_request < 0 or math.isnan(per_request):
        raise ValueError(f"decode time per request is {per_request} at batch {batch}; it must be >= 0")
    return math.inf if per_request == 0 else 1.0 / per_request


@dataclass(frozen=True, slots=True)
class SplitThroughput:
    """Σµ_P, Σµ_D and Θ = min of the two for one split on one slice."""

    prefill: float
    decode: float

    @property
    def theta(self) -> float:
        return min(self.prefill, self.decode)


def split_throughput(
    prefill: Sequence[NodeId],
    decode: Sequence[NodeId],
    models: Mapping[NodeId, NodeModel],
    work: MeanWork,
    mean_decode_requests: float,
) -> SplitThroughput:
    """Eq. 5 for the split (prefill, decode) on one slice's w̄ and q̄."""
    if mean_decode_requests < 0:
        raise ValueError(f"q̄ (mean requests in decode) must be >= 0, got {mean_decode_requests}")
    for node in (*prefill, *decode):
        if node not in models:
            raise ValueError(f"no node model for node {node!r}; models exist for {sorted(models)}")
    mu_p = sum((prefill_rate(models[n], work) for n in prefill), 0.0)
    batch = mean_decode_requests / len(decode) if decode else 0.0
    mu_d = sum((decode_rate(models[n], work, batch) for n in decode), 0.0)
    return SplitThroughput(prefill=mu_p, decode=mu_d)
