"""The live router service: the router core driven against live node agents (asyncio + grpc.aio).

`LiveRouter` (backend.py) is the HTTP front end's `RouterBackend`: it turns prompts' pages, routes with the
core, submits prefills and decodes to the node agents (`NodeClient`, client.py), relays tokens, pushes branch
counts and follows the nodes' event streams. `ControlLoop` drives the control core (warmup, planner) and hands switch orders to a
`SplitApplier` (planning.py: `LocalSplitApplier` calls SwitchPhase itself, `KubernetesSplitApplier` writes the
CR's status). A request's attempts and their wire ids are `flights.Flight` / `flights.AttemptIds`. Settings:
`RouterSettings`; metrics: `RouterServiceMetrics`; process: `main.serve`. See docs/router.md.

Boundary: I/O shell only; every routing and planning decision is the core's (`evolving_infra.router.core`).
"""

from evolving_infra.router.service.backend import LiveRouter
from evolving_infra.router.service.client import NodeClient, NodeEndpoint
from evolving_infra.router.service.models import ModelShape
from evolving_infra.router.service.planning import ControlLoop, KubernetesSplitApplier, LocalSplitApplier, SplitApplier
from evolving_infra.router.service.settings import ApplierKind, RouterSettings, SettingsError, load_settings

__all__ = [
    "ControlLoop",
    "ApplierKind",
    "KubernetesSplitApplier",
    "LiveRouter",
    "LocalSplitApplier",
    "ModelShape",
    "NodeClient",
    "NodeEndpoint",
    "RouterSettings",
    "SettingsError",
    "SplitApplier",
    "load_settings",
]
