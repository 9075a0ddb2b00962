"""The simulator's node models: the router core's `ModelBook` over a `ModelShape` built from the run's hardware
profile (the live router builds the same shape from the same profile), so both drivers evaluate the same models
(`evolving_infra.router.core.models` says which, and when they change).

Boundary: building the shape from a profile; model logic lives in the router core.
"""

from __future__ import annotations

from evolving_infra.node_agent.profile import HardwareProfile
from evolving_infra.router.core.models import PROVISIONAL, ModelBook, ModelOrigin, ModelShape, WarmupTooShort, freeze_all

__all__ = [
    "PROVISIONAL", "ModelBook", "ModelOrigin", "WarmupTooShort", "freeze_all", "model_book", "shape_of",
]


def shape_of(profile: HardwareProfile) -> ModelShape:
    """The router's view of a hardware profile: coefficients, sizes and the MoE shape."""
    return ModelShape(
        name=profile.name,
        prefill=profile.prefill.coefficients(),
        decode=profile.decode.coefficients(),
        t_acc=profile.decode.t_acc,
        page_tokens=profile.page_tokens,
        chunk_tokens=profile.chunk_tokens,
        l1_tokens=profile.l1_tokens,
        l2_tokens=profile.l2_tokens,
    )


def model_book(profile: HardwareProfile, origin: ModelOrigin) -> ModelBook:
    return ModelBook(shape_of(profile), origin)

