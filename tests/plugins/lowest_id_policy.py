"""A prefill routing policy declared outside the package, as a user's or a test's plugin: every prefill goes
to the accepting prefill node with the lowest id. Loaded by name or path through the `plugins` setting of the
router and the simulator (`evolving_infra.core.plugins.load_plugins`); nothing else in the project names it.

Boundary: one policy declaration.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from evolving_infra.core.plugins import PolicyKind, PolicySpec
from evolving_infra.router.routing.base import RouteReason, RouterHooks, RoutingDecision, by_node, decision_without_fetch
from evolving_infra.router.routing.inputs import PrefillNodeView, RouteRequest
from evolving_infra.router.routing.registry import PREFILL_ROUTING

NAME = "test-lowest-id"


@dataclass(frozen=True)
class LowestIdSettings:
    skip: int = 0
    """Skip this many of the lowest ids (when as many nodes accept prefill)."""

    def __post_init__(self) -> None:
        if self.skip < 0:
            raise ValueError(f"skip must be >= 0, got {self.skip}")


class LowestIdRouter(RouterHooks):
    def __init__(self, settings: LowestIdSettings) -> None:
        self.settings = settings
        self.routed = 0

    @property
    def name(self) -> str:
        return NAME

    def route(self, request: RouteRequest, nodes: Sequence[PrefillNodeView], now: float) -> RoutingDecision:
        ordered = sorted(v.node for v in nodes)
        node = ordered[min(self.settings.skip, len(ordered) - 1)]
        return decision_without_fetch(request, by_node(nodes, node), NAME, RouteReason.ROUND_ROBIN)  # type: ignore[arg-type]

    def on_routed(self, request: RouteRequest, decision: RoutingDecision, now: float) -> None:
        self.routed += 1


def _build(settings: LowestIdSettings, rng: random.Random) -> LowestIdRouter:
    return LowestIdRouter(settings)


SPEC = PREFILL_ROUTING.register(
    PolicySpec(PolicyKind.PREFILL_ROUTING, NAME, "every prefill to the lowest node id", LowestIdSettings, _build,
               module=__name__)  # fmt: skip
)
