"""The router core: the router's side of the request path, node reports and planning, as one pure object
(`RouterCore`) that the live router service and the simulator both drive (docs/router.md).

Boundary: pure decisions and bookkeeping with time passed in; no I/O, no clock. Results come back as typed
effects (`effects.py`) for the driver to carry out.
"""

from evolving_infra.core.fetch import FetchRun
from evolving_infra.router.core.core import Bound, CoreSettings, ModelRefresh, RouterCore
from evolving_infra.router.core.effects import (
    Effect,
    PushCounts,
    Routed,
    SendPrefill,
    SplitChange,
    SwitchNode,
)
from evolving_infra.router.core.tracking import NodeTrack, PoolSnapshot, RoutedRequest, serves
from evolving_infra.router.core.views import decode_need, decode_view, kv_room_tokens, node_load, prefill_view

__all__ = [
    "Bound",
    "CoreSettings",
    "Effect",
    "FetchRun",
    "ModelRefresh",
    "NodeTrack",
    "PoolSnapshot",
    "PushCounts",
    "Routed",
    "RoutedRequest",
    "RouterCore",
    "SendPrefill",
    "SplitChange",
    "SwitchNode",
    "decode_need",
    "decode_view",
    "kv_room_tokens",
    "node_load",
    "prefill_view",
    "serves",
]
