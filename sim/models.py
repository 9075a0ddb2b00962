"""Node models for the router (eq. 1/3) and the planner (eq. 3/2), from online fits or from the profile.

- Fitted (ours, paper 5.1): during the collocated warmup every node's `ModelFitter` sees its iterations; the
  router uses provisional fits, refreshed every `fit_interval_s` (before the first fit, a stand-in that prices
  uncached tokens only); at the end of warmup the fits are frozen. A node whose fit lacks a phase borrows that
  phase from the first node that has it (the nodes are identical hardware); if no node has it the run stops
  with `WarmupTooShort`. After warmup only t̄_n and f_n change, remeasured from each window's usage counts.
- Profile (baselines and tests): the hardware profile's true coefficients through the router's and planner's
  coefficient adapters, with t̄_n and f_n measured the same way (the chunk size and 0 until measured).

Boundary: building model objects; a new object per change (the TTFT router memoizes per model object).
"""

from __future__ import annotations

from evolving_infra.core.itermodel import PrefillCoefficients
from evolving_infra.core.types import NodeId
from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.router.core.models import WarmupTooShort, freeze_all
from evolving_infra.router.fitting import ModelFitter, UsageCounts
from evolving_infra.router.planner import CoefficientNodeModel
from evolving_infra.router.routing import CoefficientPrefillModel

__all__ = [
    "PROVISIONAL", "WarmupTooShort", "freeze_all", "make_fitter", "profile_planner_model", "profile_router_model",
    "provisional_model",
]

PROVISIONAL = PrefillCoefficients(c0=0.0, c1=1e-5, c2=0.0, c3=0.0)
"""Stand-in before the first warmup fit: time proportional to uncached tokens (only the ranking matters)."""


def make_fitter(node: NodeId, profile: HardwareProfile) -> ModelFitter:
    d = profile.decode
    return ModelFitter(node, d.k, d.experts, d.t_fwd)


def provisional_model(fitter: ModelFitter, profile: HardwareProfile) -> CoefficientPrefillModel:
    """The router's model during warmup: the latest fit of the node's prefill iterations, else the stand-in (the
    decode phase is fitted only when the warmup ends: the router prices prefills)."""
    coefficients, usage = fitter.fit_prefill()
    if coefficients is None:
        return CoefficientPrefillModel(PROVISIONAL, t_bar=float(profile.chunk_tokens))
    return CoefficientPrefillModel(
        coefficients, t_bar=usage.t_bar or float(profile.chunk_tokens), f_restore=usage.f_restore or 0.0
    )


def profile_router_model(profile: HardwareProfile, usage: UsageCounts | None = None) -> CoefficientPrefillModel:
    t_bar, f = _measured(profile, usage)
    return CoefficientPrefillModel(profile.prefill.coefficients(), t_bar=t_bar, f_restore=f)


def profile_planner_model(profile: HardwareProfile, usage: UsageCounts | None = None) -> CoefficientNodeModel:
    t_bar, f = _measured(profile, usage)
    return CoefficientNodeModel(profile.prefill.coefficients(), profile.decode.coefficients(), t_bar, f)


def _measured(profile: HardwareProfile, usage: UsageCounts | None) -> tuple[float, float]:
    t_bar = usage.t_bar if usage is not None and usage.t_bar else float(profile.chunk_tokens)
    f = usage.f_restore if usage is not None and usage.f_restore is not None else 0.0
    return t_bar, f
