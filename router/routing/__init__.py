"""Prefill routing and decode binding: ours (shortest predicted TTFT, fewest requests with KV room) and
the baselines the paper compares against, behind one pair of interfaces (`docs/routing.md`).

Boundary: pure policies. Inputs are plain views (`inputs.py`) that the router service and the simulator
fill from the KV directory, the nodes' reports and the router's own record; time is passed in and random
choices draw from generators passed in. No imports from the directory or the model fitting.
"""

from evolving_infra.router.routing.base import (
    BindReason,
    DecodeBinder,
    DecodeBinding,
    DecodePolicyName,
    FetchTiming,
    NodeScore,
    PrefillPolicyName,
    PrefillRouter,
    RouteReason,
    RoutingDecision,
)
from evolving_infra.core.fetch import FetchRun
from evolving_infra.router.routing.cache_aware import CacheAwareRouter, CacheAwareSettings
from evolving_infra.router.routing.decode import (
    BaselineBinderSettings,
    FewestRequestsBinder,
    PowerOfTwoBinder,
    RoundRobinBinder,
    kv_tokens_needed,
)
from evolving_infra.router.routing.dynamo_kv import DynamoKvRouter, DynamoKvSettings, DynamoLoads
from evolving_infra.router.routing.inputs import (
    DecodeNodeView,
    PrefillNodeState,
    PrefillNodeView,
    PrefillViewSet,
    PrefixColumns,
    StateStamps,
    QueuedPrefill,
    RouteRequest,
    RunningPrefill,
    StaticViews,
)
from evolving_infra.router.routing.nodemodel import CoefficientPrefillModel, PrefillNodeModel
from evolving_infra.router.routing.registry import make_decode_binder, make_prefill_router
from evolving_infra.router.routing.queue_replay import (
    Backlog,
    JobTiming,
    ReplayJob,
    ReplayResult,
    append_job,
    extend_backlog,
    replay_chunked_prefill,
)
from evolving_infra.router.routing.round_robin import RoundRobinRouter
from evolving_infra.router.routing.sticky import StickyRouter, StickySettings
from evolving_infra.router.routing.ttft import (
    StateSource,
    TtftEstimate,
    TtftRouter,
    TtftSettings,
    WaitModel,
    estimate_ttft,
    replay_backlog,
)

__all__ = [
    "Backlog",
    "BaselineBinderSettings",
    "BindReason",
    "CacheAwareRouter",
    "CacheAwareSettings",
    "CoefficientPrefillModel",
    "DecodeBinder",
    "DecodeBinding",
    "DecodeNodeView",
    "DecodePolicyName",
    "DynamoKvRouter",
    "DynamoKvSettings",
    "DynamoLoads",
    "FetchTiming",
    "FewestRequestsBinder",
    "JobTiming",
    "NodeScore",
    "FetchRun",
    "PowerOfTwoBinder",
    "PrefillNodeModel",
    "PrefillNodeState",
    "PrefillNodeView",
    "PrefillViewSet",
    "PrefixColumns",
    "StateStamps",
    "PrefillPolicyName",
    "PrefillRouter",
    "QueuedPrefill",
    "ReplayJob",
    "ReplayResult",
    "RoundRobinBinder",
    "RoundRobinRouter",
    "RouteReason",
    "RouteRequest",
    "RoutingDecision",
    "RunningPrefill",
    "StateSource",
    "StickyRouter",
    "StaticViews",
    "StickySettings",
    "TtftEstimate",
    "TtftRouter",
    "TtftSettings",
    "WaitModel",
    "append_job",
    "estimate_ttft",
    "extend_backlog",
    "kv_tokens_needed",
    "make_decode_binder",
    "make_prefill_router",
    "replay_backlog",
    "replay_chunked_prefill",
]
