"""The per-node time model a routing policy needs, and its adapter over the paper's coefficients.

`PrefillNodeModel` is the narrow interface the TTFT policy calls: eq. 1 (one chunked-prefill iteration)
to replay a node's queue, and eq. 3 (one request's service time) for the sum-of-service-times estimate.
Fitted per-node models (`evolving_infra.router.fitting`) and the simulator's hardware profiles satisfy it;
`CoefficientPrefillModel` is the plain adapter over `PrefillCoefficients`; a model whose iteration time is eq. 1
with fixed coefficients may say so through `linear_coefficients()` (optional), which lets the TTFT policy price
all nodes at once.

Boundary: pure arithmetic; no fitting, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from evolving_infra.core import itermodel
from evolving_infra.core.itermodel import PrefillCoefficients, PrefillItem
from evolving_infra.core.types import Work


@runtime_checkable
class PrefillNodeModel(Protocol):
    """Predicted prefill times of one node, in seconds.

    A model object must not change its predictions after it is handed to a router (a refit is a new
    object): the TTFT router reuses backlog replays per model object.
    """

    def prefill_request_time(self, work: Work) -> float:
        """Eq. 3: time the request with `work` occupies the node."""
        ...

    def prefill_iteration_time(self, items: Sequence[PrefillItem]) -> float:
        """Eq. 1: duration of one chunked-prefill iteration over `items`."""
        ...


@dataclass(frozen=True, slots=True)
class CoefficientPrefillModel:
    """`PrefillNodeModel` from eq. 1 coefficients.

    t_bar: average new tokens per prefill iteration on the node (eq. 3 divides the fixed cost in
    proportion to uncached tokens); f_restore: fraction of cached tokens the node restores from host
    memory (eq. 3's restore term).
    """

    coef: PrefillCoefficients
    t_bar: float = 8192.0
    f_restore: float = 0.0

    def __post_init__(self) -> None:
        if not self.t_bar > 0:
            raise ValueError(f"t_bar must be > 0 tokens per iteration, got {self.t_bar}")
        if not 0.0 <= self.f_restore <= 1.0:
            raise ValueError(f"f_restore must lie in [0, 1], got {self.f_restore}")

    def prefill_request_time(self, work: Work) -> float:
        return itermodel.prefill_request_time(self.coef, work, self.t_bar, self.f_restore)

    def prefill_iteration_time(self, items: Sequence[PrefillItem]) -> float:
        return itermodel.prefill_iteration_time(self.coef, items)

    def linear_coefficients(self) -> PrefillCoefficients:
        """Eq. 1's coefficients: `prefill_iteration_time` is eq. 1 with them (a routing policy may then price
        many nodes with array arithmetic, `backlogs.append_columns`)."""
        return self.coef
