"""Node models for the router (eq. 1/3) and the planner (eq. 3/2) over a cluster's life, for both drivers.

- `ModelShape`: what is known of the model and hardware before fitting (a hardware profile's coefficients and
  sizes; the router may not import the node agent's profiles, so drivers build it from one).
- `ModelBook`: which models the router and planner evaluate, and when they change:
  * `ModelOrigin.FITTED` (ours, paper 5.1): during the collocated warmup every node's `ModelFitter` sees its
    iterations; the router prices prefills with provisional fits (`provisional`: before the first fit a stand-in
    that prices uncached tokens only), refreshed every fit interval; at the end of warmup the fits are frozen
    (`freeze`). A node whose fit lacks a phase borrows it from the first node that has it (identical hardware);
    if no node has a phase at all the profile's models stay (`WarmupTooShort` is reported, not raised).
  * `ModelOrigin.PROFILE` (baselines, tests): the profile's coefficients through the router's and planner's
    adapters.
  After warmup only t̄_n and f_n change, remeasured from each window's usage counts (`refreshed`).

Boundary: pure model construction; fitters and usage counts are passed in. Each change is a new model object
(the TTFT router memoizes per model object).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from evolving_infra.core.itermodel import DecodeCoefficients, PrefillCoefficients
from evolving_infra.core.types import NodeId
from evolving_infra.router.fitting import FittedNodeModel, ModelFitter, UsageCounts
from evolving_infra.router.planner import CoefficientNodeModel
from evolving_infra.router.routing import CoefficientPrefillModel

PROVISIONAL = PrefillCoefficients(c0=0.0, c1=1e-5, c2=0.0, c3=0.0)
"""Stand-in before the first warmup fit: time proportional to uncached tokens (only the ranking matters)."""


class WarmupTooShort(RuntimeError):
    """No node saw enough iterations of a phase during warmup to fit its model."""


class ModelOrigin(enum.Enum):
    """Where the node models the router and planner evaluate come from."""

    FITTED = "fitted"
    """Fitted online during a collocated warmup, then frozen (t̄_n, f_n remeasured per window)."""
    PROFILE = "profile"
    """The hardware profile's coefficients through the router's and planner's adapters."""


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
    l2_tokens: int = 0

    @property
    def node_kv_pages(self) -> int:
        """The KV pages a node's GPU (L1) and host (L2) memory hold together."""
        return (self.l1_tokens + self.l2_tokens) // self.page_tokens

    def _measured(self, usage: UsageCounts | None) -> tuple[float, float]:
        t_bar = usage.t_bar if usage is not None and usage.t_bar else float(self.chunk_tokens)
        f = usage.f_restore if usage is not None and usage.f_restore is not None else 0.0
        return t_bar, f

    def router_model(self, usage: UsageCounts | None = None) -> CoefficientPrefillModel:
        t_bar, f = self._measured(usage)
        return CoefficientPrefillModel(self.prefill, t_bar=t_bar, f_restore=f)

    def planner_model(self, usage: UsageCounts | None = None) -> CoefficientNodeModel:
        t_bar, f = self._measured(usage)
        return CoefficientNodeModel(self.prefill, self.decode, t_bar, f, decode_kv_tokens=float(self.l1_tokens))

    def fitter(self, node: NodeId) -> ModelFitter:
        return ModelFitter(node, self.decode.k, self.decode.experts, self.decode.t_fwd)

    def provisional(self, fitter: ModelFitter | None) -> CoefficientPrefillModel:
        """The router's model during warmup: the latest fit of the node's prefill iterations, else the stand-in
        (the decode phase is fitted when the warmup ends: the router prices prefills)."""
        coefficients, usage = fitter.fit_prefill() if fitter is not None else (None, None)
        if coefficients is None or usage is None:
            return CoefficientPrefillModel(PROVISIONAL, t_bar=float(self.chunk_tokens))
        return CoefficientPrefillModel(
            coefficients, t_bar=usage.t_bar or float(self.chunk_tokens), f_restore=usage.f_restore or 0.0
        )


def freeze_all(fitters: dict[NodeId, ModelFitter]) -> tuple[dict[NodeId, FittedNodeModel], list[str]]:
    """Freeze every node's fit; fill a missing phase from another node. Returns the models and messages.
    Raises `WarmupTooShort` when no node has a phase at all."""
    frozen = {n: f.freeze() for n, f in fitters.items()}
    messages: list[str] = []
    donor_p = next((m for m in frozen.values() if m.prefill is not None), None)
    donor_d = next((m for m in frozen.values() if m.decode is not None), None)
    if donor_p is None or donor_d is None:
        missing = "prefill" if donor_p is None else "decode"
        raise WarmupTooShort(
            f"no node saw enough {missing} iterations during warmup to fit its model; lengthen the warmup, add "
            "load, or use the profile's models"
        )
    out: dict[NodeId, FittedNodeModel] = {}
    for n, m in frozen.items():
        if m.prefill is None:
            m = replace(m, prefill=donor_p.prefill, usage=donor_p.usage)
            messages.append(f"{n}: prefill model borrowed from {donor_p.node}")
        if m.decode is None:
            m = replace(m, decode=donor_d.decode)
            messages.append(f"{n}: decode model borrowed from {donor_d.node}")
        out[n] = m
    return out, messages


class ModelBook:
    """The models of every node over the cluster's life (see the module docstring)."""

    def __init__(self, shape: ModelShape, origin: ModelOrigin) -> None:
        self.shape = shape
        self.origin = origin
        self.fitted: dict[NodeId, FittedNodeModel] = {}
        """Frozen warmup fits (empty before the warmup ends, or when the profile's models stayed)."""

    def initial(self, warmup: bool) -> tuple[object, object | None]:
        """(router model, planner model) of a node at start: provisional during a fitting warmup, else the
        profile's (the planner has no model until the warmup ends)."""
        if warmup and self.origin is ModelOrigin.FITTED:
            return self.shape.provisional(None), None
        return self.shape.router_model(), self.shape.planner_model()

    def provisional(self, fitter: ModelFitter | None) -> object:
        return self.shape.provisional(fitter)

    def freeze(
        self, fitters: dict[NodeId, ModelFitter]
    ) -> tuple[dict[NodeId, tuple[object, object]], list[str], bool]:
        """End of warmup: ((router model, planner model) per node, messages, whether the profile's models stayed
        instead of fits)."""
        try:
            fitted, messages = freeze_all(fitters)
        except WarmupTooShort as error:
            pair = (self.shape.router_model(), self.shape.planner_model())
            return {n: pair for n in fitters}, [f"{error}; keeping the profile's models"], True
        fitted = {n: replace(m, decode_kv_tokens=float(self.shape.l1_tokens)) for n, m in fitted.items()}
        self.fitted = fitted
        return {n: (m, m) for n, m in fitted.items()}, messages, False

    def refreshed(self, node: NodeId, previous: object | None, usage: UsageCounts | None) -> tuple[object, object]:
        """(router model, planner model) for the next window: the frozen fit remeasured, else the profile's."""
        fitted = self.fitted.get(node)
        if fitted is not None:
            model = fitted.remeasured(usage) if usage is not None else (previous or fitted)
            return model, model
        return self.shape.router_model(usage), self.shape.planner_model(usage)
