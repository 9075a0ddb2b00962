"""`ModelShape`: what the live router knows of the model and hardware before fitting (from a hardware profile,
resolved by the command line: the router may not import the node agent's profiles), and the node models built
from it for the router (eq. 1/3) and the planner (eq. 3/2).

Boundary: plain values and model construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients
from evolving_infra.core.types import NodeId
from evolving_infra.router.fitting import FittedNodeModel, ModelFitter, UsageCounts
from evolving_infra.router.planner import CoefficientNodeModel
from evolving_infra.router.routing import CoefficientPrefillModel


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Profile coefficients and sizes (decode coefficients carry the MoE shape k, experts, t_fwd)."""

    name: str
    prefill: PrefillCoefficients
    decode: DecodeCoefficients
    t_acc: float
    page_tokens: int
    chunk_tokens: int
    l1_tokens: int

    def _measured(self, usage: UsageCounts | None) -> tuple[float, float]:
        t_bar = usage.t_bar if usage is not None and usage.t_bar else float(self.chunk_tokens)
        f = usage.f_restore if usage is not None and usage.f_restore is not None else 0.0
        return t_bar, f

    def router_model(self, usage: UsageCounts | None = None) -> CoefficientPrefillModel:
        t_bar, f = self._measured(usage)
        return CoefficientPrefillModel(self.prefill, t_bar=t_bar, f_restore=f)

    def planner_model(self, usage: UsageCounts | None = None) -> CoefficientNodeModel:
        t_bar, f = self._measured(usage)
        return CoefficientNodeModel(self.prefill, self.decode, t_bar, f)

    def fitter(self, node: NodeId) -> ModelFitter:
        return ModelFitter(node, self.decode.k, self.decode.experts, self.decode.t_fwd)


def refreshed(
    shape: ModelShape, fitted: FittedNodeModel | None, previous: object, usage: UsageCounts | None
) -> tuple[object, object]:
    """(router model, planner model) for the next window: the frozen fit remeasured, else the profile's."""
    if fitted is not None:
        model = fitted.remeasured(usage) if usage is not None else (previous or fitted)
        return model, model
    return shape.router_model(usage), shape.planner_model(usage)
